"""No error message, log line or traceback carries a credential's value (issue 27).

Before: ``epu ctx list --token-file WRONG_FILE`` sent the whole file as the HTTP header, and
the client's "Illegal header value b'Bearer ...'" error printed it — every RabbitMQ password
in it. Here every option that names a credential (or a file of them) is fed files of secrets
in each shape an operator might mistake for the right one, and all the output is searched.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from epu.cli import main

SECRETS = [f"s3cr3t{uuid.uuid4().hex[:12]}" for _ in range(12)]


def secret_files(tmp: Path) -> list[Path]:
    s = SECRETS
    files = {
        "passwords.toml": f'epu-decision = "{s[0]}"\nepu-operator = "{s[1]}"\n',
        "context.env": f"EPU_CONTEXT_SECRET={s[2]}\nEPU_CONTEXT_KEY={s[3]}\nEPU_BROKER__URL=amqp://u:{s[4]}@h/v\n",
        "creds.json": json.dumps({"secret": [s[5]], "key": {"k": s[6]}, "uri": s[7], "password": s[8]}),
        "plain": f"{s[9]}\n{s[10]}\n",
        "one-line": f"Bearer {s[11]} and more",
    }
    out = []
    for name, text in files.items():
        (tmp / name).write_text(text)
        out.append(tmp / name)
    return out


@pytest.fixture
def hangup_server() -> Iterator[int]:
    """A TCP port that accepts and hangs up: an HTTP client gets as far as sending."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    srv.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except OSError:
                continue
            conn.recv(65536)
            conn.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    yield srv.getsockname()[1]
    stop.set()
    t.join(5)
    srv.close()


def run(argv: list[str], capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture) -> str:
    caplog.clear()
    try:
        main(argv)
    except SystemExit:
        pass
    except Exception as exc:  # noqa: BLE001 - a traceback is output too
        import traceback

        print("".join(traceback.format_exception(exc)))
    got = capsys.readouterr()
    return got.out + got.err + caplog.text


def leaked(text: str) -> list[str]:
    return [s for s in SECRETS if s in text]


def test_no_credential_bearing_option_echoes_a_secret(tmp_path: Path, hangup_server: int, monkeypatch,
                                                      capsys: pytest.CaptureFixture[str],
                                                      caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    for key in [k for k in __import__("os").environ if k.startswith("EPU_")]:
        monkeypatch.delenv(key)
    url = f"http://127.0.0.1:{hangup_server}"
    state = tmp_path / "state"
    problems = []
    for f in secret_files(tmp_path):
        cfg = tmp_path / f"cfg-{f.name}.toml"
        cfg.write_text(f'[broker]\nurl = "amqp://guest:guest@127.0.0.1:1/x"\n'
                       f'[ctxbroker]\npublic_url = "{url}"\nadmin_token_file = "{f}"\n'
                       f'[sites.s1]\ndriver = "epu-sim"\ncredentials_file = "{f}"\n'
                       f'[domains.alpha]\nsites = ["s1"]\n'
                       f'[workers.alpha]\ncontext_uri = "https://ctx/v1/contexts/c"\ncontext_secret_file = "{f}"\n')
        for suffix in ("", ".json", ".toml"):
            (tmp_path / f"{f.name}{suffix}").write_bytes(f.read_bytes())
        runs = [
            ["ctx", "list", "--url", url, "--token-file", str(f)],
            ["ctx", "create", "alpha", "--url", url, "--token-file", str(f)],
            ["ctx", "list", "-c", str(cfg)],
            ["deploy", "rabbitmq-definitions", "--domain", "alpha", "--passwords-file", str(f)],
            ["config", "check", str(f)],
            ["config", "check", str(cfg)],
            ["config", "check", str(cfg), "--json"],
            *(["ctx", "agent", opt, f"{f}{suffix}", "--state-dir", str(state), "--scripts-dir", str(state)]
              for opt in ("--env", "--userdata", "-c") for suffix in ("", ".json", ".toml")),
        ]
        for argv in runs:
            text = run(argv, capsys, caplog)
            if leaked(text):
                problems.append((f.name, argv[:3], text[:600]))
    # a password in the broker URL, from the environment and from the file, in a URL that cannot be used
    for broker_url in (f"amqp://guest:{SECRETS[0]}@127.0.0.1:1/x", f"amqp://guest:{SECRETS[1]}@127.0.0.1:notaport/x",
                       f"amqp://guest:{SECRETS[2]}@no-such-host.invalid:5672/x"):
        monkeypatch.setenv("EPU_BROKER__URL", broker_url)
        cfg = tmp_path / "plain.toml"
        cfg.write_text("[domains.alpha]\n")
        for argv in (["tap", "--seconds", "1", "-c", str(cfg)], ["status", "alpha", "--seconds", "0", "-c", str(cfg)],
                     ["config", "check", str(cfg), "--json"],
                     ["policy", "set", "alpha", "max_nodes=2", "--timeout", "1", "-c", str(cfg)]):
            text = run(argv, capsys, caplog)
            if leaked(text):
                problems.append(("EPU_BROKER__URL", argv[:2], text[:600]))
    assert problems == []
