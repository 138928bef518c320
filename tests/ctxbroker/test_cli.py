"""``epu ctx``: create/list/show/nodes/delete against a live broker, and the help texts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from common.cli import main
from services.ctxbroker.client import NodeClient
from services.ctxbroker.server import BrokerServer
from tests.ctxbroker.conftest import ADMIN_TOKEN, node


def test_ctx_commands(broker_server: BrokerServer, tls_files: tuple[str, str], tmp_path: Path,
                      capsys: pytest.CaptureFixture[str]) -> None:
    token = tmp_path / "token"
    token.write_text(ADMIN_TOKEN + "\n")
    conn = ["--url", broker_server.public_url, "--token-file", str(token), "--ca-file", tls_files[0]]

    assert main(["ctx", "create", "cluster-a", "--json", *conn]) == 0
    ctx = json.loads(capsys.readouterr().out)
    assert set(ctx) == {"id", "name", "uri", "key", "secret"}
    nc = NodeClient(ctx["uri"], ctx["key"], ctx["secret"], ca_file=tls_files[0])
    nc.join(node(3, instance_id="i-3"))
    nc.close()

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

    bad = tmp_path / "bad"
    bad.write_text("wrong-token-wrong-token")
    assert main(["ctx", "list", "--url", broker_server.public_url, "--token-file", str(bad),
                 "--ca-file", tls_files[0]]) == 1
    assert "401" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["ctx", "--help"], ["ctx", "create", "--help"], ["ctx", "agent", "--help"],
                                  ["ctx", "nodes", "--help"]])
def test_help(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "usage: epu ctx" in out and len(out) > 300
