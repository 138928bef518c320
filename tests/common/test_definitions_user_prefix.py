"""Two EPUs on one RabbitMQ: each its own vhost and user prefix, neither re-passwords the other (issue 27).

Before: the definitions command had no way to name users other than ``epu-decision``, ...; user
names are global to a RabbitMQ server, so importing a second EPU's definitions changed the first
one's passwords (its services then failed to log in)."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from epu.common.broker import Broker
from epu.common.testing import wait_for

from epu.cli import main
from tests.conftest import RABBIT_HOST, rabbitmqctl

pytestmark = pytest.mark.rabbitmq
USERS = ("epu-sensor-alpha", "epu-decision", "epu-provisioner", "epu-ctxbroker", "epu-operator")


def login(user: str, password: str, vhost: str) -> bool:
    try:
        Broker(f"amqp://{user}:{password}@{RABBIT_HOST}/{vhost}", connect_timeout=20).connection().release()
    except Exception:  # noqa: BLE001 - not yet
        return False
    return True


def generate(tmp_path: Path, capsys: pytest.CaptureFixture[str], vhost: str, prefix: str) -> tuple[dict, dict]:
    passwords = {f"{prefix}{u}": uuid.uuid4().hex for u in USERS}
    pw = tmp_path / f"pw-{vhost}.toml"
    pw.write_text("".join(f'{u} = "{p}"\n' for u, p in passwords.items()))
    assert main(["deploy", "rabbitmq-definitions", "--domain", "alpha", "--vhost", vhost, "--user-prefix", prefix,
                 "--passwords-file", str(pw)]) == 0
    return json.loads(capsys.readouterr().out), passwords


def test_two_epus_with_their_own_prefixes_keep_their_passwords(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    tag = uuid.uuid4().hex[:6]
    made: list[tuple[str, dict]] = []
    try:
        for site in ("one", "two"):
            vhost, prefix = f"epu-{site}-{tag}", f"{site}{tag}-"
            doc, passwords = generate(tmp_path, capsys, vhost, prefix)
            assert sorted(u["name"] for u in doc["users"]) == sorted(passwords)
            assert {p["user"] for p in doc["permissions"]} == set(passwords)
            res = rabbitmqctl("import_definitions", check=False, stdin=json.dumps(doc))
            assert res.returncode == 0, res.stderr
            made.append((vhost, passwords))
        for vhost, passwords in made:  # both EPUs' users still log in with their own passwords
            user = next(u for u in passwords if u.endswith("epu-operator"))
            wait_for(lambda u=user, v=vhost, p=passwords: login(u, p[u], v), 30, interval=0.5,
                     message=f"{user} logging in to {vhost} (the import is asynchronous)")
    finally:
        for vhost, passwords in made:
            rabbitmqctl("delete_vhost", vhost, check=False)
            for user in passwords:
                rabbitmqctl("delete_user", user, check=False)


def test_a_prefix_must_be_a_name(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["deploy", "rabbitmq-definitions", "--domain", "alpha", "--user-prefix", "a b"]) == 2
    assert "--user-prefix 'a b'" in capsys.readouterr().err
