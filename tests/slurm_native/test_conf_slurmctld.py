"""``epu slurm conf`` output accepted by the real slurmctld 22.05: a private slurmctld (free port,
temp dir) whose slurm.conf has only the cluster's own lines and ``Include``s the fragment. Its
CLOUD nodes are listed with their types' features, CPUs, memory and GPUs, powered down; its
``show config`` has the power-saving parameters; power saving is on (a job for ``m8`` powers
an m8 node up, and Slurm runs the written ResumeProgram with that node's name)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.slurm_native.configs import write_config
from tests.support.slurm import SlurmTestCluster, wait_until

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(180)]

OWNED = ("ResumeTimeout", "SuspendTimeout", "SuspendTime", "ResumeProgram", "SuspendProgram", "SlurmctldParameters",
         "PrivateData", "TreeWidth", "PartitionName", "SuspendExcNodes", "GresTypes")
"""Keys the fragment sets: the test cluster's own lines for them are left out."""


class IncludingCluster(SlurmTestCluster):
    """The harness's base slurm.conf (cluster, ports, auth, paths) + ``Include FRAGMENT``."""

    fragment: Path

    def write_conf(self) -> None:
        super().write_conf()
        kept = [line for line in self.conf_path.read_text().splitlines() if not line.startswith(OWNED)]
        self.conf_path.write_text("\n".join([*kept, f"Include {self.fragment}"]) + "\n")
        (self.conf_path.parent / "gres.conf").write_text("AutoDetect=off\n")


def show(cluster: SlurmTestCluster, *args: str) -> str:
    return cluster.run("scontrol", *args).stdout


def nodes(cluster: SlurmTestCluster) -> dict[str, dict[str, str]]:
    """``scontrol show node -o``: node name → its key=value fields."""
    out = {}
    for line in show(cluster, "-o", "show", "node").splitlines():
        fields = dict(re.findall(r"(\w+)=(\S*)", line))
        if "NodeName" in fields:
            out[fields["NodeName"]] = fields
    return out


def test_slurmctld_accepts_the_fragment_and_powers_its_nodes(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    fragment = tmp_path / "epu-native.conf"
    programs = tmp_path / "bin"
    proc = subprocess.run([sys.executable, "-m", "epu.cli", "slurm", "conf", "-c", str(config), "-o", str(fragment),
                           "--programs-dir", str(programs), "--boot-seconds", "30"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    # what Slurm will run, recorded: the real program is kept, a recorder in front of it
    calls = tmp_path / "resume-calls"
    real = programs / "epu-slurm-resume"
    wrapper = programs / "record-resume"
    wrapper.write_text(f"#!{sys.executable}\nimport sys\nopen({str(calls)!r}, 'a').write(sys.argv[1] + '\\n')\n")
    wrapper.chmod(0o755)
    fragment.write_text(fragment.read_text().replace(f"ResumeProgram={real}", f"ResumeProgram={wrapper}"))

    cluster = IncludingCluster(nodes=[], cloud_nodes=[])
    cluster.fragment = fragment
    with cluster:
        listed = nodes(cluster)
        assert sorted(listed) == sorted([*(f"alpha-c2-{i}" for i in range(1, 7)), *(f"alpha-m8-{i}" for i in range(1, 5)),
                                         "alpha-g1-1", "alpha-g1-2"])
        for name, f in listed.items():
            assert {"IDLE", "CLOUD", "POWERED_DOWN"} <= set(f["State"].split("+")), (name, f["State"])
        c2, m8, g1 = listed["alpha-c2-1"], listed["alpha-m8-4"], listed["alpha-g1-2"]
        assert (c2["AvailableFeatures"], c2["CPUTot"], c2["RealMemory"]) == ("c2,site_east,site_west", "2", "1000")
        assert (m8["AvailableFeatures"], m8["RealMemory"]) == ("bigmem,m8,site_west", "8000")
        assert (g1["AvailableFeatures"], g1["CPUTot"], g1["Gres"]) == ("gpu,g1,site_east", "4", "gpu:1")
        assert c2["Weight"] == "1" and g1["Weight"] == "3"

        conf = dict(re.findall(r"^(\w+)\s+= (.*)$", show(cluster, "show", "config"), re.M))
        assert conf["ResumeTimeout"] == "330 sec"  # stall 240 + boot 30 + 60
        assert conf["SuspendTime"] == "120 sec" and conf["SuspendTimeout"] == "120 sec"
        assert conf["ResumeRate"] == "0 nodes/min" and conf["SuspendRate"] == "0 nodes/min"
        assert conf["SuspendProgram"] == str(programs / "epu-slurm-suspend")
        assert conf["ResumeFailProgram"] == str(programs / "epu-slurm-resume-fail")
        assert conf["SlurmctldParameters"] == "cloud_reg_addrs,idle_on_node_suspend"
        assert conf["TreeWidth"] == "65533" and conf["PrivateData"] == "cloud"
        parts = show(cluster, "show", "partition")
        assert "PartitionName=cpu" in parts and "Nodes=alpha-m8-[1-4]" in parts

        # power saving is on: a bigmem job powers one m8 node up and Slurm runs ResumeProgram for it
        job = cluster.sbatch("-p", "bigmem", "--constraint=m8", "--mem=6000", wrap="true")
        called = wait_until(lambda: calls.exists() and calls.read_text().split(), 30, "ResumeProgram called",
                            on_timeout=lambda: cluster.tail("slurmctld"))
        assert len(called) == 1 and re.fullmatch(r"alpha-m8-[1-4]", called[0]), called
        state = nodes(cluster)[called[0]]["State"]
        assert "POWERING_UP" in state, state
        cluster.run("scancel", job)
        log = cluster.log_path("slurmctld").read_text(errors="replace")
        complaints = ("power_save module disabled", "power_save program", "Parsing error", "more than once",
                      "unrecognized key", "Invalid")
        assert not [c for c in complaints if c in log], cluster.tail("slurmctld", 60)
