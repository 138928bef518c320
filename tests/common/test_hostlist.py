"""Slurm hostlists parsed and written as ``scontrol show hostnames|hostlist`` do (common/hostlist.py).

The cases come from Slurm's own documentation of hostlists and from what scontrol 22.05 answered on
this machine; ``test_same_as_scontrol`` asks the real scontrol again where Slurm is installed."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from epu.common.hostlist import MAX_NAMES, HostlistError, compress, expand
from hypothesis import given
from hypothesis import strategies as st

from tests.support.slurm import find_exe

EXPANDED = {
    "n[1-3],m[01-02]": ["n1", "n2", "n3", "m01", "m02"],
    "r[1-2]n[1-2]": ["r1n1", "r1n2", "r2n1", "r2n2"],
    "n[8-11]": ["n8", "n9", "n10", "n11"],
    "n[08-11]": ["n08", "n09", "n10", "n11"],
    "n[1-010]": [f"n{i}" for i in range(1, 11)],
    "a b,c": ["a", "b", "c"],
    "n[3,1,2],n1": ["n3", "n1", "n2", "n1"],
    "x,": ["x"],
    "a,,b": ["a", "b"],
    "linux[0-3]": ["linux0", "linux1", "linux2", "linux3"],  # Slurm's docs (slurm.conf, NodeName)
    "lx[15,18,32-33]": ["lx15", "lx18", "lx32", "lx33"],  # Slurm's docs (slurm.conf, NodeName)
    "rack[0-1]_blade[0-1]": ["rack0_blade0", "rack0_blade1", "rack1_blade0", "rack1_blade1"],
    "n[099-101]": ["n099", "n100", "n101"],
    "1,2,n[5]": ["1", "2", "n5"],
    "cloud-c5.xl-[001-002]": ["cloud-c5.xl-001", "cloud-c5.xl-002"],
}

REFUSED = ["", " , ", "n[01-02]-[a,b]", "n[1-2", "n[2-1]", "n[1-3:2]", "n[-1]", "n[1-2]]", "n[[1]]", "n[a-b]",
           "n[]", "n;rm", "n$(id)", "n`id`", "n|x", "../etc", "-n1", "n1>x", "n1&", "a" * 64, "n[1-2]\x00",
           "n[1-200000]", "n[ 1-2]"]

COMPRESSED = {
    "n01,n2": "n[01,2]", "n1,n02": "n[1,02]", "n99,n100": "n[99-100]", "n099,n100": "n[099-100]",
    "n1,n2,x,n3": "n[1-2],x,n3", "n1,n2,n4,n5,m1,n6": "n[1-2,4-5],m1,n6", "n3,n2,n1": "n[3,2,1]",
    "n1,n2,n2": "n[1-2,2]", "n0": "n0", "n00,n01": "n[00-01]", "n9,n010": "n[9,010]", "n1,n3-x": "n1,n3-x",
    "n001,n002,n3": "n[001-002,3]", "1,2,3": "[1-3]", "a1.b,a2.b": "a1.b,a2.b", "n1,n[3-5],n2": "n[1,3-5,2]",
    "b1,a2,a1,x": "b1,a[2,1],x", "z,n01,n1,n2": "z,n[01,1-2]", "n001,n01,n1": "n[001,01,1]", "n1x,n2x": "n1x,n2x",
}


@pytest.mark.parametrize("expr", EXPANDED)
def test_expand(expr: str) -> None:
    assert expand(expr) == EXPANDED[expr]


@pytest.mark.parametrize("expr", REFUSED)
def test_refused_with_the_culprit_named(expr: str) -> None:
    with pytest.raises(HostlistError) as err:
        expand(expr)
    assert str(err.value)  # a sentence, never an empty error
    assert "hostlist" in str(err.value) or "node name" in str(err.value)


def test_a_bad_name_refuses_the_whole_list() -> None:
    with pytest.raises(HostlistError, match=r"'n;rm'"):
        expand("n[1-3],n;rm")


def test_too_many_names() -> None:
    with pytest.raises(HostlistError, match=str(MAX_NAMES)):
        expand("a[0-60000],b[0-60000]")


@pytest.mark.parametrize("names", COMPRESSED)
def test_compress(names: str) -> None:
    assert compress(expand(names)) == COMPRESSED[names]


_names = st.lists(st.builds(lambda p, n, w: p + str(n).zfill(w), st.sampled_from(["n", "gpu-", "c5.", "x"]),
                            st.integers(0, 120), st.integers(0, 3)), min_size=1, max_size=30)


@given(_names)
def test_compress_then_expand_is_identity(names: list[str]) -> None:
    assert expand(compress(names)) == names


# ---------------------------------------------------------------- the real scontrol


@pytest.fixture(scope="module")
def scontrol(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    exe = find_exe("scontrol")  # missing: a failure naming scripts/ensure-slurm.sh (make test runs it)
    conf = Path(tmp_path_factory.mktemp("slurm")) / "slurm.conf"
    conf.write_text("ClusterName=hl\nSlurmctldHost=localhost\nNodeName=x CPUs=1\nPartitionName=p Nodes=x\n")
    return exe, str(conf)


def _run(scontrol: tuple[str, str], *args: str) -> str:
    """scontrol's answer; its hostlist commands read a config but talk to no daemon."""
    exe, conf = scontrol
    return subprocess.run([exe, *args], capture_output=True, text=True, timeout=30, check=True,
                          env={**os.environ, "SLURM_CONF": conf}).stdout


@pytest.mark.slurm
@pytest.mark.parametrize("expr", list(EXPANDED))
def test_same_as_scontrol_hostnames(scontrol: tuple[str, str], expr: str) -> None:
    assert _run(scontrol, "show", "hostnames", expr).split() == expand(expr)


@pytest.mark.slurm
@pytest.mark.parametrize("names", list(COMPRESSED))
def test_same_as_scontrol_hostlist(scontrol: tuple[str, str], names: str) -> None:
    assert _run(scontrol, "show", "hostlist", names).strip() == compress(expand(names))
