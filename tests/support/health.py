"""Reading a service's ``/healthz`` from a test, whatever state the service is in."""

from __future__ import annotations

import json
import urllib.error
import urllib.request


def health(port: int) -> dict:
    """The JSON body of ``/healthz`` (503 bodies too: a service waiting for its broker still
    says why); ``{}`` while nothing listens on the port."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return json.loads(exc.read())
    except OSError:
        return {}


def metric(port: int, name: str, labels: dict[str, str] | None = None) -> float:
    """One sample of a service's Prometheus ``/metrics`` (0.0 when absent or while nothing
    listens): lets a test wait for "N more iterations" instead of sleeping."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
            text = r.read().decode()
    except OSError:
        return 0.0
    want = labels or {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in want.items()):
                return float(sample.value)
    return 0.0
