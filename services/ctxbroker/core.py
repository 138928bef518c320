"""The context broker's functional core: node validation and the ordered list of joins/leaves.

No I/O here. The HTTP adapter validates requests with these models, the SQL store asks
``next_entry`` whether a join or leave changes anything, and the agent folds entries with
``apply_entry``. Keeping one reducer for broker and agent is what makes "every agent converges
on the same ordered membership" a property of this module, testable without a network.

The list, as in the paper: each context has entries numbered 1, 2, 3, ...; id 0 means "no
updates" (nothing applied yet). An agent that applied id N asks for the entries after N and
applies them in order.

Beyond the paper, the history is compacted: a new agent (or one further behind than the
membership is long, or behind the oldest entry kept) is answered with a *snapshot*, the
current members as one batch of joins at the newest id, and follows the entries after it.
Replaying 6,000 joins and leaves of 3,000 long-gone workers is what made a new node take
minutes to become current (``answer_kind``).

Who may write (``authorize_join``/``authorize_leave``): a node, with its own credential
(``epu.common.nodecred``), only as itself; the context's shared key and secret only read.
What a node may publish: only its own names (``check_names``) and its own address
(``check_address``: the one the provisioner reports for its instance, never one another
member holds), since every agent writes them into /etc/hosts and ssh_known_hosts.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import ipaddress
import re
import secrets
import struct
from dataclasses import dataclass
from typing import Annotated, Literal

from epu.common.nodecred import NodeIdentity
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints

#: RFC 1123 label: the short host name.
LABEL_RE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?$")
FQDN_RE = re.compile(r"^([A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\.?$")
SSH_KEY_TYPES = frozenset({
    "ssh-ed25519", "ssh-rsa", "ssh-dss", "ecdsa-sha2-nistp256", "ecdsa-sha2-nistp384",
    "ecdsa-sha2-nistp521", "sk-ssh-ed25519@openssh.com", "sk-ecdsa-sha2-nistp256@openssh.com",
})
MAX_SSH_KEY = 8192
MAX_DATA = 16384
#: Longest long-poll a client may ask for; longer waits only tie up connections behind proxies.
MAX_WAIT_SECONDS = 60.0
CONTEXT_ID_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def _short_hostname(value: str) -> str:
    if not LABEL_RE.match(value):
        raise ValueError("hostname must be one RFC 1123 label: letters, digits, '-', at most 63 characters, "
                         "not starting or ending with '-'")
    return value.lower()


def _fqdn(value: str) -> str:
    if len(value) > 253 or not FQDN_RE.match(value):
        raise ValueError("fqdn must be an RFC 1123 host name (dot-separated labels, at most 253 characters)")
    return value.rstrip(".").lower()


def _ip(value: str) -> str:
    try:
        return str(ipaddress.ip_address(value))
    except ValueError:
        raise ValueError("ip must be an IPv4 or IPv6 address") from None


def parse_ssh_key(value: str) -> str:
    """Validate an OpenSSH public host key line (``TYPE BASE64 [comment]``); return ``TYPE BASE64``.

    Why decode the blob: a key line is copied into every node's ssh_known_hosts, so garbage
    here would break SSH cluster-wide. The blob must start with its own type, length-prefixed.
    The comment is dropped: it is free text we do not want in known_hosts.
    """
    parts = value.strip().split()
    if len(parts) < 2:
        raise ValueError("ssh_host_key must be 'TYPE BASE64 [comment]'")
    kind, b64 = parts[0], parts[1]
    if kind not in SSH_KEY_TYPES:
        raise ValueError(f"ssh_host_key type must be one of {', '.join(sorted(SSH_KEY_TYPES))}")
    try:
        blob = base64.b64decode(b64, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("ssh_host_key blob is not valid base64") from None
    if len(blob) < 4:
        raise ValueError("ssh_host_key blob is too short")
    (n,) = struct.unpack(">I", blob[:4])
    if blob[4:4 + n] != kind.encode():
        raise ValueError("ssh_host_key blob does not match its key type")
    return f"{kind} {b64}"


def _data(value: str) -> str:
    if "\x00" in value:
        raise ValueError("data must not contain NUL characters")
    return value


ShortHostname = Annotated[str, StringConstraints(min_length=1, max_length=63), AfterValidator(_short_hostname)]
Fqdn = Annotated[str, StringConstraints(min_length=1, max_length=254), AfterValidator(_fqdn)]
IpAddress = Annotated[str, StringConstraints(min_length=2, max_length=45), AfterValidator(_ip)]
SshKey = Annotated[str, StringConstraints(min_length=10, max_length=MAX_SSH_KEY), AfterValidator(parse_ssh_key)]
Data = Annotated[str, StringConstraints(max_length=MAX_DATA), AfterValidator(_data)]
InstanceId = Annotated[str, StringConstraints(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.:-]+$")]
ContextName = Annotated[str, StringConstraints(min_length=1, max_length=63, pattern=r"^[a-z0-9][a-z0-9_-]{0,62}$")]


class NodeFields(BaseModel):
    """What a node tells the broker about itself when it joins."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    hostname: ShortHostname = Field(description="short host name (one RFC 1123 label)", examples=["wn-1"])
    fqdn: Fqdn = Field(description="fully qualified domain name", examples=["wn-1.cluster.example.org"])
    ip: IpAddress = Field(description="IPv4 or IPv6 address other nodes reach it at", examples=["10.0.0.5"])
    ssh_host_key: SshKey = Field(description="OpenSSH public host key line: TYPE BASE64 [comment]")
    data: Data = Field("", description="free text the administrator's scripts may use (e.g. 'slots=4')")
    instance_id: InstanceId | None = Field(
        None, description="the provisioner's instance id, so the broker can remove the node when the "
                          "instance is reported terminated even if its agent never said goodbye")


EntryKind = Literal["join", "leave"]


@dataclass(frozen=True)
class Entry:
    """One item of a context's ordered list."""

    entry_id: int
    kind: EntryKind
    hostname: str
    fqdn: str = ""
    ip: str = ""
    ssh_host_key: str = ""
    data: str = ""
    instance_id: str | None = None
    reason: str = ""
    at: float = 0.0

    def node(self) -> NodeFields | None:
        if self.kind != "join":
            return None
        return NodeFields.model_construct(hostname=self.hostname, fqdn=self.fqdn, ip=self.ip,
                                          ssh_host_key=self.ssh_host_key, data=self.data,
                                          instance_id=self.instance_id)

    def as_dict(self) -> dict[str, object]:
        return {"id": self.entry_id, "kind": self.kind, "hostname": self.hostname, "fqdn": self.fqdn,
                "ip": self.ip, "ssh_host_key": self.ssh_host_key, "data": self.data,
                "instance_id": self.instance_id, "reason": self.reason, "at": self.at}


Members = dict[str, NodeFields]


def next_entry(current: NodeFields | None, kind: EntryKind, node: NodeFields | None) -> bool:
    """Does a join (``node``) or a leave change the membership whose entry for this host is ``current``?

    Idempotence is what lets an agent re-register after a restart, and a terminated-instance
    event arrive after the agent already left, without adding entries every node would apply.
    """
    if kind == "join":
        return current is None or current != node
    return current is not None


def apply_entry(members: Members, entry: Entry) -> Members:
    """The membership after ``entry`` (a new dict; ``members`` is not changed)."""
    out = dict(members)
    node = entry.node()
    if node is not None:
        out[entry.hostname] = node
    else:
        out.pop(entry.hostname, None)
    return out


def fold(entries: list[Entry], members: Members | None = None) -> Members:
    result: Members = dict(members or {})
    for e in entries:
        result = apply_entry(result, e)
    return result


def entries_after(entries: list[Entry], after: int) -> list[Entry]:
    """The entries with id > ``after``, in order (``entries`` is sorted by id and dense: a
    compacted context keeps a tail ``first..last`` of its list)."""
    if not entries or after < entries[0].entry_id:
        return list(entries)
    first = entries[0].entry_id
    if entries[-1].entry_id - first == len(entries) - 1:
        return entries[after - first + 1:]
    return [e for e in entries if e.entry_id > after]


AnswerKind = Literal["none", "entries", "snapshot"]


def answer_kind(after: int, last_id: int, horizon: int, members: int) -> AnswerKind:
    """What to send an agent that applied everything up to ``after``.

    ``horizon``: entries up to this id were compacted away; ``members``: how many nodes the
    context has now. A snapshot is sent when the agent starts from nothing, when the entries
    it needs are gone, or when replaying them would take more steps than the membership has
    nodes (a snapshot is then the shorter way to the same state).
    """
    if after >= last_id:
        return "none"
    if after == 0 or after < horizon or last_id - after > members:
        return "snapshot"
    return "entries"


# --------------------------------------------------------------------------- who may write


class Forbidden(Exception):
    """A valid credential asking for something it may not do (HTTP 403)."""


@dataclass(frozen=True)
class Caller:
    """Who made a request: the administrator, a holder of the context's own key and secret
    (the operator, the provisioner), or one node with its own credential."""

    kind: Literal["admin", "context", "node"]
    node: NodeIdentity | None = None


def authorize_join(caller: Caller, node: NodeFields, domain: str = "") -> NodeFields:
    """The node fields to store for this join, or ``Forbidden``.

    A node joins only as the host and instance its credential names; an omitted
    ``instance_id`` is filled from the credential, so the broker can remove the node when the
    instance is reported gone. Its ``fqdn`` must be a name of that host too
    (``check_names``); its ``ip`` is checked against what the provisioner reported, in the
    store's transaction (``check_address``)."""
    if caller.kind != "node" or caller.node is None:
        raise Forbidden("only a node's own credential can join (the context key and secret only read; "
                        "issue one per node: the provisioner does at launch, or `epu ctx credential`)")
    ident = caller.node
    if node.hostname != ident.hostname:
        raise Forbidden(f"this credential is for host {ident.hostname!r}, not {node.hostname!r}")
    want = ident.instance_id or None
    if node.instance_id is not None and node.instance_id != want:
        raise Forbidden(f"this credential is for instance {want!r}, not {node.instance_id!r}")
    if node.instance_id is None and want is not None:
        node = node.model_copy(update={"instance_id": want})
    check_names(node, domain)
    return node


def check_names(node: NodeFields, domain: str = "") -> None:
    """``Forbidden`` unless every name ``node`` publishes is its own host's.

    Why: every agent writes a member's ``fqdn`` into ``/etc/hosts`` and ``ssh_known_hosts``.
    With the fqdn free, a worker's credential (readable by any job on it) could join as itself
    with ``fqdn="head"`` or ``"head.cluster.example.org"`` and every node would resolve the
    head's names to it and trust its SSH key for them. So the fqdn is the host name itself,
    or the host name under the context's ``domain`` (when the context has one; without one, any
    name whose first label is the host name: no other member can hold that label)."""
    fqdn, host = node.fqdn, node.hostname
    if fqdn == host:
        return
    if domain:
        if fqdn != f"{host}.{domain}":
            raise Forbidden(f"fqdn {fqdn!r} is not this host's name: a node of this context may publish "
                            f"only {host!r} or {host + '.' + domain!r}")
    elif fqdn.split(".", 1)[0] != host:
        raise Forbidden(f"fqdn {fqdn!r} is not this host's name: its first label must be {host!r}")


def is_shared_address(ip: str) -> bool:
    """A loopback address names every host's own self, so two members may publish it (the
    process site runs every node on one machine and reports 127.0.0.1 for each): it cannot
    point any other node at the publisher."""
    return ipaddress.ip_address(ip).is_loopback


class AddressUnknown(Exception):
    """The provisioner has not yet reported this instance's address: the join is held (HTTP
    503 with ``Retry-After``; the agent retries) rather than trusted or refused."""


@dataclass(frozen=True)
class AddressFacts:
    """What the store knows that bears on the address a joining node publishes."""

    instance_ip: str | None = None
    """The joining instance's address as the provisioner reported it (None: not reported yet)."""
    member_holding: str | None = None
    """Another member of the context (host name) that holds the same address, if any."""
    instance_holding: str | None = None
    """Another live instance the provisioner reported at that address, if any."""


def check_address(node: NodeFields, facts: AddressFacts) -> None:
    """``Forbidden`` (or ``AddressUnknown``) unless ``node.ip`` is its own.

    * A node launched by EPU (its credential names an instance) publishes exactly the address
      the provisioner reported for that instance; until one is reported the join waits.
    * A node EPU did not launch (the batch head, a static worker: operator-issued credential)
      may not publish an address the provisioner reports for a live instance.
    * No member may publish an address another member holds (loopback excepted,
      ``is_shared_address``): one address, one host key in every node's known_hosts.
    """
    shared = is_shared_address(node.ip)
    if node.instance_id:
        if facts.instance_ip is None:
            raise AddressUnknown(f"the provisioner has not reported the address of instance "
                                 f"{node.instance_id} yet; the join is accepted once it has (retry)")
        if node.ip != facts.instance_ip:
            raise Forbidden(f"ip {node.ip} is not this instance's address: the provisioner reports "
                            f"{facts.instance_ip} for {node.instance_id}")
    elif facts.instance_holding is not None and not shared:
        raise Forbidden(f"ip {node.ip} is the address of instance {facts.instance_holding}; "
                        "a node may publish only its own address")
    if facts.member_holding is not None and not shared:
        raise Forbidden(f"ip {node.ip} is held by member {facts.member_holding}; "
                        "a node may publish only its own address")


def authorize_leave(caller: Caller, hostname: str, current: NodeFields | None) -> None:
    """``Forbidden`` unless ``caller`` may remove ``hostname`` whose entry is ``current``.

    The administrator may remove any node. A node may remove only itself, and only while the
    entry is its own instance's: a credential of an earlier instance of the same name (a slot
    reused after a termination) cannot remove its successor."""
    if caller.kind == "admin":
        return
    if caller.kind != "node" or caller.node is None:
        raise Forbidden("only a node's own credential (or the admin token) can remove a node")
    ident = caller.node
    if hostname != ident.hostname:
        raise Forbidden(f"this credential is for host {ident.hostname!r}, not {hostname!r}")
    if current is not None and (current.instance_id or "") != ident.instance_id:
        raise Forbidden(f"{hostname} is now held by another instance; this credential cannot remove it")


# --------------------------------------------------------------------------- credentials


def new_context_id() -> str:
    return secrets.token_hex(8)


def new_key() -> str:
    return secrets.token_urlsafe(12)


def new_secret() -> str:
    """256 bits of randomness; stored only as a SHA-256 digest."""
    return secrets.token_urlsafe(32)


def hash_secret(secret: str) -> str:
    # a fast hash is right here: the secret is 256 random bits, not a guessable password
    return hashlib.sha256(secret.encode("utf-8", "surrogatepass")).hexdigest()


def check_credentials(key: str, secret: str, want_key: str, want_hash: str) -> bool:
    """Constant-time check of a context's key and secret (both compared, always)."""
    ok_key = hmac.compare_digest(key.encode("utf-8", "surrogatepass"), want_key.encode())
    ok_secret = hmac.compare_digest(hash_secret(secret).encode(), want_hash.encode())
    return ok_key & ok_secret
