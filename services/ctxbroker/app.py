"""``epu run ctxbroker``: the HTTPS server plus an AMQP consumer of instance states.

Why a consumer: an instance that dies never runs its agent's goodbye. The provisioner reports
it (``InstanceEvent`` terminated/failed, via ``topology.ctxbroker_spec()``); the broker then
revokes that instance's node credential and appends a leave for every member registered with
that ``instance_id``, so the rest of the cluster forgets it (and a late join from it is
refused). The same consumer records each live instance's address as the provisioner reports
it (``InstanceEvent`` of any state with an ``ip``, and the periodic ``InstanceReport``): a
node launched by EPU may publish only that address (``core.check_address``). Every join and
leave is also published as a ``ContextMembership`` event (from a
single background thread, so a slow or absent RabbitMQ never stalls an HTTP request).

One process, two halves, one fate: the consumer runs the shared runtime (``Service``, which
reconnects by itself) in a thread beside the HTTPS server. If that thread ever ends while the
process is not stopping, the broker would go half-dead (serving HTTPS while terminated
instances pile up unread), so the server is stopped and ``run`` exits non-zero for systemd to
restart the whole process. ``/healthz`` on the HTTPS port is 200 only while the consumer is
connected and looping.
"""

from __future__ import annotations

import ipaddress
import logging
import signal
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from epu.common.clock import Clock, RealClock
from epu.common.config import EpuConfig
from epu.common.messages import ContextMembership, Envelope, InstanceEvent, InstanceReport, Message
from epu.common.runtime import RuntimeSettings, Service
from epu.services.ctxbroker.core import Entry
from epu.services.ctxbroker.server import BrokerServer, ServerSettings, read_or_create_token
from epu.services.ctxbroker.store import Store

log = logging.getLogger("epu.ctxbroker")


def membership_message(context_id: str, entry: Entry) -> ContextMembership:
    return ContextMembership(context_id=context_id, entry_id=entry.entry_id, kind=entry.kind,
                             hostname=entry.hostname, fqdn=entry.fqdn, ip=entry.ip, reason=entry.reason,
                             at=entry.at)


def remove_instance(store: Store, instance_id: str, reason: str, *, seq: int = 0,
                    final: bool = True) -> list[tuple[str, Entry]]:
    """Revoke the instance's credential (for good when ``final``, terminated; until a reopening
    when failed: ``Store.revoke``), then leave every context its node is in. Idempotent: a
    repeated event adds nothing, and a failure a reopening undid (``seq`` not above it) removes
    nothing."""
    if store.revoke(instance_id, reason, seq=seq, final=final) == "stale":
        return []  # the failure a reopening undid: the node stays
    out = []
    for context_id, hostname in store.contexts_of_instance(instance_id):
        entry, _last = store.leave(context_id, hostname, reason)
        if entry is not None:
            out.append((context_id, entry))
    return out


def note_address(store: Store, event: InstanceEvent) -> bool:
    """Record a live instance's address from an event or a report entry (anything without an
    ``ip``, or not an IP address, changes nothing). Returns whether it changed."""
    if not event.ip or event.state in ("terminated", "failed"):
        return False
    try:
        ip = str(ipaddress.ip_address(event.ip))
    except ValueError:
        log.warning("instance event with an invalid address ignored", extra={"instance": event.instance_id})
        return False
    return store.note_instance(event.instance_id, ip, event.seq)


class InstanceFeed:
    """Applies the provisioner's instance events and report entries to the store.

    A ``terminated`` instance is gone for good: its credential revoked, its node out of every
    context. A ``failed`` one is too — until the provisioner reopens the launch (issue 33: the
    create took effect, its answer was lost, the retries ran out, and the cloud lists the node
    alive): an event with ``previous: failed`` and a live state, or any live report entry whose
    ``seq`` is above the failure's (a report carries no ``previous``; after a failure only a
    reopening moves a record on). Then its credential joins again, its address is noted again,
    and its agent's join — retried while refused — makes the peers list it. Never after a
    termination, never on an event older than the failure.

    Why remember: a report repeats every live instance and every recently ended one, every few
    seconds; without memory each entry costs queries that find nothing to do. What is cached is
    an instance terminated (never changes back), the ``seq`` of a failure and of a reopening, the
    highest live ``seq`` looked at (a store query only when an entry is newer: once per state
    change, not per report), an address (noted again when it or its ``seq`` moves); each cache is
    bounded: forgetting only costs a query."""

    MAX_REMEMBERED = 100_000

    def __init__(self, store: Store) -> None:
        self.store = store
        self._gone: set[str] = set()
        self._failed: dict[str, int] = {}
        """Instance → the ``seq`` of its failure (revoked until a reopening above it)."""
        self._live: dict[str, int] = {}
        """Instance → the highest live ``seq`` looked at (whether it reopened anything)."""
        self._reopened: dict[str, int] = {}
        """Instance → the ``seq`` of its reopening (a failure not above it is the one it undid)."""
        self._noted: dict[str, tuple[str, int]] = {}

    def apply(self, event: InstanceEvent) -> list[tuple[str, Entry]]:
        """The leaves it made (for a terminated or failed instance; none otherwise)."""
        iid = event.instance_id
        if iid in self._gone:
            return []
        if event.state in ("terminated", "failed"):
            final = event.state == "terminated"
            if not final and (event.seq <= self._failed.get(iid, -1) or event.seq <= self._reopened.get(iid, -1)):
                return []  # repeated, or the failure a reopening undid
            reason = f"instance {event.state}" + (f": {event.reason}" if event.reason else "")
            out = remove_instance(self.store, iid, reason, seq=event.seq, final=final)
            self._noted.pop(iid, None)
            if final:
                self._remember_gone(iid)
            else:
                self._remember(self._failed, iid, event.seq)
            return out
        failed = self._failed.get(iid)
        if failed is not None and event.seq <= failed:
            return []  # older than the failure: the failure stands
        if event.previous == "failed" or event.seq > self._live.get(iid, -1):
            announced = event.previous == "failed"
            if self.store.reopen(iid, event.seq, announced=announced):
                log.warning("a failed launch was reopened: its node may join again",
                            extra={"instance": iid, "state": event.state, "seq": event.seq})
                announced = True
                self._noted.pop(iid, None)  # its address went with the failure: noted again
            if announced:
                self._remember(self._reopened, iid, event.seq)
            self._failed.pop(iid, None)
            self._remember(self._live, iid, event.seq)
        if event.ip:
            last = self._noted.get(iid)
            if last is None or (last[0] != event.ip and event.seq >= last[1]) or event.seq > last[1]:
                note_address(self.store, event)
                if len(self._noted) >= self.MAX_REMEMBERED:
                    self._noted.clear()
                self._noted[iid] = (event.ip, event.seq)
        return []

    def _remember_gone(self, iid: str) -> None:
        self._noted.pop(iid, None)
        self._failed.pop(iid, None)
        self._live.pop(iid, None)
        self._reopened.pop(iid, None)
        if len(self._gone) >= self.MAX_REMEMBERED:
            self._gone.clear()
        self._gone.add(iid)

    def _remember(self, cache: dict[str, int], iid: str, seq: int) -> None:
        if len(cache) >= self.MAX_REMEMBERED:
            cache.clear()
        cache[iid] = max(seq, cache.get(iid, -1))


class CtxBrokerService:
    """A ``Runnable``: uvicorn in the calling thread, the kombu ``Service`` in another."""

    def __init__(self, server: BrokerServer, service: Service) -> None:
        self.server = server
        self.service = service
        self._publisher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ctx-publish")
        self._stopped = threading.Event()
        self._stopping = threading.Event()
        self.consumer_failure: str | None = None
        """Why the consumer thread ended while it should have run (None: it did not)."""
        self.feed = InstanceFeed(server.store)
        server.on_membership = self.announce
        server.health_probe = self.consumer_health
        service.consume(service.broker.topology.ctxbroker_spec(), self._on_instance,
                        types={InstanceEvent.TYPE, InstanceReport.TYPE})

    # ------------------------------------------------------------------ AMQP side
    def announce(self, context_id: str, entry: Entry) -> None:
        """Publish a ContextMembership event without blocking the caller."""
        msg = membership_message(context_id, entry)

        def publish() -> None:
            try:
                self.service.publish(msg)
            except Exception as exc:  # the entry is stored; the event is best effort
                log.warning("publishing membership event failed",
                            extra={"context": context_id, "error": f"{type(exc).__name__}: {exc}"})

        self._publisher.submit(publish)

    def _on_instance(self, message: Message, _envelope: Envelope) -> None:
        if isinstance(message, InstanceReport):
            for event in message.instances:  # anti-entropy: each entry as the event it summarizes
                self._on_event(event)
            return
        assert isinstance(message, InstanceEvent)
        self._on_event(message)

    def _on_event(self, message: InstanceEvent) -> None:
        for context_id, entry in self.feed.apply(message):
            log.info("node removed for a gone instance",
                     extra={"context": context_id, "hostname": entry.hostname,
                            "instance": message.instance_id})
            refreshed = self.server.hub.changed_threadsafe(context_id)
            if refreshed is not None:
                # announce (and ack) only once agents can read the leave
                refreshed.result(timeout=10)
            # published from this (consumer) thread: the message is acked after the event is out
            self.service.publish(membership_message(context_id, entry))

    def consumer_health(self) -> dict[str, Any]:
        doc = self.service.health()
        if self.consumer_failure is not None:
            doc.update(healthy=False, failure=self.consumer_failure)
        return doc

    def _consume(self) -> None:
        """The consumer thread: the runtime's loop. It returns only when stopped; anything else
        ending it makes the whole process stop (see the module docstring)."""
        try:
            self.service.run()
            if not self._stopping.is_set():
                self.consumer_failure = "the AMQP consumer stopped by itself"
        except BaseException as exc:  # noqa: BLE001 (any end of this thread is fatal to the process)
            self.consumer_failure = f"the AMQP consumer failed: {type(exc).__name__}: {exc}"
        if self.consumer_failure is not None and not self._stopping.is_set():
            log.error("AMQP consumer ended; stopping the context broker so it restarts whole",
                      extra={"reason": self.consumer_failure})
            self.server.stop()

    def _start_consumer(self) -> threading.Thread:
        t = threading.Thread(target=self._consume, name="ctx-consumer", daemon=True)
        t.start()
        self._svc_thread = t
        return t

    # ------------------------------------------------------------------ Runnable
    def run(self) -> None:
        """Serve until stopped. Raises ``SystemExit(1)`` if the consumer died under it."""
        thread = self._start_consumer()
        try:
            self.server.run()
        finally:
            self._stopping.set()
            self.service.stop()
            thread.join(10)
            self._publisher.shutdown(wait=True)
            self.server.store.close()
            self._stopped.set()
        if self.consumer_failure is not None:
            raise SystemExit(1)

    def start_in_thread(self) -> CtxBrokerService:
        """Tests: serve HTTP and AMQP in background threads."""
        self._start_consumer()
        self.server.start_in_thread()
        return self

    def stop(self) -> None:
        self._stopping.set()
        self.server.stop()
        self.service.stop()

    def close(self) -> None:
        """Tests: stop and wait (pairs with ``start_in_thread``)."""
        self.stop()
        self.server.join()
        t = getattr(self, "_svc_thread", None)
        if t is not None:
            t.join(10)
        self._publisher.shutdown(wait=True)

    def install_signal_handlers(self) -> None:
        def handler(_signum: int, _frame: Any) -> None:
            self.stop()

        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)


def server_settings(config: EpuConfig) -> ServerSettings:
    c = config.ctxbroker
    token_file = Path(c.admin_token_file or "epu-ctxbroker.admin-token")
    cert, key = c.cert_file, c.key_file
    if not cert or not key:
        from epu.services.ctxbroker.tls import self_signed

        tls_dir = token_file.parent / "epu-ctxbroker-tls"
        if (tls_dir / "cert.pem").exists() and (tls_dir / "key.pem").exists():
            cert, key = str(tls_dir / "cert.pem"), str(tls_dir / "key.pem")
        else:
            c_path, k_path = self_signed(tls_dir, hosts=("localhost", c.host) if c.host != "localhost"
                                         else ("localhost",))
            cert, key = str(c_path), str(k_path)
            log.warning("no cert_file/key_file configured: serving a self-signed certificate",
                        extra={"cert": cert})
    return ServerSettings(host=c.host, port=c.port, cert_file=cert, key_file=key,
                          admin_token=read_or_create_token(token_file), store_url=c.store_url,
                          public_url=c.public_url, refresh_interval=c.refresh_interval,
                          history_entries=c.history_entries)


def build_service(config: EpuConfig, *, clock: Clock | None = None) -> CtxBrokerService:
    settings = server_settings(config)
    server = BrokerServer(settings)
    c = config.ctxbroker
    hub = server.hub
    service = Service("ctxbroker", config.broker_obj(), clock=clock or RealClock(),
                      settings=RuntimeSettings(
                          metrics_port=c.metrics_port, metrics_host=c.metrics_host,
                          extra_health={"https": lambda: {"url": server.public_url, "serving": not hub.closing,
                                                          "contexts": len(hub.contexts),
                                                          "waiting": hub.waiting}}))
    register_metrics(service, server)
    return CtxBrokerService(server, service)


def register_metrics(service: Service, server: BrokerServer) -> None:
    """Broker gauges on the service's /metrics (read live from the hub; no bookkeeping on the hot path)."""
    from prometheus_client import Gauge

    hub, r = server.hub, service.metrics.registry
    Gauge("epu_ctxbroker_contexts", "Contexts cached by this broker process", registry=r).set_function(
        lambda: len(hub.contexts))
    Gauge("epu_ctxbroker_waiting_polls", "Long-polls parked right now", registry=r).set_function(
        lambda: hub.waiting)
    Gauge("epu_ctxbroker_updates_requests", "Update requests answered since start (monotonic)",
          registry=r).set_function(lambda: hub.requests)
