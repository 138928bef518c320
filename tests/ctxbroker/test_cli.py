"""``epu ctx``: create/list/show/nodes/delete against a live broker, and the help texts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from epu.common.nodecred import NodeCredential
from epu.services.ctxbroker.client import BrokerError, NodeClient
from epu.services.ctxbroker.server import BrokerServer

from epu.cli import main
from tests.ctxbroker.conftest import ADMIN_TOKEN, node, node_credential


def _cred(c: NodeCredential) -> tuple[str, str]:
    return c.key, c.secret


def test_ctx_commands(broker_server: BrokerServer, tls_files: tuple[str, str], tmp_path: Path,
                      capsys: pytest.CaptureFixture[str]) -> None:
    token = tmp_path / "token"
    token.write_text(ADMIN_TOKEN + "\n")
    conn = ["--url", broker_server.public_url, "--token-file", str(token), "--ca-file", tls_files[0]]

    assert main(["ctx", "create", "cluster-a", "--json", *conn]) == 0
    ctx = json.loads(capsys.readouterr().out)
    assert set(ctx) == {"id", "name", "uri", "key", "secret"}
    nc = NodeClient(ctx["uri"], *_cred(node_credential(ctx, "wn-3", "i-3")), ca_file=tls_files[0])
    broker_server.store.note_instance("i-3", str(node(3)["ip"]))  # as the provisioner reports it
    nc.join(node(3, instance_id="i-3"))
    nc.close()
    # an operator-issued credential for the head node joins as head, and as head only
    assert main(["ctx", "credential", ctx["id"], "head", "--json", *conn]) == 0
    cred = json.loads(capsys.readouterr().out)
    assert cred["key"] == "node/head/" and cred["uri"] == ctx["uri"]
    head = NodeClient(cred["uri"], cred["key"], cred["secret"], ca_file=tls_files[0])
    assert head.join(node(0, hostname="head", fqdn="head.cluster.test"))["changed"] is True
    with pytest.raises(BrokerError) as refused:
        head.join(node(3))
    assert refused.value.status == 403
    head.close()
    assert main(["ctx", "remove-node", ctx["id"], "head", *conn]) == 0
    assert "removed head" in capsys.readouterr().out

    assert main(["ctx", "list", *conn]) == 0
    out = capsys.readouterr().out
    assert ctx["id"] in out and "cluster-a" in out and ctx["secret"] not in out
    assert main(["ctx", "show", ctx["id"], "--json", *conn]) == 0
    assert json.loads(capsys.readouterr().out)["nodes"] == 1
    assert main(["ctx", "nodes", ctx["id"], *conn]) == 0
    out = capsys.readouterr().out
    assert "wn-3" in out and "i-3" in out
    assert main(["ctx", "delete", ctx["id"], *conn]) == 0
    capsys.readouterr()
    assert main(["ctx", "show", ctx["id"], *conn]) == 1
    assert "404: unknown context" in capsys.readouterr().err

    # --secret-file: the secret goes to a new 0600 file, never to stdout
    secret_file = tmp_path / "contexts" / "b.secret"
    assert main(["ctx", "create", "cluster-b", "--secret-file", str(secret_file), "--json", *conn]) == 0
    shown = json.loads(capsys.readouterr().out)
    secret = secret_file.read_text().strip()
    assert len(secret) >= 43 and secret not in json.dumps(shown)
    assert secret_file.stat().st_mode & 0o777 == 0o600
    assert main(["ctx", "create", "cluster-c", "--secret-file", str(secret_file), *conn]) == 2  # never overwritten
    assert "exists" in capsys.readouterr().err and secret_file.read_text().strip() == secret

    bad = tmp_path / "bad"
    bad.write_text("wrong-token-wrong-token")
    assert main(["ctx", "list", "--url", broker_server.public_url, "--token-file", str(bad),
                 "--ca-file", tls_files[0]]) == 1
    assert "401" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["ctx", "--help"], ["ctx", "create", "--help"], ["ctx", "agent", "--help"],
                                  ["ctx", "nodes", "--help"], ["ctx", "credential", "--help"]])
def test_help(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "usage: epu ctx" in out and len(out) > 300


def test_a_second_context_of_one_name_is_refused(broker_server: BrokerServer, tls_files: tuple[str, str],
                                                  tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Before: a second ``epu ctx create alpha`` silently made a duplicate, and the cluster's
    nodes could end up split between two lists."""
    token = tmp_path / "token"
    token.write_text(ADMIN_TOKEN + "\n")
    conn = ["--url", broker_server.public_url, "--token-file", str(token), "--ca-file", tls_files[0]]
    assert main(["ctx", "create", "alpha", "--json", *conn]) == 0
    first = json.loads(capsys.readouterr().out)
    assert main(["ctx", "create", "alpha", *conn, "--secret-file", str(tmp_path / "second.secret")]) == 1
    err = capsys.readouterr().err
    assert f"a context named 'alpha' exists already (id {first['id']}" in err and "nothing created" in err
    assert not (tmp_path / "second.secret").exists()
    assert main(["ctx", "list", "--json", *conn]) == 0
    assert [c["name"] for c in json.loads(capsys.readouterr().out)] == ["alpha"]
