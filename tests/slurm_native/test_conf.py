"""``epu slurm conf`` without Slurm: the node sets, partitions and power-saving values it derives
from the engine's config and measured boot times, and bad configs named by their key."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from epu.common.config import load_config
from epu.services.decision.store import Store
from epu.services.decision.view import Instance

from epu.cli import main
from epu.slurm_conf import (
    MARGIN_SECONDS,
    SlurmConfError,
    boot_from_instances,
    measured_boot_seconds,
    node_sets,
    percentile,
    power_saving,
    render,
)
from tests.slurm_native.configs import CONFIG, write_config

PROGRAMS = {"ResumeProgram": "/p/r", "SuspendProgram": "/p/s", "ResumeFailProgram": "/p/f"}


def lines_of(text: str) -> list[str]:
    return [line for line in text.splitlines() if line and not line.startswith("#")]


def test_node_sets_per_type_across_sites_cheapest_first(tmp_path: Path) -> None:
    config = load_config(write_config(tmp_path))
    sets = {s.type: s for s in node_sets(config, "alpha")}
    assert sets["c2"].names == tuple(f"alpha-c2-{i}" for i in range(1, 7))  # max_nodes 6 < 4 + 4
    assert sets["c2"].sites == ("east", "west") and sets["c2"].features == ("c2", "site_east", "site_west")
    assert sets["m8"].names == tuple(f"alpha-m8-{i}" for i in range(1, 5))  # west's quota
    assert sets["m8"].features == ("bigmem", "m8", "site_west")
    assert sets["g1"].names == ("alpha-g1-1", "alpha-g1-2")  # the type's quota
    assert [s.weight for s in (sets["c2"], sets["m8"], sets["g1"])] == [1, 2, 3]


def test_render_lines(tmp_path: Path) -> None:
    config = load_config(write_config(tmp_path))
    power = power_saving(config, "alpha", {})
    got = lines_of(render(config, "alpha", PROGRAMS, power))
    assert got == [
        "ResumeProgram=/p/r", "SuspendProgram=/p/s", "ResumeFailProgram=/p/f",
        f"ResumeTimeout={int(240 + 300 + MARGIN_SECONDS)}", "SuspendTime=120", "SuspendTimeout=120",
        "ResumeRate=0", "SuspendRate=0", "TreeWidth=65533",
        "SlurmctldParameters=cloud_reg_addrs,idle_on_node_suspend", "PrivateData=cloud", "GresTypes=gpu",
        "NodeName=alpha-c2-[1-6] CPUs=2 RealMemory=1000 Features=c2,site_east,site_west Weight=1 State=CLOUD",
        "NodeName=alpha-m8-[1-4] CPUs=2 RealMemory=8000 Features=bigmem,m8,site_west Weight=2 State=CLOUD",
        "NodeName=alpha-g1-[1-2] CPUs=4 RealMemory=4000 Gres=gpu:1 Features=gpu,g1,site_east Weight=3 "
        "State=CLOUD",
        "NodeSet=alpha_c2 Nodes=alpha-c2-[1-6]", "NodeSet=alpha_m8 Nodes=alpha-m8-[1-4]",
        "NodeSet=alpha_g1 Nodes=alpha-g1-[1-2]",
        "PartitionName=cpu Nodes=alpha_c2 Default=YES MaxTime=INFINITE State=UP",
        "PartitionName=bigmem Nodes=alpha_m8 Default=NO MaxTime=INFINITE State=UP",
        "PartitionName=gpu Nodes=alpha_g1 Default=NO MaxTime=INFINITE State=UP",
    ]


def test_ports_count_up_across_sets_and_dns(tmp_path: Path) -> None:
    config = load_config(write_config(tmp_path))
    text = render(config, "alpha", PROGRAMS, power_saving(config, "alpha", {}, dns=True), first_port=7000)
    nodes = [line for line in lines_of(text) if line.startswith("NodeName=")]
    assert [n.split()[-1] for n in nodes] == ["Port=[7000-7005]", "Port=[7006-7009]", "Port=[7010-7011]"]
    assert "SlurmctldParameters=cloud_dns,idle_on_node_suspend" in text and "TreeWidth" not in text
    one_host = render(config, "alpha", PROGRAMS, power_saving(config, "alpha", {}), first_port=7000,
                      node_addr="127.0.0.1")
    assert "NodeAddr=127.0.0.1 NodeHostname=127.0.0.1 Port=[7000-7005]" in one_host
    with pytest.raises(SlurmConfError, match="--ports: 12 nodes from 65530"):
        render(config, "alpha", PROGRAMS, power_saving(config, "alpha", {}), first_port=65530)


def test_type_nodes_names_and_a_type_with_two_shapes(tmp_path: Path) -> None:
    text = CONFIG.replace('[domains.alpha.partitions]', '[domains.alpha.type_nodes.m8]\nnames = ["big[01-02]"]\n\n'
                          '[domains.alpha.partitions]')
    # west's c2 has another shape than east's: one node set per site
    text = text.replace("[sites.west.types.c2]\ncores = 2", "[sites.west.types.c2]\ncores = 4")
    config = load_config(write_config(tmp_path, text))
    sets = {s.name: s for s in node_sets(config, "alpha")}
    assert sets["alpha_m8"].names == ("big01", "big02")
    assert sets["alpha_east_c2"].names[0] == "alpha-east-c2-1" and sets["alpha_east_c2"].cores == 2
    assert sets["alpha_west_c2"].names[0] == "alpha-west-c2-1" and sets["alpha_west_c2"].cores == 4
    parts = lines_of(render(config, "alpha", PROGRAMS, power_saving(config, "alpha", {})))
    assert "PartitionName=cpu Nodes=alpha_east_c2,alpha_west_c2 Default=YES MaxTime=INFINITE State=UP" in parts


@pytest.mark.parametrize(("edit", "key"), [
    (lambda t: t.replace("memory_mb = 1000\nprice_per_hour = 0.10", "price_per_hour = 0.10"),
     "sites.east.types.c2.memory_mb"),
    (lambda t: t.replace('[domains.alpha.partitions]', '[domains.alpha.type_nodes.c2]\nnames = ["n[1-2]"]\n\n'
                         '[domains.alpha.partitions]').replace("[sites.west.types.c2]\ncores = 2",
                                                               "[sites.west.types.c2]\ncores = 4"),
     "domains.alpha.type_nodes.c2"),
    (lambda t: t.replace('sites = ["east", "west"]', 'sites = ["east", "west", "old"]')
     + '\n[sites.old]\ndriver = "epu-sim"\nimage = "i"\ncores = 2\n', "sites.old"),
    (lambda t: t.replace("stall_seconds = 240.0", "stall_seconds = -1"), "domains.alpha.params"),
])
def test_bad_config_names_the_key(tmp_path: Path, edit, key: str) -> None:  # type: ignore[no-untyped-def]
    config = load_config(write_config(tmp_path, edit(CONFIG)))
    with pytest.raises(SlurmConfError) as err:
        render(config, "alpha", PROGRAMS, power_saving(config, "alpha", {}))
    assert str(err.value).startswith(key), str(err.value)


def test_resume_timeout_from_the_slowest_sites_measured_boots(tmp_path: Path) -> None:
    path = write_config(tmp_path)
    config = load_config(path)
    store = Store(config.decision.store_url).create()
    boots = {"east": [20, 22, 25, 30, 90], "west": [40, 41, 42]}
    items = []
    for site, seconds in boots.items():
        for k, b in enumerate(seconds):
            t = 1000.0 + 100 * k
            items.append(Instance(f"{site}-{k}", "alpha", site, f"n-{site}-{k}", 2, "terminated", t, t + b + 50,
                                  joined_at=t + b, instance_type="c2"))
    items.append(Instance("never", "alpha", "west", "n-x", 2, "failed", 5000.0, 5001.0))  # never joined: no sample
    items.append(Instance("other", "beta", "west", "n-y", 2, "terminated", 1.0, 9.0, joined_at=900.0))
    store.save_instances(items)
    store.engine.dispose()

    measured, why = measured_boot_seconds(config, "alpha")
    assert why is None and measured == {"east": [20, 22, 25, 30, 90], "west": [40, 41, 42]}
    power = power_saving(config, "alpha", measured)
    assert power.boot_seconds == 90 and "east" in power.boot_source  # p95 of east's 5 boots: the slowest site
    assert power.resume_timeout == int(240 + 90 + MARGIN_SECONDS)
    assert percentile([1, 2, 3, 4, 5, 6, 7, 8, 9, 10], 0.95) == 10
    assert boot_from_instances(items[:-1], ["west"]) == {"west": [40, 41, 42]}

    # too few samples at every site: the stated default
    few = power_saving(config, "alpha", {"west": [40.0, 41.0]}, boot_default=100)
    assert few.boot_seconds == 100 and few.resume_timeout == int(240 + 100 + MARGIN_SECONDS)
    assert few.boot_source.startswith("assumed")


def test_cli_writes_programs_and_fragment(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_config(tmp_path)
    out = tmp_path / "epu-native.conf"
    assert main(["slurm", "conf", "-c", str(path), "-o", str(out), "--programs-dir", str(tmp_path / "bin"),
                 "--boot-seconds", "30"]) == 0
    text = out.read_text()
    assert f"ResumeTimeout={int(240 + 30 + MARGIN_SECONDS)}" in text
    resume = tmp_path / "bin" / "epu-slurm-resume"
    assert f"ResumeProgram={resume}" in text
    for name in ("epu-slurm-resume", "epu-slurm-suspend", "epu-slurm-resume-fail"):
        mode = (tmp_path / "bin" / name).stat().st_mode
        assert stat.S_IMODE(mode) == 0o755  # Slurm refuses a group- or world-writable program
    # what Slurm runs: the program itself, the hostlist its one argument, SLURM_CONF its environment
    proc = subprocess.run([str(resume), "--help"], capture_output=True, text=True, timeout=60,
                          env={"SLURM_CONF": "/nonexistent"}, cwd="/")
    assert sys.executable in resume.read_text().splitlines()[0]
    assert proc.returncode in (0, 2) and "resume" in (proc.stdout + proc.stderr)

    assert main(["slurm", "conf", "-c", str(path), "--domain", "nope", "--programs-dir", str(tmp_path)]) == 2
    assert "--domain: no domain 'nope'" in capsys.readouterr().err


def test_cli_bad_config_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_config(tmp_path, CONFIG.replace("memory_mb = 8000\n", ""))
    assert main(["slurm", "conf", "-c", str(path), "--programs-dir", str(tmp_path / "bin")]) == 2
    assert "sites.west.types.m8.memory_mb: required" in capsys.readouterr().err
    assert os.path.exists(tmp_path / "bin")  # written before the check; harmless


def test_native_warnings_name_the_keys_left_to_set(tmp_path: Path) -> None:
    from epu.slurm_conf import native_warnings

    config = load_config(write_config(tmp_path, CONFIG + '\n[sensor]\ndomain = "alpha"\nbackend = "slurm"\n'))
    power = power_saving(config, "alpha", {})
    keys = [w.split(":")[0] for w in native_warnings(config, "alpha", power)]
    assert keys == ["domains.alpha.native", "domains.alpha.native_resume_seconds", "sensor.options.native",
                    "sensor.options.include_powered_down"]
    done = CONFIG.replace('policy = "queue-demand"', f'policy = "queue-demand"\nnative = "slurm"\n'
                                                     f"native_resume_seconds = {power.resume_timeout}")
    done += '\n[sensor]\ndomain = "alpha"\nbackend = "slurm"\n[sensor.options]\nnative = true\ninclude_powered_down = true\n'
    assert native_warnings(load_config(write_config(tmp_path, done)), "alpha", power) == []
