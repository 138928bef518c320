"""The HTCondor read through ``condor_q``/``condor_status -af:tr`` text (htcondor/autoformat.py):
the same snapshot as the bindings path for the same ads, the command lines it runs, and what it
does with output it cannot use."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import classad2
import pytest
from epu.common.clock import ManualClock
from epu.services.sensor.backend import BackendUnavailable
from epu.services.sensor.htcondor.autoformat import (
    JOB_AF,
    STARTD_AF,
    normalize_job_lines,
    normalize_slot_lines,
    render,
)
from epu.services.sensor.htcondor.backend import JOB_CONSTRAINT, HTCondorBackend
from epu.services.sensor.htcondor.canned import CannedCondor, projected
from epu.services.sensor.htcondor.parse import JOB_PROJECTION, STARTD_PROJECTION
from epu.services.sensor.runner import CommandResult

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "htcondor"
NOW = 1795323000.0
TEMPLATE = {"Arch": "X86_64", "OpSys": "LINUX", "Disk": 50_000_000, "Memory": 32768, "Cpus": 8, "GPUs": 1,
            "HasFileTransfer": True}
#: What condor_submit writes when a submit file asks no memory or disk (expressions, evaluated
#: in the projected ad: MemoryUsage/ImageSize/DiskUsage are not in it, so they read as unknown).
DEFAULTS = '''MyType = "Job"
ClusterId = 400
ProcId = 0
JobStatus = 1
RequestCpus = 1
RequestMemory = ifthenelse(MemoryUsage =!= undefined,MemoryUsage,(ImageSize + 1023) / 1024)
RequestDisk = DiskUsage
QDate = 1795322000
JobUniverse = 5
Requirements = (TARGET.Arch == "X86_64") && (TARGET.OpSys == "LINUX") && (TARGET.Disk >= RequestDisk)
'''


def ads(name: str) -> list[Any]:
    return list(classad2.parseAds((FIXTURES / name).read_text()))


class Tools:
    """A runner answering condor_q / condor_status with fixed text, recording the command lines."""

    def __init__(self, q: str, status: str, fail: str | None = None) -> None:
        self.out = {"condor_q": q, "condor_status": status}
        self.fail = fail
        self.argv: list[list[str]] = []

    def run(self, argv: Any, timeout: float | None = None) -> CommandResult:
        self.argv.append(list(argv))
        name = Path(argv[0]).name
        if name == self.fail:
            return CommandResult(tuple(argv), 1, "", "Error: Couldn't contact the condor_collector on cm")
        return CommandResult(tuple(argv), 0, self.out[name], "")


def both(job_ads: list[Any], slot_ads: list[Any], template: dict[str, Any] | None) -> tuple[Any, Any]:
    jobs, slots = projected(job_ads, JOB_PROJECTION), projected(slot_ads, STARTD_PROJECTION)
    live = [a for a in jobs if classad2.ExprTree(JOB_CONSTRAINT).eval(a) is True]  # what condor_q -constraint prints
    clock = ManualClock(NOW)
    b = HTCondorBackend(CannedCondor(jobs, slots, filter_jobs=True), clock=clock, template=template).snapshot()
    a = HTCondorBackend(runner=Tools(render(live, JOB_AF), render(slots, STARTD_AF)), read_format="af",
                        clock=clock, template=template).snapshot()
    return b, a


@pytest.mark.parametrize(("jobs", "template"), [("jobs.ads", None), ("jobs_resources.ads", TEMPLATE),
                                                 ("jobs_resources.ads", None), ("defaults", TEMPLATE)])
def test_af_text_and_bindings_give_the_same_snapshot(jobs: str, template: dict[str, Any] | None) -> None:
    job_ads = [classad2.parseOne(DEFAULTS, classad2.ParserType.Old)] if jobs == "defaults" else ads(jobs)
    b, a = both(job_ads, ads("startds.ads"), template)
    assert a.shapes == b.shapes and a.shapes
    assert a.nodes == b.nodes and len(a.nodes) == 10
    assert (a.jobs, a.running_jobs, a.finished_jobs, a.warnings) == (b.jobs, b.running_jobs, b.finished_jobs,
                                                                      b.warnings)


def test_checked_in_af_text_is_what_the_readers_are_tested_on() -> None:
    """tests/sensor/fixtures/htcondor/af/ holds the -af:tr text of the .ads fixtures (see its
    README); it must stay what ``render`` makes of them, and read to the expected nodes."""
    slots = projected(ads("startds.ads"), STARTD_PROJECTION)
    assert (FIXTURES / "af" / "condor_status.txt").read_text() == render(slots, STARTD_AF)
    for name in ("jobs", "jobs_resources"):
        assert (FIXTURES / "af" / f"condor_q_{name}.txt").read_text() == \
            render(projected(ads(f"{name}.ads"), JOB_PROJECTION), JOB_AF)
    warnings: list[str] = []
    nodes = {n.name: n for n in normalize_slot_lines((FIXTURES / "af" / "condor_status.txt").read_text(), warnings)}
    assert (nodes["exec02"].state, nodes["exec02"].cores, nodes["exec02"].cores_used, nodes["exec02"].jobs,
            nodes["exec02"].instance_id) == ("free", 4, 3, ["107.0", "107.1"], "4c1f0e9a2b7d4e61a0c3f5d2b8e9a7c1")
    assert nodes["exec09"].state == "unknown" and any("Hibernating" in w for w in warnings)
    jobs = normalize_job_lines((FIXTURES / "af" / "condor_q_jobs.txt").read_text(), NOW)
    assert jobs.running == 3 and jobs.finished == 2  # the text holds every status; condor_q's constraint drops 3, 4


def test_command_lines_name_every_attribute_in_order() -> None:
    tools = Tools("", "")
    HTCondorBackend(runner=tools, read_format="af", bin_dir="/opt/condor/bin", pool="cm.example.org",
                    clock=ManualClock(NOW)).snapshot()
    q, status = tools.argv
    assert q == ["/opt/condor/bin/condor_q", "-allusers", "-global", "-pool", "cm.example.org",
                 "-constraint", JOB_CONSTRAINT, "-af:tr", *JOB_AF]
    assert status == ["/opt/condor/bin/condor_status", "-pool", "cm.example.org", "-af:tr", *STARTD_AF]
    assert JOB_AF[:3] == ("ClusterId", "ProcId", "QDate") and set(JOB_AF) == set(JOB_PROJECTION)
    assert set(STARTD_AF) == set(STARTD_PROJECTION)
    tools = Tools("", "")
    HTCondorBackend(runner=tools, read_format="af", schedd="schedd@head", clock=ManualClock(NOW)).snapshot()
    assert tools.argv[0][1:4] == ["-allusers", "-name", "schedd@head"]


@pytest.mark.parametrize("tool", ["condor_q", "condor_status"])
def test_a_failing_tool_makes_the_read_unavailable_with_its_words(tool: str) -> None:
    b = HTCondorBackend(runner=Tools("", "", fail=tool), read_format="af", clock=ManualClock(NOW))
    with pytest.raises(BackendUnavailable, match=f"{tool} failed \\(exit 1\\).*condor_collector"):
        b.snapshot()


def test_banners_blank_and_malformed_lines() -> None:
    """``-- Schedd:`` banners and blank lines are not ads; a line with a tab inside a value
    (wrong field count) is skipped and named in a warning, the other jobs still count."""
    text = render(projected(ads("jobs_resources.ads"), JOB_PROJECTION), JOB_AF)
    good = text.splitlines()
    broken = good[0].replace('"X86_64"', '"X86\t64"')
    lines = ["-- Schedd: head.example.org : <127.0.0.1:9618?...", *good, "", broken]
    warnings: list[str] = []
    out = normalize_job_lines("\n".join(lines) + "\n", NOW, warnings)
    assert sum(s.count for s in out.shapes()) == len(good)
    assert len(warnings) == 1 and "1 condor_q -af line(s)" in warnings[0] and r"X86\t64" in warnings[0]  # named (repr)


def test_unknown_read_format_is_refused() -> None:
    with pytest.raises(ValueError, match="read_format"):
        HTCondorBackend(runner=Tools("", ""), read_format="xml")
    b = HTCondorBackend.from_options({"read_format": "af", "bin_dir": "/x", "condor_config": "/etc/c.conf"})
    assert b.read_format == "af" and b.runner.env["CONDOR_CONFIG"] == "/etc/c.conf"


@pytest.mark.parametrize(("name", "short"), [
    ("exec01.example.org", "exec01"), ("exec01.example.org.", "exec01"), ("exec01", "exec01"),
    ("10.0.0.5", "10.0.0.5"), ("fe80::1", "fe80::1"), ("1node.example.org", "1node"), ("", ""),
])
def test_machines_are_named_by_short_host_name_and_addresses_kept(name: str, short: str) -> None:
    from epu.services.sensor.shapes import short_hostname

    assert short_hostname(name) == short


def test_reads_through_real_processes_with_the_configured_tools(tmp_path: Path) -> None:
    """From ``[sensor.options]`` to processes: ``bin_dir`` tools run with ``CONDOR_CONFIG`` set
    and their stdout read (stand-in scripts print the fixture text and record their calls)."""
    calls = tmp_path / "calls"
    for tool, text in (("condor_q", "condor_q_jobs_resources.txt"), ("condor_status", "condor_status.txt")):
        script = tmp_path / tool
        script.write_text(f'#!/bin/sh\necho "$CONDOR_CONFIG $*" >> "{calls}"\ncat "{FIXTURES / "af" / text}"\n')
        script.chmod(0o755)
    b = HTCondorBackend.from_options({"read_format": "af", "bin_dir": str(tmp_path), "template": TEMPLATE,
                                      "condor_config": "/etc/condor/epu-test.conf"}, clock=ManualClock(NOW))
    obs = b.snapshot()
    q, status = calls.read_text().splitlines()
    assert q.startswith(f"/etc/condor/epu-test.conf -allusers -global -constraint {JOB_CONSTRAINT} -af:tr ClusterId ")
    assert status == "/etc/condor/epu-test.conf -af:tr " + " ".join(STARTD_AF)
    assert len(obs.nodes) == 10 and obs.nodes[1].name == "exec02"
    assert {s.reason for s in obs.shapes} == {"Idle", "RequirementsUnmatched", "RequirementsUnknown"}
