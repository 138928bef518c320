"""Print the broker's OpenAPI document: ``python -m epu.services.ctxbroker.openapi > docs/ctxbroker-openapi.json``.

The committed copy is what clients and the schemathesis fuzz test read; a test checks that
the served document equals it, so regenerate after changing the API.
"""

from __future__ import annotations

import json
from typing import Any


def document() -> dict[str, Any]:
    from epu.services.ctxbroker.api import create_app, openapi_document
    from epu.services.ctxbroker.hub import Hub

    app = create_app(Hub.__new__(Hub), "unused", "https://localhost:8443")  # spec only: no store needed
    return openapi_document(app)


if __name__ == "__main__":
    print(json.dumps(document(), indent=2, sort_keys=True))
