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
