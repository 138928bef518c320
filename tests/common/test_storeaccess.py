"""Where an operator command may read a service's store, and the one line when it may not (issue 27).

Before: a non-root operator on the control host got ``PermissionError: [Errno 13] Permission
denied`` (a traceback) from ``epu instances list`` and ``epu policy show``, because the state
directory is closed to them; ``terminate --force`` without ``--domain`` printed a SQLAlchemy
traceback. The whole-venv version of this, per role, is test_operator_install.py."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from epu.common.messages import LaunchRequest
from epu.common.storeaccess import read_store, store_unreadable
from epu.services.provisioner.store import Store

ROOT = Path(__file__).resolve().parents[2]
PYTHON = ROOT / ".venv" / "bin" / "python"


@pytest.fixture
def control_host() -> Iterator[Path]:
    """Stores in a state directory only root may enter; a config the operator may read."""
    top = Path(tempfile.mkdtemp(prefix="epu-store-"))
    top.chmod(0o755)
    state = top / "state"
    state.mkdir(mode=0o700)
    store = Store(f"sqlite:///{state}/provisioner.db")
    store.record_launch(LaunchRequest(launch_id="i-1", domain="alpha", site="s1", node_name="w1"), 100.0)
    store.close()
    cfg = top / "epu.toml"
    cfg.write_text(f'[broker]\nurl = "amqp://guest:guest@127.0.0.1:1/x"\n'
                   f'[decision]\nstore_url = "sqlite:///{state}/decision.db"\n'
                   f'[provisioner]\nstore_url = "sqlite:///{state}/provisioner.db"\n[domains.alpha]\n')
    cfg.chmod(0o644)
    yield top
    shutil.rmtree(top, ignore_errors=True)


def as_nobody(top: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", "HOME": "/nonexistent", "PYTHONPATH": str(ROOT)}
    return subprocess.run(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", str(PYTHON), "-m",
                           "epu", *argv, "-c", str(top / "epu.toml")], capture_output=True, text=True, timeout=60,
                          env=env, cwd=top)


def test_a_store_closed_to_the_operator_is_one_line_not_a_traceback(control_host: Path) -> None:
    listed = as_nobody(control_host, "instances", "list")
    assert listed.returncode == 0, listed.stderr
    assert "provisioner.db (provisioner.store_url) is closed to this user (permission denied)" in listed.stderr
    shown = as_nobody(control_host, "policy", "show", "alpha")
    assert shown.returncode == 1 and "closed to this user (permission denied): reading the decision engine's " \
        "status over the broker" in shown.stderr, shown.stderr
    assert shown.stderr.strip().splitlines()[-1].startswith("epu: cannot reach RabbitMQ"), shown.stderr
    forced = as_nobody(control_host, "instances", "terminate", "i-1", "--force", "--timeout", "1")
    assert forced.returncode == 1, forced.stderr
    for res in (listed, shown, forced):
        assert "Traceback" not in res.stderr and "Errno 13" not in res.stderr, res.stderr
    assert [p.name for p in (control_host / "state").iterdir()] == ["provisioner.db"], "nothing created"


def test_what_each_host_is_told(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert store_unreadable(f"sqlite:///{tmp_path}/absent.db", "k") == f"no store at {tmp_path}/absent.db (k)"
    (tmp_path / "garbage.db").write_text("not a database, " * 100)
    got, why = read_store(f"sqlite:///{tmp_path}/garbage.db", "provisioner.store_url",
                          lambda: Store(f"sqlite:///{tmp_path}/garbage.db").list())
    assert got is None and why.startswith("the store (provisioner.store_url) cannot be read here: ")
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "sqlalchemy" else real(name, *a))
    assert "no SQL layer" in store_unreadable(f"sqlite:///{tmp_path}/garbage.db", "k")
    assert os.path.exists(tmp_path / "garbage.db")
