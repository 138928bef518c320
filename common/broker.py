"""Connections and publishing with confirms.

A ``Broker`` is where messages go: one or more broker URLs (failover: a RabbitMQ cluster's
nodes), TLS settings, message size limits, and a ``Topology``. ``Publisher`` turns a typed
message into an envelope and publishes it with publisher confirms, so that a ``publish()``
that returned means the broker has the message.

What a publish can end in, and why they are kept apart:

* confirmed: returned normally;
* refused (``PublishRefused``): the broker closed the channel over the message (406 too
  large, 403 no permission, 404 no such exchange), or — for a command, which is published
  ``mandatory`` — returned it because no queue is bound (``Unroutable``). Retrying would fail
  the same way, and the connection is fine: the caller is told at once;
* nacked: a queue could not take it now (a quorum queue electing a new leader after a node
  loss, a queue full with ``reject-publish``). Resent with backoff for up to
  ``Broker.nack_retry_seconds``, then ``PublishRefused`` marked ``transient`` (the runtime
  retries such a handler failure instead of dead-lettering the message);
* the broker is gone: the publisher reconnects (to the next URL of the list) and resends what
  was not confirmed, with the same message ids (at least once), up to ``PUBLISH_RETRY_POLICY``;
  then ``BrokerUnavailable``.

Only public py-amqp interfaces are used: ``confirm_select``, ``basic_publish`` (the plain,
non-waiting one: connections here are opened without ``confirm_publish``) and the channel's
``basic_ack``/``basic_nack``/``basic_return`` events. A keepalive thread services the
publisher connection's heartbeats while it is idle (reads the broker's, sends its own), so an
idle publisher is not dropped by the broker for missed heartbeats. Opening the confirm channel
has a deadline (``Broker.call_timeout``, ``common.stall``): a broker that keeps the connection but
never answers is left for a new connection, not waited on.
"""

from __future__ import annotations

import logging
import os
import ssl
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from amqp.exceptions import ChannelError, MessageNacked
from epu.common.codec import CONTENT_TYPE, packb
from epu.common.messages import Envelope, Message
from epu.common.senders import SenderPolicy
from epu.common.stall import CALL_TIMEOUT, bounded
from epu.common.topology import (
    DEAD_LETTER_EXCHANGE,
    DEFAULT_TOPOLOGY,
    MANDATORY_TYPES,
    Topology,
)
from kombu import Connection, Producer

log = logging.getLogger("epu.broker")

#: How hard a publish tries across a broker outage before giving up (seconds grow to interval_max).
PUBLISH_RETRY_POLICY = {"max_retries": 30, "interval_start": 0.2, "interval_step": 0.5, "interval_max": 3.0}

#: Frames larger than this are never negotiated (RabbitMQ's default); it also bounds how deep
#: AMQP headers can nest (see common.inbound).
FRAME_MAX = 131072


class PublishError(Exception):
    """A publish that did not end confirmed."""


class BrokerUnavailable(PublishError, ConnectionError):
    """No broker URL could be reached (or the retries across an outage ran out). ``causes``:
    how each URL failed (the exceptions), for ``permanent_reason``."""

    def __init__(self, message: str, causes: Sequence[BaseException] = ()) -> None:
        super().__init__(message)
        self.causes = tuple(causes)


class BrokerRefused(ConnectionError):
    """The broker keeps refusing this service for a reason retrying cannot mend (``kind``:
    authentication, permission, vhost, tls): the service gives up so its supervisor sees it."""

    def __init__(self, kind: str, detail: str, attempts: int) -> None:
        super().__init__(f"{kind} refused {attempts} times in a row: {detail}")
        self.kind = kind
        self.detail = detail


#: What each kind of permanent refusal asks the operator to fix.
PERMANENT_HINTS = {
    "authentication": "check the user name and password in [broker] url (or EPU_BROKER__URL)",
    "permission": "the user lacks a permission: load the definitions of deploy/rabbitmq (docs/deploy.md, step 3)",
    "vhost": "the virtual host in [broker] url does not exist: create it or load the definitions",
    "tls": "a certificate or key of [broker.tls] cannot be read or is not valid",
}


def permanent_reason(exc: BaseException) -> str | None:
    """The kind of a broker error that retrying cannot mend — ``authentication`` (login
    refused), ``permission`` (access to the vhost or an entity refused), ``vhost`` (no such
    virtual host), ``tls`` (a certificate file that cannot be read, or is refused) — or None for
    a transient one (refused connection, timeout, a node restarting). A failure over several
    URLs is permanent only when every URL failed permanently (one node down is transient)."""
    import ssl

    from amqp import exceptions as amqp_exc

    if isinstance(exc, BrokerUnavailable):
        kinds = [permanent_reason(c) for c in exc.causes]
        return kinds[0] if kinds and all(kinds) else None
    cause = exc.__cause__ if exc.__cause__ is not None and type(exc).__module__.startswith("kombu") else exc
    if isinstance(cause, amqp_exc.AccessRefused):
        return "authentication" if "login" in str(cause).lower() else "permission"
    if isinstance(cause, amqp_exc.NotAllowed):
        return "vhost" if "not found" in str(cause).lower() else "permission"
    if isinstance(cause, ssl.SSLCertVerificationError):
        return "tls"
    if isinstance(cause, ssl.SSLError):
        text = str(cause)
        return "tls" if any(k in text for k in ("PEM", "NO_CERTIFICATE", "KEY_VALUES_MISMATCH", "CA_MD")) else None
    if isinstance(cause, FileNotFoundError | PermissionError | IsADirectoryError):
        return "tls"  # the only files a connection reads are the TLS ones
    return None


class PublishRefused(PublishError, MessageNacked):
    """The broker refused some messages of a publish (nack, channel closed over a message, or
    returned as unroutable). ``refused`` maps each refused message id to the reason; every
    other message of the publish was confirmed."""

    def __init__(self, message: str, refused: dict[str, str], transient: bool = False) -> None:
        super().__init__(message)
        self.refused = refused
        self.transient = transient
        """True when every refusal was a nack (the queue may take it later)."""


class Unroutable(PublishRefused):
    """A mandatory message (a command, a dead letter) that no queue was bound to receive."""


@dataclass(frozen=True)
class TlsSettings:
    """TLS for ``amqps://`` URLs. Verification is on unless turned off explicitly."""

    verify: bool = True
    """Check the broker's certificate chain and its name. Off only for a lab."""
    ca_file: str | None = None
    """CA bundle that signed the broker's certificate (default: the system's)."""
    cert_file: str | None = None
    """Client certificate (for brokers that require one, e.g. EXTERNAL auth)."""
    key_file: str | None = None
    """Private key of ``cert_file``."""
    server_name: str | None = None
    """Name to expect in the broker's certificate (default: each URL's host)."""

    def check_files(self) -> None:
        """Open each file given, so one that cannot be read fails naming itself (``ssl`` raises
        "No such file or directory" without a file name)."""
        for path in (self.ca_file, self.cert_file, self.key_file):
            if path:
                with open(path, "rb"):
                    pass

    def sslopts(self, host: str) -> dict[str, Any]:
        """py-amqp's ``ssl`` options for a connection to ``host``."""
        opts: dict[str, Any] = {"cert_reqs": ssl.CERT_REQUIRED if self.verify else ssl.CERT_NONE}
        if self.verify:
            # with a server_hostname py-amqp turns check_hostname on (and sends SNI)
            opts["server_hostname"] = self.server_name or host
        if self.ca_file:
            opts["ca_certs"] = self.ca_file
        if self.cert_file:
            opts["certfile"] = self.cert_file
            opts["keyfile"] = self.key_file
        return opts


@dataclass(frozen=True)
class MessageLimits:
    """What a consumer accepts from the wire before it even decodes (common.inbound)."""

    max_body_bytes: int = 16 * 1024 * 1024
    """Largest message body taken (RabbitMQ 4 refuses larger messages by default)."""
    max_inflated_bytes: int = 16 * 1024 * 1024
    """Largest body after decompression (a compression bomb stops here)."""


class _Failover:
    """Which URL of the list worked last (mutable state of an otherwise frozen Broker)."""

    def __init__(self) -> None:
        self.index = 0
        self.lock = threading.Lock()


def redact(url: str) -> str:
    """The URL without its password, for logs."""
    if "@" not in url or "://" not in url:
        return url
    scheme, rest = url.split("://", 1)
    creds, host = rest.rsplit("@", 1)
    user = creds.split(":", 1)[0]
    return f"{scheme}://{user}:***@{host}"


@dataclass(frozen=True)
class Broker:
    url: str | tuple[str, ...] | list[str] = "memory://"
    """One URL, or several (the nodes of a cluster): connections fail over between them."""
    topology: Topology = DEFAULT_TOPOLOGY
    heartbeat: int = 30
    declare: bool = True
    """Declare exchanges and queues at start. False where deploy/rabbitmq's definitions are
    loaded and service users have no configure permission (least privilege)."""
    transport_options: dict[str, Any] = field(default_factory=dict)
    tls: TlsSettings = field(default_factory=TlsSettings)
    limits: MessageLimits = field(default_factory=MessageLimits)
    connect_timeout: float = 5.0
    confirm_timeout: float = 30.0
    """How long a publish waits for the broker's confirms before taking the connection for dead."""
    nack_retry_seconds: float = 15.0
    """How long nacked messages are resent (with backoff) before the publish fails."""
    call_timeout: float = CALL_TIMEOUT
    """How long a synchronous call (channel.open, queue.declare, basic.consume, basic.cancel,
    confirm.select) may go unanswered before its connection is broken and replaced (``common.stall``;
    0: wait for ever, as py-amqp does)."""
    senders: SenderPolicy = field(default_factory=SenderPolicy)
    """How consumers bind each inbound message to the sender allowed to send it (common.senders)."""
    _failover: _Failover = field(default_factory=_Failover, compare=False, repr=False)

    @property
    def urls(self) -> tuple[str, ...]:
        if isinstance(self.url, str):
            return tuple(u.strip() for u in self.url.split(";") if u.strip()) or ("memory://",)
        return tuple(self.url)

    @property
    def is_memory(self) -> bool:
        return self.urls[0].startswith("memory://")

    @property
    def current_url(self) -> str:
        return self.urls[self._failover.index % len(self.urls)]

    def _connection_for(self, url: str, name: str | None = None) -> Connection:
        opts = dict(self.transport_options)
        if url.startswith("memory://"):
            opts.setdefault("polling_interval", 0.02)
            return Connection(url, heartbeat=0, transport_options=opts)
        # confirms are done by Publisher itself (public API); a channel must not wait per publish
        opts.pop("confirm_publish", None)
        if name:  # shown by rabbitmqctl list_connections / the management UI: who is who
            opts["client_properties"] = {**opts.get("client_properties", {}), "connection_name": name}
        kwargs: dict[str, Any] = {}
        if url.startswith("amqps://"):
            kwargs["ssl"] = self.tls.sslopts(urlsplit(url).hostname or "")
        return Connection(url, heartbeat=self.heartbeat, transport_options={"frame_max": FRAME_MAX, **opts},
                          connect_timeout=self.connect_timeout, **kwargs)

    def connection(self, name: str | None = None) -> Connection:
        """A connected Connection to the first URL that answers, starting with the last good one.
        Raises ``BrokerUnavailable`` naming every URL tried and why (passwords redacted).
        ``name`` is the connection's name on the broker (``rabbitmqctl list_connections name``)."""
        if self.is_memory:
            return self._connection_for(self.urls[0])
        urls = self.urls
        start = self._failover.index
        errors = []
        causes: list[BaseException] = []
        for step in range(len(urls)):
            i = (start + step) % len(urls)
            try:
                if urls[i].startswith("amqps://"):
                    self.tls.check_files()
            except OSError as exc:
                errors.append(f"{redact(urls[i])}: {type(exc).__name__}: {exc}")
                causes.append(exc)
                continue
            conn = self._connection_for(urls[i], name)
            try:
                # one attempt, no sleep (kombu's connect() sleeps 2 s and retries): the next URL is
                # tried at once, and the caller's own backoff paces rounds over the whole list
                conn.ensure_connection(max_retries=0, reraise_as_library_errors=False)
            except Exception as exc:  # refused, timeout, TLS, auth: try the next node
                errors.append(f"{redact(urls[i])}: {type(exc).__name__}: {exc}")
                causes.append(exc)
                try:
                    conn.release()
                except Exception:
                    pass
                continue
            with self._failover.lock:
                self._failover.index = i
            return conn
        with self._failover.lock:  # next time start with the one after
            self._failover.index = (start + 1) % len(urls)
        raise BrokerUnavailable("cannot reach the broker: " + "; ".join(errors), causes)

    def redacted_url(self) -> str:
        """The URL(s) without passwords, for logs and health."""
        return ";".join(redact(u) for u in self.urls)

    def is_confirming(self) -> bool:
        return not self.is_memory and self.transport_options.get("confirm_publish", True)


@dataclass
class Outgoing:
    """One message to publish: bytes and AMQP properties."""

    body: bytes
    exchange: str
    routing_key: str
    properties: dict[str, Any]
    headers: dict[str, Any]
    mandatory: bool = False

    @property
    def message_id(self) -> str:
        return str(self.properties["message_id"])


class _Batch:
    """Confirm bookkeeping of one send on a confirm channel."""

    def __init__(self) -> None:
        self.tag_to_index: dict[int, int] = {}
        self.id_to_index: dict[str, int] = {}
        self.nacked: dict[int, str] = {}
        self.returned: dict[int, str] = {}
        self.settled: set[int] = set()

    def settle(self, tag: int, multiple: bool, ok: bool) -> None:
        tags = [t for t in self.tag_to_index if t <= tag] if multiple else [tag]
        for t in tags:
            i = self.tag_to_index.pop(t, None)
            if i is None:
                continue
            self.settled.add(i)
            if not ok:
                self.nacked[i] = "nacked by the broker (a queue refused it, e.g. full with overflow reject-publish)"


class Publisher:
    """Publishes typed messages as msgpack envelopes, with confirms, from any thread."""

    def __init__(self, broker: Broker, source: str, metrics: Any = None) -> None:
        self.broker = broker
        self.source = source
        self.metrics = metrics
        self._lock = threading.RLock()
        self._conn: Connection | None = None
        self._channel: Any = None
        self._next_tag = 1
        self._batch: _Batch | None = None
        self._keepalive: threading.Thread | None = None
        self._closed = threading.Event()
        self.expire_after: dict[str, float] = {}
        """Message type → seconds a message of it may wait in a queue before the broker drops it
        (AMQP ``expiration``, by the broker's clock): a sensor's snapshot that no engine took within
        the active window says nothing any more (services/decision/snaporder.py)."""

    # ------------------------------------------------------------------ typed messages
    def publish(self, message: Message, correlation_id: str | None = None, *,
                message_id: str | None = None, timestamp: float | None = None) -> Envelope:
        envelope = Envelope.wrap(message, self.source, correlation_id, timestamp=timestamp, message_id=message_id)
        self._send([self._outgoing(message, envelope, correlation_id)])
        self._count([envelope])
        return envelope

    def publish_many(self, messages: Sequence[Message], correlation_id: str | None = None, *,
                     timestamp: float | None = None) -> list[Envelope]:
        """Publish a batch; return once the broker has confirmed every message of it.

        Why: waiting one confirm round trip per message caps a publisher at a few hundred
        messages a second; the engine's burst of launches and node commands is sent in one go
        and confirmed together (RabbitMQ acks many delivery tags at once). On a connection
        loss the unconfirmed rest is resent on a new connection with the same message ids: at
        least once, exactly as ``publish()``. Messages the broker refuses raise
        ``PublishRefused`` after the rest are confirmed."""
        envelopes = [Envelope.wrap(m, self.source, correlation_id, timestamp=timestamp) for m in messages]
        if not envelopes:
            return []
        self._send([self._outgoing(m, e, correlation_id) for m, e in zip(messages, envelopes, strict=True)])
        self._count(envelopes)
        return envelopes

    def _outgoing(self, message: Message, envelope: Envelope, correlation_id: str | None) -> Outgoing:
        topo = self.broker.topology
        props: dict[str, Any] = {"delivery_mode": 2, "message_id": envelope.id, "type": envelope.type,
                                 "content_type": CONTENT_TYPE, "content_encoding": "binary"}
        if correlation_id:
            props["correlation_id"] = correlation_id
        ttl = self.expire_after.get(envelope.type)
        if ttl is not None:
            props["expiration"] = str(max(1, int(ttl * 1000)))  # milliseconds, as AMQP says
        return Outgoing(packb(envelope.model_dump(mode="python")), topo.exchange_for(message).name,
                        message.routing_key(), props, {}, mandatory=envelope.type in MANDATORY_TYPES)

    def _count(self, envelopes: list[Envelope]) -> None:
        if self.metrics is not None:
            for env in envelopes:
                self.metrics.published.labels(env.type).inc()

    def publish_raw(self, body: Any, exchange: str, routing_key: str, *, headers: dict[str, Any] | None = None,
                    message_id: str | None = None, type_: str | None = None,
                    correlation_id: str | None = None, content_type: str | None = None,
                    content_encoding: str | None = None, mandatory: bool = False,
                    user_id: str | None | bool = True) -> None:
        """Publish ``body`` (raw bytes with ``content_type``, or an object to msgpack-encode)
        exactly as given: dead letters and tests that must send what a foreign client would.
        ``user_id``: True (default) sets the connection's user, as every publish does; a name sets
        that one (RabbitMQ refuses it unless it is the connection's user or that user has the
        ``impersonator`` tag: ``epu dead requeue`` keeps a letter's sender so); None sets none."""
        if isinstance(body, bytes | bytearray):
            payload = bytes(body)
            ctype = content_type or "application/octet-stream"
            cenc = content_encoding or "binary"
        else:
            payload, ctype, cenc = packb(body), CONTENT_TYPE, "binary"
        props: dict[str, Any] = {"delivery_mode": 2, "message_id": message_id or uuid.uuid4().hex,
                                 "content_type": ctype, "content_encoding": cenc}
        if type_:
            props["type"] = type_
        if correlation_id:
            props["correlation_id"] = correlation_id
        if user_id is not True:
            props["user_id"] = user_id if isinstance(user_id, str) and user_id else None
        self._send([Outgoing(payload, exchange, routing_key, props, dict(headers or {}), mandatory)])

    def dead_letter_exchange(self) -> str:
        return self.broker.topology.n(DEAD_LETTER_EXCHANGE)

    # ------------------------------------------------------------------ sending
    def _send(self, items: list[Outgoing]) -> None:
        if not self.broker.is_confirming():
            self._send_unconfirmed(items)
            return
        pending = list(range(len(items)))
        refused: dict[int, str] = {}
        nacked: dict[int, str] = {}
        returned: dict[int, str] = {}
        one_by_one = False
        policy = PUBLISH_RETRY_POLICY
        interval = float(policy["interval_start"])
        failures = 0
        nacked_since: float | None = None
        with self._lock:
            while pending:
                chunk = pending[:1] if one_by_one else pending
                batch = _Batch()
                try:
                    self._send_confirmed(items, chunk, batch)
                except ChannelError as exc:
                    # the broker closed the channel over a message: refused, the connection is fine
                    self._channel = None
                    self._take(batch, pending, nacked, returned)
                    if len(chunk) == 1 and chunk[0] in pending:
                        refused[chunk[0]] = f"{type(exc).__name__}: {exc}"
                        pending.remove(chunk[0])
                    else:
                        one_by_one = True  # find which one, resending the rest singly
                    continue
                except Exception as exc:  # the connection is gone (or wedged): reconnect, resend the rest
                    self._take(batch, pending, nacked, returned)
                    failures += 1
                    self._drop_connection()
                    if failures > policy["max_retries"]:
                        raise BrokerUnavailable(f"publish failed {failures} times, last: {type(exc).__name__}: "
                                                f"{exc}") from exc
                    self._on_error(exc, interval)
                    if self._closed.wait(interval):
                        raise BrokerUnavailable("publisher closed while retrying") from exc
                    interval = min(interval + policy["interval_step"], policy["interval_max"])
                    continue
                batch.settled.update(chunk)
                self._take(batch, pending, nacked, returned)
                if nacked and not pending:
                    nacked_since = nacked_since or time.monotonic()
                    if time.monotonic() - nacked_since < self.broker.nack_retry_seconds:
                        log.info("publish nacked, resending", extra={"messages": len(nacked), "retry_in": interval})
                        pending = sorted(nacked)
                        nacked.clear()
                        if self._closed.wait(interval):
                            raise BrokerUnavailable("publisher closed while retrying")
                        interval = min(interval + policy["interval_step"], policy["interval_max"])
        refused.update({i: why for i, why in nacked.items() if i not in refused})
        if refused or returned:
            why = {items[i].message_id: r for i, r in {**refused, **returned}.items()}
            cls = Unroutable if returned and not refused else PublishRefused
            raise cls(f"broker refused {len(why)} of {len(items)} messages: "
                      + ", ".join(f"{mid} ({r})" for mid, r in list(why.items())[:10]), why,
                      transient=bool(nacked) and len(nacked) == len(why))

    @staticmethod
    def _take(batch: _Batch, pending: list[int], nacked: dict[int, str], returned: dict[int, str]) -> None:
        """Move what ``batch`` settled out of ``pending`` (so a resend sends only the rest)."""
        nacked.update(batch.nacked)
        returned.update(batch.returned)
        pending[:] = [i for i in pending if i not in batch.settled]

    def _send_confirmed(self, items: list[Outgoing], chunk: list[int], batch: _Batch) -> None:
        """Publish ``items[chunk]`` on the confirm channel and wait until each is settled."""
        channel = self._confirm_channel()
        assert self._conn is not None
        user = self._conn.userid if isinstance(self._conn.userid, str) else None
        self._batch = batch
        try:
            for i in chunk:
                it = items[i]
                batch.tag_to_index[self._next_tag] = i
                batch.id_to_index[it.message_id] = i
                self._next_tag += 1
                props = {k: v for k, v in it.properties.items() if k not in ("content_type", "content_encoding")}
                if "user_id" in props:  # chosen by ``publish_raw``: kept (None: none)
                    if props["user_id"] is None:
                        del props["user_id"]
                elif user:  # RabbitMQ checks it is this connection's user: receivers may trust it
                    props["user_id"] = user
                msg = channel.prepare_message(it.body, content_type=it.properties.get("content_type"),
                                              content_encoding=it.properties.get("content_encoding"),
                                              headers=it.headers, properties=props)
                channel.basic_publish(msg, exchange=it.exchange, routing_key=it.routing_key,
                                      mandatory=it.mandatory)
            deadline = time.monotonic() + self.broker.confirm_timeout
            while batch.tag_to_index:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"{len(batch.tag_to_index)} publishes unconfirmed after "
                                       f"{self.broker.confirm_timeout}s")
                try:
                    self._conn.drain_events(timeout=min(left, 1.0))
                except TimeoutError:
                    pass
        finally:
            self._batch = None

    def _confirm_channel(self) -> Any:
        if self._conn is None:
            self._conn = self.broker.connection(name=f"epu {self.source} publisher (pid {os.getpid()})")
            self._start_keepalive()
        if self._channel is None:
            stalls = getattr(self.metrics, "broker_stalls", None)
            on_stall = (lambda _what: stalls.inc()) if stalls is not None else None
            with bounded(self._conn, self.broker.call_timeout, "channel.open and confirm.select", on_stall):
                channel = self._conn.channel()
                channel.confirm_select()
            channel.events["basic_ack"].add(lambda tag, multiple: self._settle(tag, multiple, True))
            channel.events["basic_nack"].add(lambda tag, multiple: self._settle(tag, multiple, False))
            channel.events["basic_return"].add(self._on_return)
            self._channel = channel
            self._next_tag = 1  # delivery tags count from 1 on a new confirm channel
        return self._channel

    def _settle(self, tag: int, multiple: bool, ok: bool) -> None:
        if self._batch is not None:
            self._batch.settle(tag, multiple, ok)

    def _on_return(self, exc: Exception, exchange: str, routing_key: str, message: Any) -> None:
        # RabbitMQ sends basic.return before the basic.ack of the same message
        batch = self._batch
        mid = (getattr(message, "properties", None) or {}).get("message_id")
        if batch is not None and mid in batch.id_to_index:
            batch.returned[batch.id_to_index[mid]] = (f"unroutable: no queue bound to {exchange!r} with key "
                                                      f"{routing_key!r} ({exc})")

    def _send_unconfirmed(self, items: list[Outgoing]) -> None:
        """memory:// (and the fire-and-forget benchmark baseline): publish, nothing to wait for."""
        with self._lock:
            for attempt in range(3):
                try:
                    if self._conn is None:
                        self._conn = self.broker.connection()
                    producer = Producer(self._conn)
                    for it in items:
                        props = {k: v for k, v in it.properties.items() if k not in ("content_type", "content_encoding")}
                        if props.get("user_id", "") is None:
                            del props["user_id"]
                        if "expiration" in props:  # kombu's Producer takes seconds
                            props["expiration"] = int(props["expiration"]) / 1000
                        producer.publish(it.body, exchange=it.exchange, routing_key=it.routing_key,
                                         content_type=it.properties.get("content_type", CONTENT_TYPE),
                                         content_encoding=it.properties.get("content_encoding", "binary"),
                                         headers=it.headers, **props)
                    return
                except Exception as exc:
                    self._drop_connection()
                    if attempt == 2:
                        raise BrokerUnavailable(f"publish failed: {type(exc).__name__}: {exc}") from exc
                    time.sleep(0.2)

    # ------------------------------------------------------------------ connection upkeep
    def _start_keepalive(self) -> None:
        if self.broker.is_memory or not self.broker.heartbeat:
            return
        if self._keepalive is not None and self._keepalive.is_alive():
            return
        self._keepalive = threading.Thread(target=self._keep_alive, name=f"publisher-heartbeat-{self.source}",
                                           daemon=True)
        self._keepalive.start()

    def _keep_alive(self) -> None:
        """Read the broker's heartbeats and send ours while the publisher is idle."""
        period = max(0.2, self.broker.heartbeat / 4)
        while not self._closed.wait(period):
            with self._lock:
                conn = self._conn
                if conn is None:
                    continue
                try:
                    try:
                        conn.drain_events(timeout=0.01)
                    except TimeoutError:
                        pass
                    conn.heartbeat_check()
                except Exception as exc:  # dead: the next publish reconnects
                    log.info("publisher connection lost while idle", extra={"error": f"{type(exc).__name__}: {exc}"})
                    self._drop_connection()

    def _drop_connection(self) -> None:
        if self._conn is not None:
            try:
                self._conn.release()
            except Exception:
                pass
        self._conn = None
        self._channel = None

    def _on_error(self, exc: BaseException, interval: float) -> None:
        log.warning("publish failed, retrying", extra={"error": f"{type(exc).__name__}: {exc}",
                                                      "retry_in": interval,
                                                      "broker": self.broker.redacted_url()})

    def interrupt(self) -> None:
        """Make a publish that is retrying across an outage give up now (BrokerUnavailable);
        from any thread, without waiting for the publish lock. Used when the owner is stopping."""
        self._closed.set()

    def close(self) -> None:
        self._closed.set()
        with self._lock:
            self._drop_connection()
