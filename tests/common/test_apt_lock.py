"""scripts/apt-lock.sh serialises EPU's package installs: two ``make test`` runs started together
on a fresh machine both found Slurm missing and both ran apt-get, and one failed on dpkg's lock.

Two shells take the lock the way the ensure-*.sh scripts do and hold it for a moment; the test
reads the order they entered and left in. No package is installed."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

HOLDER = """
set -euo pipefail
. "{lib}"
apt_lock
echo "in $1" >> "{log}"
while [ ! -e "{release}" ]; do sleep 0.05; done
echo "out $1" >> "{log}"
"""


def holder(tmp_path: Path, name: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    script = HOLDER.format(lib=ROOT / "scripts" / "apt-lock.sh", log=tmp_path / "log", release=tmp_path / "release")
    with open(tmp_path / f"{name}.err", "w") as err:
        return subprocess.Popen(["bash", "-c", script, "holder", name], text=True, stderr=err,
                                env={"PATH": "/usr/bin:/bin", "EPU_APT_LOCK": str(tmp_path / "apt.lock"),
                                     **(env or {})})


def wait_for(cond, what: str, timeout: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, what
        time.sleep(0.05)


def test_a_second_install_waits_for_the_first_and_says_so(tmp_path: Path) -> None:
    log = tmp_path / "log"
    first = holder(tmp_path, "first")
    wait_for(lambda: log.exists() and "in first" in log.read_text(), "the first holder never took the lock")
    second = holder(tmp_path, "second")
    wait_for(lambda: "waiting for another EPU package install" in (tmp_path / "second.err").read_text(),
             "the second holder did not report waiting")
    assert log.read_text().split("\n")[:-1] == ["in first"]
    (tmp_path / "release").touch()
    assert first.wait(10) == 0 and second.wait(10) == 0
    assert log.read_text().split("\n")[:-1] == ["in first", "out first", "in second", "out second"]


def test_a_lock_held_too_long_fails_with_its_path(tmp_path: Path) -> None:
    first = holder(tmp_path, "first")
    log = tmp_path / "log"
    wait_for(lambda: log.exists() and "in first" in log.read_text(), "the first holder never took the lock")
    second = holder(tmp_path, "second", {"APT_WAIT_SECONDS": "1"})
    try:
        assert second.wait(10) == 1
        assert f"{tmp_path / 'apt.lock'} still held after 1s" in (tmp_path / "second.err").read_text()
        assert "in second" not in log.read_text()
    finally:
        (tmp_path / "release").touch()
        first.wait(10)
