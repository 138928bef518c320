"""Every operator command from a fresh venv of each role's extra, as a non-root user, with broker
access only (issue 27).

Before: from the base install (which the docs said was enough with broker access) ``epu
instances list``, ``epu policy show`` and ``epu instances terminate ID`` failed with
``ModuleNotFoundError: No module named 'sqlalchemy'``; ``epu ctx`` failed on ``httpx``; on the
control host (SQLAlchemy installed) a non-root operator got ``Permission denied`` on the store
instead of the documented fallback, and ``terminate --force`` without ``--domain`` printed a
SQLAlchemy traceback.

The deployment is real: the generated RabbitMQ definitions, a decision engine as
``epu-decision`` and a provisioner as ``epu-provisioner`` (declare = false), their stores in a
directory only root may enter, a context broker over HTTPS. The wheel is built once; each venv
gets ``epu[ROLE]`` from the local package index; the commands run as ``nobody``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
from epu.common.broker import Broker, Publisher
from epu.common.config import load_config
from epu.common.messages import InstanceEvent, SensorSnapshot
from epu.common.runtime import run_in_thread
from epu.common.testing import wait_for
from epu.services.ctxbroker.server import BrokerServer, ServerSettings
from epu.services.ctxbroker.tls import self_signed

from tests.common.test_packaging import source_copy
from tests.support.definitions import Loaded, loaded_definitions

pytestmark = pytest.mark.rabbitmq
ROLES = ("operator", "sensor", "control", "ctxbroker")
ADMIN_TOKEN = "operator-install-admin-token-0123456789"

CONFIG = """
[broker]
url = "{url}"
declare = false
[decision]
store_url = "sqlite:///{state}/decision.db"
iteration_seconds = 0.3
[provisioner]
store_url = "sqlite:///{state}/provisioner.db"
[ctxbroker]
public_url = "{ctx_url}"
admin_token_file = "{token}"
cert_file = "{cert}"
[domains.alpha]
max_nodes = 2
sites = ["s1"]
[sites.s1]
driver = "epu-sim"
driver_args = {{ path = "{state}/sim.db" }}
"""


@dataclass
class World:
    top: Path
    operator_cfg: Path
    loaded: Loaded


def _install(top: Path, wheel: Path, role: str) -> Path:
    venv = top / f"venv-{role}"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    proc = subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q",
                           f"{wheel}[{role}]"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return venv


@pytest.fixture(scope="module")
def venvs() -> Iterator[dict[str, Path]]:
    """The wheel built once from a copy of the checkout; one venv per role, world-readable (the
    commands run as nobody)."""
    top = Path(tempfile.mkdtemp(prefix="epu-roles-"))
    top.chmod(0o755)
    try:
        src = source_copy(top / "src")
        subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(top / "dist"), "."],
                       cwd=src, check=True, capture_output=True, timeout=600)
        [wheel] = (top / "dist").glob("epu-*.whl")
        with ThreadPoolExecutor(2) as pool:
            done = dict(zip(ROLES, pool.map(lambda r: _install(top, wheel, r), ROLES), strict=True))
        yield done
    finally:
        shutil.rmtree(top, ignore_errors=True)


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    from epu.services.decision.app import build_service as decision
    from epu.services.provisioner.app import build_service as provisioner

    top = Path(tempfile.mkdtemp(prefix="epu-operator-"))
    top.chmod(0o755)
    state = top / "state"  # the services' state directory: closed to the operator (0700, root)
    state.mkdir(mode=0o700)
    cert, key = self_signed(state / "tls")
    token = top / "admin-token"  # the operator's own copy of the admin token
    token.write_text(ADMIN_TOKEN + "\n")
    token.chmod(0o644)
    shutil.copy(cert, top / "ctx.crt")
    (top / "ctx.crt").chmod(0o644)
    ctx = BrokerServer(ServerSettings("127.0.0.1", 0, str(cert), str(key), ADMIN_TOKEN,
                                      f"sqlite:///{state}/ctx.db"))
    ctx.start_in_thread()
    threads, services = [], []
    try:
        with loaded_definitions(["alpha"], admin_access=True) as d:
            def cfg(role: str, name: str) -> Path:
                path = top / name
                path.write_text(CONFIG.format(url=d.url(role), state=state, ctx_url=ctx.public_url, token=token,
                                              cert=top / "ctx.crt"))
                path.chmod(0o644)
                return path

            for build, role in ((decision, "epu-decision"), (provisioner, "epu-provisioner")):
                svc = build(load_config(cfg(role, f"{role}.toml"), environ={}))
                services.append(svc)
                threads.append(run_in_thread(svc))
                assert svc.wait_ready(30), f"{role} serving"
            # one instance per role for the engine to know (as the provisioner announces them)
            pub = Publisher(Broker(d.url("epu-provisioner"), d.topology, declare=False), "provisioner")
            try:
                for role in (*ROLES, "retire"):
                    pub.publish(InstanceEvent(instance_id=f"i-{role}-0123456789", domain="alpha", site="s1",
                                              state="started", seq=2, node_name=f"w-{role}", at=time.time()))
            finally:
                pub.close()
            # the sensor (as its own user) reports the domain, so the engine acts for it
            sensor = Publisher(Broker(d.url("epu-sensor-alpha"), d.topology, declare=False), "sensor-alpha")
            stop_sensor = threading.Event()

            def snapshots() -> None:
                while not stop_sensor.wait(0.5):
                    sensor.publish(SensorSnapshot(domain="alpha", backend="simulated", taken_at=time.time()))

            feeder = threading.Thread(target=snapshots, daemon=True)
            feeder.start()
            try:
                yield World(top, cfg("epu-operator", "operator.toml"), d)
            finally:
                stop_sensor.set()
                feeder.join(5)
                sensor.close()
                stop(services, threads)  # before their users and vhost are deleted under them
    finally:
        stop(services, threads)
        ctx.stop()
        ctx.join()
        shutil.rmtree(top, ignore_errors=True)


def stop(services: list, threads: list) -> None:
    for svc in services:
        svc.stop()
    for t in threads:
        t.join(15)


def as_nobody(venv: Path, cfg: Path, *argv: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    env = {"PATH": f"{venv}/bin:/usr/bin:/bin", "HOME": "/nonexistent", "LANG": "C.UTF-8"}
    return subprocess.run(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups",
                           str(venv / "bin" / "epu"), *argv, "-c", str(cfg)],
                          capture_output=True, text=True, timeout=timeout, env=env, cwd=cfg.parent)


def ok(res: subprocess.CompletedProcess[str]) -> str:
    assert res.returncode == 0, f"{res.args[4:]}: exit {res.returncode}\n{res.stdout}\n{res.stderr}"
    assert "Traceback" not in res.stderr and "Permission denied" not in res.stderr, res.stderr
    return res.stdout


@pytest.mark.timeout(600)
def test_every_operator_command_runs_from_each_roles_install(venvs: dict[str, Path], world: World) -> None:
    cfg = world.operator_cfg
    def listed() -> int:
        board = json.loads(ok(as_nobody(venvs["operator"], cfg, "status", "alpha", "--json", "--seconds", "0")))
        return len(board[0]["instances"]) > len(ROLES) if board else False

    wait_for(listed, 60, interval=0.5, message="the engine's status listing every instance")
    for role, venv in venvs.items():
        iid = f"i-{role}-0123456789"
        board = json.loads(ok(as_nobody(venv, cfg, "status", "alpha", "--json", "--seconds", "0")))
        assert iid in {i["instance_id"] for i in board[0]["instances"]}, role
        shown = as_nobody(venv, cfg, "policy", "show", "alpha", "--json")
        assert json.loads(ok(shown))["source"].startswith("engine status"), role
        listed = as_nobody(venv, cfg, "instances", "list", "--json")
        assert iid in {r["instance_id"] for r in json.loads(ok(listed))}, role
        why = "permission denied" if role in ("control", "ctxbroker") else "no SQL layer"
        assert why in listed.stderr, (role, listed.stderr)
        assert "applied as version" in ok(as_nobody(venv, cfg, "policy", "set", "alpha", "max_nodes=2")), role
        # the id as `epu status` shows it (12 characters), no --domain, forced: a provisioner answers
        out = ok(as_nobody(venv, cfg, "instances", "terminate", iid[:12], "--force", "--reason", role))
        assert f"instance={iid} domain=alpha is terminating" in out, (role, out)
        ok(as_nobody(venv, cfg, "tap", "--seconds", "0.5"))
        ok(as_nobody(venv, cfg, "deploy", "rabbitmq-definitions", "--domain", "alpha"))
        ctx = as_nobody(venv, cfg, "ctx", "list")
        if role in ("operator", "ctxbroker"):
            assert ok(ctx).startswith("ID"), (role, ctx)
        else:  # no HTTPS client here: one line saying what to install, not a traceback
            assert ctx.returncode == 1 and "pip install 'epu[operator]'" in ctx.stderr, (role, ctx.stderr)
            assert "Traceback" not in ctx.stderr
    rec = world.top / "rec"
    rec.mkdir(mode=0o777)
    rec.chmod(0o777)
    ok(as_nobody(venvs["operator"], cfg, "record", "--seconds", "2", "--out", str(rec / "run")))
    assert (rec / "run" / "timeline.csv").exists() and (rec / "run" / "summary.json").exists()
    # the guides the systemd units name ship in the wheel, where docs/deploy.md copies them from
    shipped = Path(ok(as_nobody(venvs["operator"], cfg, "deploy", "path")).strip()).parent / "docs"
    assert {"deploy.md", "decision.md", "sensor.md", "provisioner.md", "ctxbroker.md"} <= {
        p.name for p in shipped.glob("*.md")}
    # an unforced terminate waits for the engine's answer: accepted here
    out = ok(as_nobody(venvs["operator"], cfg, "instances", "terminate", "i-retire-0123456789"))
    assert "accepted by the decision engine" in out
    assert os.stat(world.top / "state").st_mode & 0o777 == 0o700, "the operator was kept out of the stores"
