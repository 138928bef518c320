"""The agent against a live broker: convergence, restarts, default scripts, backoff, leaving."""

from __future__ import annotations

import base64
import json
import random
import stat
import threading
from collections.abc import Callable
from pathlib import Path

from epu.common.testing import wait_for
from epu.services.ctxbroker.agent.agent import Agent
from epu.services.ctxbroker.agent.config import AgentConfig, load_agent_config, parse_userdata
from epu.services.ctxbroker.client import AdminClient, NodeClient
from epu.services.ctxbroker.core import Entry, NodeFields
from epu.services.ctxbroker.server import BrokerServer

from tests.ctxbroker.conftest import ADMIN_TOKEN, DEFAULT_SCRIPTS, node, node_credential


class Running:
    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        self.thread = threading.Thread(target=agent.run, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.agent.stop()
        self.thread.join(20)
        assert not self.thread.is_alive()


def make_agent(ctx: dict[str, str], tls: tuple[str, str], tmp: Path, i: int, scripts: Path = DEFAULT_SCRIPTS,
               **kw: object) -> Agent:
    fields = node(i)
    cred = node_credential(ctx, str(fields["hostname"]))
    cfg = AgentConfig(uri=ctx["uri"], key=cred.key, secret=cred.secret, ca_file=tls[0],
                      scripts_dir=str(scripts), state_dir=str(tmp / f"state-{i}"), root=str(tmp / f"root-{i}"),
                      wait=10, backoff_initial=0.05, backoff_max=0.5, **kw)  # type: ignore[arg-type]
    return Agent(cfg, NodeFields.model_validate(fields))


def test_agents_converge_on_the_same_membership(broker_server: BrokerServer, context: dict[str, str],
                                                node_client: NodeClient, admin: AdminClient,
                                                tls_files: tuple[str, str], tmp_path: Path) -> None:
    # the default restart script: every agent renders the cluster files once per batch
    scripts = tmp_path / "scripts" / "restart.d"
    scripts.mkdir(parents=True)
    (scripts / "10-cluster-files").symlink_to(DEFAULT_SCRIPTS / "restart.d" / "10-cluster-files")
    agents = [Running(make_agent(context, tls_files, tmp_path, i, tmp_path / "scripts")) for i in range(3)]
    wait_for(lambda: all(a.agent.registered.is_set() for a in agents), message="agents registered")
    rng = random.Random(6)
    present: set[int] = set()
    for _ in range(25):  # a random interleaving of joins, updates and leaves of other nodes
        i = rng.randrange(10, 18)
        if i in present and rng.random() < 0.5:
            node_client.leave(f"wn-{i}")
            present.discard(i)
        else:
            node_client.join(node(i, ip=f"10.9.{rng.randrange(3)}.{i}"))
            present.add(i)
    last = node_client.updates(0)["last_id"]
    wait_for(lambda: all(a.agent.state.last_id == last and not a.agent.state.restart_pending for a in agents),
             timeout=20,
             message="every agent to apply every entry")
    expected = {n["hostname"]: n for n in admin.nodes(context["id"])}
    for a in agents:
        got = {h: {**m, "instance_id": m.get("instance_id")} for h, m in a.agent.state.members.items()}
        assert got == expected
    files = [(tmp_path / f"root-{i}" / "etc" / "hosts").read_text() for i in range(3)]
    assert files[0] == files[1] == files[2]
    # agents leave on shutdown
    for a in agents:
        a.stop()
    assert not {f"wn-{i}" for i in range(3)} & {n["hostname"] for n in admin.nodes(context["id"])}


def _logging_scripts(root: Path) -> Path:
    scripts = root / "scripts"
    body = {"init": "init", "add-node": "add $EPU_ENTRY_ID", "delete-node": "del $EPU_ENTRY_ID",
            "restart": "restart"}
    for hook, text in body.items():
        d = scripts / f"{hook}.d"
        d.mkdir(parents=True)
        p = d / "10-log"
        var = "os.environ['EPU_ENTRY_ID']" if "$" in text else "''"
        p.write_text(f"#!/usr/bin/env python3\nimport os\nopen(os.environ['EPU_CTX_ROOT'] + '/applied.log', 'a').write("
                     f"'{text.split()[0]} ' + {var} + '\\n')\n")
        p.chmod(p.stat().st_mode | stat.S_IXUSR)
    return scripts


def test_restarted_agent_reapplies_nothing(broker_server: BrokerServer, context: dict[str, str],
                                           node_client: NodeClient, tls_files: tuple[str, str],
                                           tmp_path: Path) -> None:
    log = tmp_path / "root-0" / "applied.log"
    log.parent.mkdir()
    scripts = _logging_scripts(tmp_path)
    first = Running(make_agent(context, tls_files, tmp_path, 0, scripts))
    for i in (1, 2, 3):
        node_client.join(node(i))
    wait_for(lambda: first.agent.state.last_id == 4, message="first run applied 4 entries")
    first.stop()  # leaves: entry 5, applied now or after the restart, exactly once either way
    node_client.join(node(4))
    node_client.leave("wn-1")
    second = Running(make_agent(context, tls_files, tmp_path, 0, scripts))  # same state dir
    last = lambda: node_client.updates(0)["last_id"]  # noqa: E731
    wait_for(lambda: second.agent.state.last_id == last() >= 8, message="second run caught up")
    second.stop()
    lines = log.read_text().split("\n")
    assert lines.count("init ") == 1
    applied = [int(x.split()[1]) for x in lines if x.startswith(("add", "del"))]
    assert applied == list(range(1, len(applied) + 1))  # each entry once, in order
    assert applied[-1] >= 8
    assert "restart " in lines


def test_default_scripts_write_known_hosts_hosts_and_hostfile(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    (root / "etc" / "hosts").write_text("127.0.0.1\tlocalhost\n")
    cfg = AgentConfig(uri="https://x/v1/contexts/c", key="k", secret="s", scripts_dir=str(DEFAULT_SCRIPTS),
                      state_dir=str(tmp_path / "state"), root=str(root))
    a = Agent(cfg, NodeFields.model_validate(node(1)))
    a.ensure_init()
    assert (root / "var" / "log").is_dir()  # init.d ran

    def join(eid: int, i: int, **kw: object) -> Entry:
        n = node(i, **kw)
        return Entry(eid, "join", n["hostname"], n["fqdn"], n["ip"], n["ssh_host_key"], n["data"])  # type: ignore[arg-type]

    a.apply([join(1, 2), join(2, 1), join(3, 3, data='{"slots": 8}')])
    a.apply([Entry(4, "leave", "wn-3"), join(5, 7, data="")])
    n1, n2, n7 = node(1), node(2), node(7)
    hosts = (root / "etc" / "hosts").read_text()
    assert hosts == ("127.0.0.1\tlocalhost\n# BEGIN EPU CONTEXT\n"
                     "10.0.0.2\twn-1.cluster.test wn-1\n10.0.0.3\twn-2.cluster.test wn-2\n"
                     "10.0.0.8\twn-7.cluster.test wn-7\n# END EPU CONTEXT\n")
    known = (root / "etc" / "ssh" / "ssh_known_hosts").read_text()
    assert known == ("# BEGIN EPU CONTEXT\n"
                     f"wn-1,wn-1.cluster.test,10.0.0.2 {n1['ssh_host_key']}\n"
                     f"wn-2,wn-2.cluster.test,10.0.0.3 {n2['ssh_host_key']}\n"
                     f"wn-7,wn-7.cluster.test,10.0.0.8 {n7['ssh_host_key']}\n# END EPU CONTEXT\n")
    hostfile = (root / "etc" / "epu" / "mpi_hostfile").read_text()
    assert hostfile == "# BEGIN EPU CONTEXT\nwn-1 slots=2\nwn-2 slots=3\nwn-7 slots=1\n# END EPU CONTEXT\n"
    # every known_hosts key line is one ssh-keygen would accept: TYPE and base64 blob
    for line in known.splitlines()[1:-1]:
        base64.b64decode(line.split()[2], validate=True)
    log = (root / "var" / "log" / "epu-ctx.log").read_text()
    assert [x.split()[1:4] for x in log.splitlines()] == [
        ["entry=1", "join", "wn-2"], ["entry=2", "join", "wn-1"], ["entry=3", "join", "wn-3"],
        ["entry=4", "leave", "wn-3"], ["entry=5", "join", "wn-7"]]


def test_agent_retries_with_backoff_until_the_broker_is_back(
        make_broker: Callable[..., BrokerServer], sqlite_url: str, tls_files: tuple[str, str],
        tmp_path: Path) -> None:
    first = make_broker(sqlite_url)
    port = first.port
    admin = AdminClient(first.public_url, ADMIN_TOKEN, ca_file=tls_files[0])
    ctx = admin.create("flaky")
    admin.close()
    first.stop()
    first.join()
    agent = make_agent(ctx, tls_files, tmp_path, 1)
    run = Running(agent)
    failures = {"n": 0}
    real = agent.client.join

    def counting(doc: dict[str, object]) -> dict[str, object]:
        failures["n"] += 1
        return real(doc)

    agent.client.join = counting  # type: ignore[method-assign]
    wait_for(lambda: failures["n"] >= 3, message="the agent to retry while the broker is away")
    assert not agent.registered.is_set()
    make_broker(sqlite_url, port=port)  # same port, same database
    wait_for(lambda: agent.state.last_id == 1, timeout=15, message="agent registered and applied its join")
    run.stop()


def test_context_info_from_userdata(tmp_path: Path) -> None:
    cloud = "#cloud-config\nepu_context:\n  uri: https://b:8443/v1/contexts/c1\n  key: k\n  secret: s\n"
    assert parse_userdata(cloud) == {"uri": "https://b:8443/v1/contexts/c1", "key": "k", "secret": "s"}
    assert parse_userdata(json.dumps({"epu_context": {"uri": "https://x", "key": "k", "secret": "s"}}))["key"] == "k"
    shell = "#!/bin/sh\nexport EPU_CTX_URI=https://b/v1/contexts/c2\nEPU_CTX_KEY='k2'\nEPU_CTX_SECRET=\"s2\"\n"
    assert parse_userdata(shell) == {"uri": "https://b/v1/contexts/c2", "key": "k2", "secret": "s2"}
    assert parse_userdata("#!/bin/sh\necho hi\n") == {}
    ud = tmp_path / "user-data.txt"
    ud.write_text(shell)
    conf = tmp_path / "agent.toml"
    conf.write_text('state_dir = "/tmp/x"\nwait = 5\n')
    cfg = load_agent_config(str(conf), str(ud), {"root": "/r", "hostname": None})
    assert (cfg.uri, cfg.key, cfg.secret, cfg.state_dir, cfg.wait, cfg.root) == (
        "https://b/v1/contexts/c2", "k2", "s2", "/tmp/x", 5, "/r")
    assert "s2" not in repr(cfg)
    # the /etc/epu/context.env that deploy/cloud-init/epu-worker.yaml writes
    env = tmp_path / "context.env"
    env.write_text("EPU_CONTEXT_URI=https://b/v1/contexts/c3\nEPU_CONTEXT_ID=c3\nEPU_CONTEXT_KEY=k3\n"
                   "EPU_CONTEXT_SECRET=s3\nEPU_INSTANCE_ID=i-42\nEPU_NODE_NAME=wn-9\n")
    cfg = load_agent_config(None, None, {}, env_file=str(env))
    assert (cfg.uri, cfg.key, cfg.secret, cfg.instance_id) == ("https://b/v1/contexts/c3", "k3", "s3", "i-42")  # the secret never shows in a repr (or a log line built from it)


def test_agent_starts_over_when_the_broker_list_is_behind(tmp_path: Path) -> None:
    """A restored or recreated context has fewer entries than the agent applied: it resets."""

    class Stub:
        def __init__(self) -> None:
            self.docs = [{"last_id": 1, "entries": []},
                         {"last_id": 1, "snapshot": True, "entries": [{"id": 1, "kind": "join", **node(4)}]}]

        def updates(self, after: int, wait: float) -> dict[str, object]:
            return self.docs.pop(0)

    cfg = AgentConfig(uri="https://x/v1/contexts/c", key="k", secret="s", scripts_dir=str(tmp_path / "none"),
                      state_dir=str(tmp_path / "state"), root=str(tmp_path / "root"))
    a = Agent(cfg, NodeFields.model_validate(node(1)), client=Stub())  # type: ignore[arg-type]
    a.state.last_id = 7
    a.state.members = {"wn-9": NodeFields.model_validate(node(9)).model_dump()}
    assert a.poll_once() == 0 and a.state.last_id == 0 and list(a.state.members) == ["wn-9"]
    # the snapshot that follows replaces the membership: wn-9 deleted, wn-4 added
    assert a.poll_once() == 2 and a.state.last_id == 1 and list(a.state.members) == ["wn-4"]
