"""Load generated RabbitMQ definitions (least-privilege users, queues, policies) into a fresh vhost
of the real broker, with random passwords, for tests that act as each user."""

from __future__ import annotations

import json
import secrets
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from epu.common.definitions import QueueBounds, rabbitmq_definitions
from epu.common.testing import wait_for
from epu.common.topology import Topology

from tests.conftest import RABBIT_ADMIN, RABBIT_HOST, rabbitmqctl


@dataclass
class Loaded:
    vhost: str
    prefix: str
    """Prefix of the user names (the queue names have none: the production topology)."""
    passwords: dict[str, str]
    topology: Topology
    doc: dict

    def url(self, role: str, host: str = RABBIT_HOST) -> str:
        user = self.prefix + role
        return f"amqp://{user}:{self.passwords[user]}@{host}/{self.vhost}"

    @property
    def admin_url(self) -> str:
        return f"amqp://{RABBIT_ADMIN}@{RABBIT_HOST}/{self.vhost}"


@contextmanager
def loaded_definitions(domains: list[str], bounds: QueueBounds | None = None,
                       admin_access: bool = False) -> Iterator[Loaded]:
    """Import the definitions for ``domains``; ``admin_access`` also lets the test's admin user
    (guest) into the vhost, to inspect queues."""
    vhost = f"epu-defs-{uuid.uuid4().hex[:8]}"
    user_prefix = f"t{uuid.uuid4().hex[:6]}-"
    topology = Topology()
    base = rabbitmq_definitions(topology, domains, vhost=vhost, user_prefix=user_prefix)
    passwords = {u["name"]: secrets.token_urlsafe(12) for u in base["users"]}
    doc = rabbitmq_definitions(topology, domains, vhost=vhost, user_prefix=user_prefix, passwords=passwords,
                               bounds=bounds)
    # via stdin: rabbitmqctl reads files as the rabbitmq user, which cannot see pytest's tmp dirs
    res = rabbitmqctl("import_definitions", check=False, stdin=json.dumps(doc))
    assert res.returncode == 0, res.stdout + res.stderr
    # the import is asynchronous: wait until the last user's topic permissions are in place
    last = user_prefix + "epu-operator"
    wait_for(lambda: "decision" in rabbitmqctl("list_user_topic_permissions", last, check=False).stdout,
             30, message="definitions imported")
    if admin_access:
        rabbitmqctl("set_permissions", "-p", vhost, RABBIT_ADMIN.split(":")[0], ".*", ".*", ".*")
    try:
        yield Loaded(vhost, user_prefix, passwords, topology, doc)
    finally:
        for name in passwords:
            rabbitmqctl("delete_user", name, check=False)
        rabbitmqctl("delete_vhost", vhost, check=False)
