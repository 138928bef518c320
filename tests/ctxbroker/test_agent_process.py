"""``epu-ctx-agent`` as a real process: reads cloud-init's context.env, joins, applies, leaves on SIGTERM."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest
from epu.common.testing import wait_for
from epu.services.ctxbroker.client import AdminClient
from epu.services.ctxbroker.server import BrokerServer

from tests.ctxbroker.conftest import DEFAULT_SCRIPTS, REPO, Nodes, node, node_credential, ssh_key


def test_agent_process_joins_applies_and_leaves_on_sigterm(broker_server: BrokerServer, admin: AdminClient,
                                                           context: dict[str, str], node_client: Nodes,
                                                           tls_files: tuple[str, str], tmp_path: Path,
                                                           caplog: pytest.LogCaptureFixture) -> None:
    cred = node_credential(context, "wn-77", "i-77")  # what the provisioner renders for instance i-77
    env_file = tmp_path / "context.env"
    env_file.write_text(f"EPU_CONTEXT_URI={context['uri']}\nEPU_CONTEXT_ID={context['id']}\n"
                        f"EPU_CONTEXT_KEY={cred.key}\nEPU_CONTEXT_SECRET={cred.secret}\n"
                        "EPU_INSTANCE_ID=i-77\n")
    conf = tmp_path / "agent.toml"
    conf.write_text(f'fqdn = "wn-77.cluster.test"\nssh_host_key = "{ssh_key(77)}"\nwait = 20\n')
    node_client.join(node(1))
    proc = subprocess.Popen(
        [sys.executable, "-m", "epu.services.ctxbroker.agent.main", "--env", str(env_file), "--config", str(conf),
         "--scripts-dir", str(DEFAULT_SCRIPTS), "--state-dir", str(tmp_path / "state"),
         "--root", str(tmp_path / "root"), "--ca-file", tls_files[0], "--hostname", "wn-77", "--ip", "10.0.7.7"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        # held (503, retried) until the provisioner reports the instance's address; then joined
        wait_for(lambda: "join held" in caplog.text, timeout=30, message="the join held for the address")
        assert [n["hostname"] for n in admin.nodes(context["id"])] == ["wn-1"]
        broker_server.store.note_instance("i-77", "10.0.7.7")
        hosts = tmp_path / "root" / "etc" / "hosts"
        wait_for(lambda: hosts.exists() and "wn-77" in hosts.read_text() and "wn-1" in hosts.read_text(),
                 timeout=30, message="the agent to join and render /etc/hosts")
        assert {n["hostname"]: n["instance_id"] for n in admin.nodes(context["id"])} == {"wn-1": None,
                                                                                          "wn-77": "i-77"}
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=20)
        assert proc.returncode == 0, out
        assert context["secret"] not in out and cred.secret not in out  # never logged
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert [n["hostname"] for n in admin.nodes(context["id"])] == ["wn-1"]
