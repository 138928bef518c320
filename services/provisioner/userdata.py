"""Userdata: the cloud-init document that turns a plain base image into a cluster worker.

Rendered per instance from a template (default ``deploy/cloud-init/epu-worker.yaml``) with
``string.Template`` placeholders (``${instance_id}``). Every value is inserted as a
YAML double-quoted scalar (JSON string syntax is valid YAML), so a value can never break
the document's structure or inject keys. The result must fit the provider's limit (EC2:
16 KB); a larger document is a permanent error with the size in the reason, not a silent
truncation.
"""

from __future__ import annotations

import json
import string
from dataclasses import dataclass
from pathlib import Path

DEFAULT_TEMPLATE = Path(__file__).resolve().parents[2] / "deploy" / "cloud-init" / "epu-worker.yaml"
MAX_USERDATA_BYTES = 16 * 1024

#: Keys every template may use; missing ones render as "".
CONTEXT_KEYS = ("instance_id", "launch_id", "node_name", "domain", "site", "deployment", "cores",
                "context_uri", "context_id", "context_key", "context_secret", "head_node", "batch_system")


class UserdataError(ValueError):
    """The document cannot be produced (too big, bad template). Permanent."""


@dataclass(frozen=True)
class UserdataRenderer:
    template_text: str
    max_bytes: int = MAX_USERDATA_BYTES

    @classmethod
    def from_path(cls, path: str | Path | None = None, max_bytes: int = MAX_USERDATA_BYTES) -> UserdataRenderer:
        p = Path(path) if path else DEFAULT_TEMPLATE
        try:
            return cls(p.read_text(), max_bytes)
        except OSError as exc:
            raise UserdataError(f"cannot read userdata template {p}: {exc.strerror}") from None

    def render(self, values: dict[str, object]) -> str:
        ctx = {k: "" for k in CONTEXT_KEYS}
        ctx.update({k: v for k, v in values.items() if v is not None})
        quoted = {k: json.dumps(str(v)) for k, v in ctx.items()}
        try:
            doc = string.Template(self.template_text).substitute(quoted)
        except (KeyError, ValueError) as exc:
            raise UserdataError(f"userdata template: unknown or malformed placeholder {exc}") from None
        size = len(doc.encode())
        if size > self.max_bytes:
            raise UserdataError(f"userdata is {size} bytes, over the provider limit of {self.max_bytes}")
        return doc
