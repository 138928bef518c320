"""The operator's install (issue 14): a wheel that runs, roles that install only what they run,
``make run`` without the test tools.

Before: the wheel lacked the data files (``UserdataError: cannot read userdata template
.../site-packages/deploy/cloud-init/epu-worker.yaml``), every host got every dependency, and
``make run`` installed every dev extra to run the demo."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import httpx
import pytest
from epu.common.testing import wait_for

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def source_copy(dst: Path) -> Path:
    """The checkout's files (tracked, or new and not ignored) copied to ``dst``: a build there
    sees no stale ``build/`` or ``*.egg-info`` of an earlier build in the checkout."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True,
                           capture_output=True, timeout=60).stdout.decode().split("\0")
    for name in filter(None, files):
        src = ROOT / name
        if src.is_file():
            (dst / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst / name)
    return dst


@pytest.fixture(scope="module")
def wheel_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``pip wheel .`` of a copy of the source in a temp dir, installed with the 'demo' extra into
    a fresh venv."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = source_copy(tmp / "src")
    pip = [sys.executable, "-m", "pip"]
    subprocess.run([*pip, "wheel", "--no-deps", "-q", "-w", str(tmp / "dist"), "."], cwd=src, check=True,
                   capture_output=True, timeout=600)
    [wheel] = (tmp / "dist").glob("epu-*.whl")
    subprocess.run([sys.executable, "-m", "venv", str(tmp / "venv")], check=True, timeout=120)
    proc = subprocess.run([str(tmp / "venv" / "bin" / "pip"), "install", "-q", f"{wheel}[demo]"], cwd=tmp,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return tmp


def _run(venv: Path, *argv: str, **kw: object) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV") and not k.startswith("EPU_")}
    return subprocess.run([str(venv / "venv" / "bin" / argv[0]), *argv[1:]], cwd=venv / "work", env=env,
                          capture_output=True, text=True, **kw)  # type: ignore[call-overload]


def test_the_wheel_holds_epu_only_and_runs_the_demo(wheel_venv: Path) -> None:
    (wheel_venv / "work").mkdir(exist_ok=True)
    for name in ("common", "services", "deploy"):
        r = _run(wheel_venv, "python", "-c", f"import {name}")
        assert r.returncode != 0 and "No module named" in r.stderr, name
    assert _run(wheel_venv, "epu", "--version", timeout=60).stdout.startswith("epu ")
    site = Path(_run(wheel_venv, "python", "-c", "import epu, os; print(os.path.dirname(epu.__file__))").stdout.strip())
    assert (site / "deploy" / "cloud-init" / "epu-worker.yaml").is_file()
    assert os.access(site / "deploy" / "ctx-scripts" / "restart.d" / "10-cluster-files", os.X_OK)
    assert _run(wheel_venv, "epu", "deploy", "path", timeout=60).stdout.strip() == str(site / "deploy")
    r = _run(wheel_venv, "epu", "demo", "--jobs", "4", "--json", timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    summary = json.loads(r.stdout)
    assert summary["jobs_completed"] == 4 and summary["final_instances"] == 0 and summary["context_joins"] >= 1


@pytest.mark.parametrize("service", ["sensor", "decision", "provisioner", "ctxbroker"])
def test_every_service_runs_from_the_wheel(wheel_venv: Path, service: str, rabbit_url: str, prefix: str) -> None:
    work = wheel_venv / f"work-{service}"
    work.mkdir(exist_ok=True)
    metrics = free_port()
    config = work / "epu.toml"
    config.write_text(textwrap.dedent(f"""
        [broker]
        url = "{rabbit_url}"
        prefix = "{prefix}"

        [sensor]
        domain = "alpha"
        backend = "simulated"
        metrics_port = {metrics}

        [decision]
        store_url = "sqlite:///{work}/decision.db"
        metrics_port = {metrics}

        [provisioner]
        store_url = "sqlite:///{work}/provisioner.db"
        metrics_port = {metrics}

        [ctxbroker]
        port = {free_port()}
        store_url = "sqlite:///{work}/ctxbroker.db"
        admin_token_file = "{work}/admin-token"
        metrics_port = {metrics}

        [domains.alpha]
        sites = ["sim"]

        [sites.sim]
        driver = "epu-sim"
        image = "img"
        size = "s"
        driver_args = {{ path = "{work}/sim.db" }}
        """))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV") and not k.startswith("EPU_")}
    proc = subprocess.Popen([str(wheel_venv / "venv" / "bin" / "epu"), "run", service, "-c", str(config)],
                            cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        def healthy() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"epu run {service} exited {proc.returncode}: {proc.stdout.read()[-3000:]}")
            try:
                return httpx.get(f"http://127.0.0.1:{metrics}/healthz", timeout=2).json().get("healthy") is True
            except (httpx.HTTPError, ValueError):
                return False

        wait_for(healthy, timeout=60, interval=0.2, message=f"epu run {service} healthy")
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
        assert proc.returncode == 0, out[-3000:]
        assert "Traceback" not in out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


# --------------------------------------------------------------------------- roles
#: import name of each third-party distribution the project depends on
IMPORT_NAMES = {"kombu": ["kombu", "amqp"], "msgpack": ["msgpack"], "pydantic": ["pydantic"],
                "prometheus-client": ["prometheus_client"], "rich": ["rich"], "apache-libcloud": ["libcloud"],
                "sqlalchemy": ["sqlalchemy"], "tenacity": ["tenacity"], "fastapi": ["fastapi", "starlette"],
                "uvicorn": ["uvicorn"], "httptools": ["httptools"], "uvloop": ["uvloop"],
                "cryptography": ["cryptography"], "httpx": ["httpx"], "pyyaml": ["yaml"],
                "matplotlib": ["matplotlib"], "psycopg": ["psycopg"]}


def _dist(req: str) -> str:
    for sep in "[<>=!~ ;":
        req = req.split(sep)[0]
    return req.strip().lower()


def role_imports(*extras: str) -> set[str]:
    """What the base dependencies plus these extras (from pyproject.toml) let one import."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = list(project["dependencies"])
    for extra in extras:
        reqs += project["optional-dependencies"][extra]
    allowed = set()
    for r in reqs:
        allowed.update(IMPORT_NAMES.get(_dist(r), [_dist(r)]))
    return allowed


BLOCKER = """
import sys, importlib.abc
BLOCKED = set(sys.argv[1].split(","))
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r} (not in this role's extras)", name=name)
        return None
sys.meta_path.insert(0, Block())
sys.argv = sys.argv[1:]
exec(sys.argv[1])
"""

ROLE_CODE = {
    "sensor": """
from epu.cli import build_parser
build_parser()
from epu.common.config import parse_config
from epu.services.sensor.app import build_service
build_service(parse_config({"sensor": {"backend": "simulated"}}, environ={}))
""",
    "control": """
import tempfile
from epu.cli import build_parser
build_parser()
from epu.common.config import parse_config
from epu.services.decision.app import build_service as decision
from epu.services.provisioner.app import build_service as provisioner
d = tempfile.mkdtemp()
c = parse_config({"decision": {"store_url": f"sqlite:///{d}/d.db"}, "provisioner": {"store_url": f"sqlite:///{d}/p.db"},
                  "sites": {"sim": {"driver": "epu-sim", "driver_args": {"path": f"{d}/s.db"}}}}, environ={})
decision(c)
provisioner(c)
# epu record on a host without the 'plots' extra: the CSV and summary, and a note for the chart
from pathlib import Path
from epu.cli_record import write_results
from epu.common.timeline import Timeline
summary = write_results(Timeline(), Path(d) / "rec")
assert "plots" in summary["png"] and (Path(d) / "rec" / "timeline.csv").exists(), summary
""",
    "ctxbroker": """
import tempfile
from epu.cli import build_parser
build_parser()
from epu.common.config import parse_config
from epu.services.ctxbroker.app import build_service
d = tempfile.mkdtemp()
build_service(parse_config({"ctxbroker": {"store_url": f"sqlite:///{d}/c.db", "admin_token_file": f"{d}/t"}}, environ={}))
""",
    "agent": """
import tempfile
from epu.services.ctxbroker.agent.main import main
from epu.services.ctxbroker.agent.agent import Agent
from epu.services.ctxbroker.agent.config import AgentConfig
from epu.services.ctxbroker.agent.node import node_fields
try:
    main(["--help"])
except SystemExit:
    pass
key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGq3mQm1xq5cS0n2yP1vJ4m0x8JYVbq0mYb2p6kq3N1c"
cfg = AgentConfig(uri="https://b/v1/contexts/c", key="node/wn-1/i-1", secret="s", ssh_host_key=key,
                  state_dir=tempfile.mkdtemp(), ip="10.0.0.1")
Agent(cfg, node_fields(cfg))
""",
}

ROLES = {"sensor": ("sensor",), "control": ("control",), "ctxbroker": ("ctxbroker",), "agent": ("agent",)}


@pytest.mark.parametrize("role", sorted(ROLES))
def test_each_role_needs_only_its_extras(role: str, tmp_path: Path) -> None:
    """A batch head node installs 'epu[sensor]' and gets no libcloud, FastAPI, uvicorn or
    matplotlib; each role's service builds with the other roles' packages unimportable."""
    every = {name for names in IMPORT_NAMES.values() for name in names}
    blocked = every - role_imports(*ROLES[role])
    if role == "agent":  # a worker image needs the agent, not the messaging runtime
        blocked |= {"kombu", "amqp", "msgpack", "prometheus_client", "rich"} - role_imports("agent", "ctxbroker")
        blocked -= {"pydantic"}
    proc = subprocess.run([sys.executable, "-c", BLOCKER, ",".join(sorted(blocked)), ROLE_CODE[role]],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, f"role {role} imports outside its extras:\n{proc.stderr[-3000:]}"
    if role == "sensor":
        assert {"libcloud", "fastapi", "uvicorn", "matplotlib"} <= blocked


def test_make_run_installs_the_demo_extra_not_the_dev_tools(tmp_path: Path) -> None:
    make = shutil.which("make")
    assert make, "make is part of the developer's path"
    out = subprocess.run([make, "-n", "run", f"VENV={tmp_path / 'fresh'}"], cwd=ROOT, capture_output=True,
                         text=True, check=True, timeout=60).stdout
    installs = [line for line in out.splitlines() if "pip install" in line and "-e" in line]
    assert installs == [f"{tmp_path / 'fresh'}/bin/pip install -q -e '.[demo]'"], out
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    demo = " ".join(project["optional-dependencies"]["demo"])
    assert "dev" not in demo and "pytest" not in demo and "plots" not in demo
