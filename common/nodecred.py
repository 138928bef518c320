"""Per-node credentials of a context: what the provisioner derives at launch and the broker checks.

Why per node: userdata is readable by any job on a node (the cloud's metadata service), so a
credential in it must not let that job speak for another node. A node credential is bound to
one host name and one instance id; the broker lets it join and leave only as that host, and
refuses it once the instance is reported terminated. The context's own key and secret stay
with the operator and the provisioner; they can read a context but not rewrite its members.

Why derived rather than stored: the provisioner renders userdata for every launch, possibly
while the broker is unreachable. It holds the context secret (``epu ctx create --secret-file``)
and derives each node's credential locally; the broker, which keeps only a signing key derived
from the same secret (never the secret), recomputes and compares. Both sides use these
functions, so they live in ``common`` (the contract between two services).

Wire format (HTTP Basic):

* user ``node/HOSTNAME/INSTANCE_ID`` — INSTANCE_ID is empty for a credential an operator issued
  for a machine EPU did not launch (the batch head node): ``node/head/``;
* password ``base64url(HMAC-SHA256(signing_key, "epu-ctx-node-v1\\n" CONTEXT_ID "\\n" HOSTNAME
  "\\n" INSTANCE_ID))`` without padding, where ``signing_key = HMAC-SHA256(context_secret,
  "epu-ctx-signing-v1")`` (hex).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
from dataclasses import dataclass

NODE_USER_PREFIX = "node/"
_LABEL = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
_INSTANCE = re.compile(r"^[A-Za-z0-9_.:-]{0,128}$")


@dataclass(frozen=True)
class NodeIdentity:
    """Who a node credential speaks for."""

    hostname: str
    instance_id: str
    """Empty for an operator-issued credential (a node EPU did not launch)."""


@dataclass(frozen=True)
class NodeCredential:
    key: str
    """The HTTP Basic user: ``node/HOSTNAME/INSTANCE_ID``."""
    secret: str

    @property
    def identity(self) -> NodeIdentity:
        parsed = parse_node_key(self.key)
        assert parsed is not None
        return parsed


def signing_key(context_secret: str) -> str:
    """The key the broker stores for a context: derived from its secret, one way."""
    return hmac.new(context_secret.encode("utf-8", "surrogatepass"), b"epu-ctx-signing-v1",
                    hashlib.sha256).hexdigest()


def short_hostname(name: str) -> str:
    """The host name a node registers with (first label, lowercase): what a credential binds."""
    return name.split(".", 1)[0].lower()


def node_key(hostname: str, instance_id: str | None) -> str:
    return f"{NODE_USER_PREFIX}{hostname}/{instance_id or ''}"


def parse_node_key(user: str) -> NodeIdentity | None:
    """The identity a node credential's user names, or None if ``user`` is not one."""
    if not user.startswith(NODE_USER_PREFIX):
        return None
    parts = user[len(NODE_USER_PREFIX):].split("/")
    if len(parts) != 2 or not _LABEL.match(parts[0]) or not _INSTANCE.match(parts[1]):
        return None
    return NodeIdentity(parts[0], parts[1])


def node_secret(signing: str, context_id: str, identity: NodeIdentity) -> str:
    msg = f"epu-ctx-node-v1\n{context_id}\n{identity.hostname}\n{identity.instance_id}".encode()
    digest = hmac.new(bytes.fromhex(signing), msg, hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def issue(signing: str, context_id: str, hostname: str, instance_id: str | None = None) -> NodeCredential:
    """The credential of ``hostname`` (short name) launched as ``instance_id`` in a context."""
    host = short_hostname(hostname)
    if not _LABEL.match(host):
        raise ValueError(f"{hostname!r} is not a host name a node can register (one RFC 1123 label)")
    if instance_id is not None and not _INSTANCE.match(instance_id):
        raise ValueError(f"{instance_id!r} is not an instance id")
    ident = NodeIdentity(host, instance_id or "")
    return NodeCredential(node_key(host, instance_id), node_secret(signing, context_id, ident))


def verify(signing: str, context_id: str, user: str, password: str) -> NodeIdentity | None:
    """The identity ``user``/``password`` prove, or None (constant-time compare)."""
    ident = parse_node_key(user)
    if ident is None or not signing:
        return None
    want = node_secret(signing, context_id, ident)
    ok = hmac.compare_digest(password.encode("utf-8", "surrogatepass"), want.encode())
    return ident if ok else None


def context_id_of(uri: str) -> str:
    """The context id at the end of a context URI (``https://host:port/v1/contexts/ID``)."""
    m = re.search(r"/v1/contexts/([A-Za-z0-9_-]{1,64})/?$", uri)
    if m is None:
        raise ValueError(f"{uri!r} is not a context URI (https://HOST:PORT/v1/contexts/ID)")
    return m.group(1)
