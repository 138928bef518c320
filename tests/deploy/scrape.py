"""A running EPU (the demo's services on the real RabbitMQ) with every service's /metrics on,
and what a Prometheus scrape of it sees: shared by the fleet-gauge, dashboard and rule tests."""

from __future__ import annotations

import re
import socket
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from epu.common.testing import wait_for
from prometheus_client.parser import text_string_to_metric_families

SERVICES = ("sensor", "decision", "provisioner", "ctxbroker")

SUFFIXES = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_count", "_sum", "_created"),
            "summary": ("_count", "_sum", "_created"), "gaugehistogram": ("_bucket", "_gcount", "_gsum")}


def outside_address() -> str:
    """This host's address on its way out (not loopback): what a Prometheus elsewhere connects to.
    A UDP connect sends nothing; it only picks the route's source address."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect(("192.0.2.254", 9))
        addr = s.getsockname()[0]
    assert not addr.startswith("127."), "this host has no address but loopback: cannot test remote scrapes"
    return addr


def with_metrics(config: Any, host: str) -> Any:
    """``config`` with ``metrics_port = 0`` (a free port) and ``metrics_host`` in every service section."""
    update = {name: getattr(config, name).model_copy(update={"metrics_port": 0, "metrics_host": host})
              for name in SERVICES}
    return config.model_copy(update=update)


def port_of(service: Any) -> int:
    svc = getattr(service, "service", service)  # the context broker wraps its AMQP-side Service
    return int(wait_for(lambda: svc._health_server and svc._health_server.port, 10,
                        message=f"{svc.name}'s metrics endpoint"))


def scrape(host: str, port: int) -> str:
    with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=5) as r:
        return r.read().decode()


@dataclass
class Scrape:
    """One scrape: every sample by name, and every name a query may use (a family's own name and,
    for counters and histograms, the series names Prometheus stores)."""

    samples: dict[str, list[tuple[dict[str, str], float]]] = field(default_factory=dict)
    names: set[str] = field(default_factory=set)

    def add(self, text: str) -> None:
        for fam in text_string_to_metric_families(text):
            self.names.add(fam.name)
            self.names.update(fam.name + s for s in SUFFIXES.get(fam.type, ()))
            for s in fam.samples:
                self.names.add(s.name)
                self.samples.setdefault(s.name, []).append((dict(s.labels), s.value))

    def value(self, name: str, **labels: str) -> float:
        """Sum of the samples of ``name`` whose labels include ``labels``."""
        return sum(v for lab, v in self.samples.get(name, []) if labels.items() <= lab.items())


_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless",
             "offset", "inf", "nan"}


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads: identifiers that are not functions, keywords,
    label names (inside ``{}`` or a ``by (...)`` list), durations or strings."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)                  # strings
    e = re.sub(r"\{[^}]*\}", "", e)                                 # label matchers
    e = re.sub(r"\[[^\]]*\]", "", e)                                # ranges, subqueries
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", e)
    e = re.sub(r"\$\{?\w+\}?", "", e)                               # Grafana variables
    out = set()
    for m in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", e):
        tail = e[m.end():].lstrip()
        name = m.group(0)
        if tail.startswith("(") or name.lower() in _KEYWORDS or re.fullmatch(r"\d+[smhdwy]", name):
            continue
        out.add(name)
    return out


def exprs(node: Any) -> Iterator[str]:
    """Every PromQL query in a Grafana dashboard: panel targets' ``expr`` and the variables'
    ``label_values(metric, label)`` / ``query_result(...)`` queries."""
    if isinstance(node, dict):
        for k, v in node.items():
            if k == "expr" and isinstance(v, str):
                yield v
            elif k == "query" and isinstance(v, (str, dict)) and node.get("type") == "query":
                q = v if isinstance(v, str) else v.get("query", "")
                m = re.fullmatch(r"\s*(?:label_values|query_result)\((.*)\)\s*", q)
                if m:
                    inner = m.group(1)
                    yield inner.rsplit(",", 1)[0] if q.strip().startswith("label_values") and "," in inner else inner
            else:
                yield from exprs(v)
    elif isinstance(node, list):
        for v in node:
            yield from exprs(v)
