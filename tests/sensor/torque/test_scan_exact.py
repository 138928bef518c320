"""The Torque read's fast scans equal the plain parse (element tree, flat records) on every
captured ``qstat -f -x`` and ``pbsnodes -x`` output, and on records whose fields come in an
unusual order or are missing (the scan looks for fields in Torque's order first)."""

from __future__ import annotations

from pathlib import Path

import pytest
from epu.services.sensor.torque.parse import (
    iter_records,
    normalize_jobs,
    normalize_nodes,
    parse_pbsnodes,
    scan_node_records,
    scan_node_records_plain,
    scan_qstat,
)

RAW = Path(__file__).resolve().parent.parent / "fixtures" / "torque" / "raw"
NOW = 1795323500.0
QSTAT = sorted(p.name for p in RAW.glob("*qstat_-f_-x*.stdout"))
PBSNODES = sorted(p.name for p in RAW.glob("*pbsnodes_-x*.stdout"))


def _jobs_view(out) -> tuple:
    return (out.shapes(), out.sample, out.running, out.finished, out.unknown_states)


def _plain_jobs(xml: str):
    return normalize_jobs(iter_records(xml, "Job"), NOW)


@pytest.mark.parametrize("capture", QSTAT)
def test_qstat_scan_equals_the_plain_parse(capture: str) -> None:
    xml = (RAW / capture).read_text()
    assert _jobs_view(scan_qstat(xml, NOW)) == _jobs_view(_plain_jobs(xml))


@pytest.mark.parametrize("capture", PBSNODES)
def test_pbsnodes_scan_equals_the_regex_scan_and_the_plain_parse(capture: str) -> None:
    xml = (RAW / capture).read_text()
    assert scan_node_records(xml) == scan_node_records_plain(xml)
    assert parse_pbsnodes(xml) == normalize_nodes(iter_records(xml, "Node"))


def test_qstat_fields_out_of_order_or_missing_read_alike() -> None:
    jobs = [
        "<Job_Id>1.vm</Job_Id><job_state>Q</job_state><queue>a</queue><qtime>100</qtime>"
        "<Resource_List><nodes>2:ppn=2</nodes></Resource_List>",
        "<Job_Id>2.vm</Job_Id><Resource_List><nodes>1:ppn=4</nodes></Resource_List><qtime>90</qtime>"
        "<queue>b</queue><job_state>Q</job_state>",
        "<Job_Id>3.vm</Job_Id><queue>c</queue><job_state>H</job_state><Hold_Types>u</Hold_Types>",
        "<Job_Id>4.vm</Job_Id><job_state>Q</job_state><Resource_List><mem>4gb</mem></Resource_List>"
        "<queue>a</queue>",
        "<Job_Id>5.vm</Job_Id><job_state>Q</job_state><qtime>80</qtime>",
    ]
    xml = "<Data>" + "".join(f"<Job>{j}</Job>" for j in jobs) + "</Data>"
    assert _jobs_view(scan_qstat(xml, NOW)) == _jobs_view(_plain_jobs(xml))


def test_pbsnodes_fields_in_any_order_with_entities_and_empty_values() -> None:
    xml = ("<Data><Node><state>free</state><np>4</np><name>n&amp;1</name><jobs></jobs>"
           "<status>x=1,physmem=2gb</status></Node><Node><name>n2</name><note>a &lt;b&gt;</note>"
           "<status>xphysmem=9kb,physmem=1024kb</status><properties>epu-abc,gpu</properties></Node>"
           "<Node><name>n3</name></Node></Data>")
    assert scan_node_records(xml) == scan_node_records_plain(xml)
    assert parse_pbsnodes(xml) == normalize_nodes(iter_records(xml, "Node"))
