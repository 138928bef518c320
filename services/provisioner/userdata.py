"""Userdata: the cloud-init document that turns a plain base image into a cluster worker.

Rendered per instance from a template (default ``deploy/cloud-init/epu-worker.yaml``) with
``string.Template`` placeholders (``${instance_id}``). Every value is inserted as a
YAML double-quoted scalar (JSON string syntax is valid YAML), so a value can never break
the document's structure or inject keys. The result must fit the provider's limit (EC2:
16 KB); a larger document is a permanent error with the size in the reason, not a silent
truncation.

What a worker is told comes from ``[workers.DOMAIN]`` (``WorkerContext``): the head node, the
batch system, and the context — its URI and *this node's own* credential, derived from the
context secret for the instance's host name and id (``epu.common.nodecred``), plus the broker's
certificate to verify it with. So every launch's userdata joins the context, and what a job on
the worker can read from the metadata service lets it speak only for that worker.

The template ships inside the package (``epu/deploy/cloud-init/`` in a wheel, ``deploy/`` in a
checkout: the same path relative to this module).
"""

from __future__ import annotations

import base64
import json
import string
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from epu.common import nodecred

DEFAULT_TEMPLATE = Path(__file__).resolve().parents[2] / "deploy" / "cloud-init" / "epu-worker.yaml"
MAX_USERDATA_BYTES = 16 * 1024

#: Keys every template may use; missing ones render as "".
CONTEXT_KEYS = ("instance_id", "launch_id", "node_name", "domain", "site", "deployment", "cores",
                "context_uri", "context_id", "context_key", "context_secret", "context_ca_pem_b64",
                "head_node", "batch_system")


@dataclass(frozen=True)
class WorkerContext:
    """One domain's ``[workers.DOMAIN]``, read and ready to render (the secret reduced to the
    signing key, which is all derivation needs)."""

    head_node: str = ""
    batch_system: str = ""
    context_uri: str = ""
    context_id: str = ""
    signing_key: str = field(default="", repr=False)
    ca_pem_b64: str = ""

    def values(self, node_name: str, instance_id: str) -> dict[str, str]:
        out = {"head_node": self.head_node, "batch_system": self.batch_system}
        if self.context_uri:
            cred = nodecred.issue(self.signing_key, self.context_id, node_name, instance_id)
            out.update(context_uri=self.context_uri, context_id=self.context_id, context_key=cred.key,
                       context_secret=cred.secret, context_ca_pem_b64=self.ca_pem_b64)
        return out


def worker_contexts(config: Any) -> dict[str, WorkerContext]:
    """``[workers.DOMAIN]`` of an ``EpuConfig``, files read. Raises ``UserdataError`` naming a
    file that cannot be read (the provisioner cannot render a worker's userdata without it)."""
    out: dict[str, WorkerContext] = {}
    for domain, w in config.workers.items():
        batch = w.batch_system or (config.sensor.backend if config.sensor.domain == domain else "")
        ctx = WorkerContext(head_node=w.head_node or "", batch_system=batch or "")
        if w.context_uri and w.context_secret_file:
            secret = _read(w.context_secret_file, f"workers.{domain}.context_secret_file").strip()
            if len(secret) < 16:
                raise UserdataError(f"workers.{domain}.context_secret_file: {w.context_secret_file} holds no "
                                    "context secret (write it with `epu ctx create {domain} --secret-file FILE`)")
            ca = ""
            if w.context_ca_file:
                ca = base64.b64encode(_read(w.context_ca_file, f"workers.{domain}.context_ca_file").encode()).decode()
            uri = w.context_uri.rstrip("/")
            ctx = WorkerContext(head_node=ctx.head_node, batch_system=ctx.batch_system, context_uri=uri,
                                context_id=nodecred.context_id_of(uri), signing_key=nodecred.signing_key(secret),
                                ca_pem_b64=ca)
        out[domain] = ctx
    return out


_quote = json.encoder.encode_basestring_ascii
"""``json.dumps`` of a string — exactly what it returns for one with its default
``ensure_ascii`` — without its generic path (a launch quotes every placeholder's value)."""


def _read(path: str, key: str) -> str:
    try:
        return Path(path).read_text()
    except OSError as exc:
        raise UserdataError(f"{key}: cannot read {path}: {exc.strerror}") from None


class UserdataError(ValueError):
    """The document cannot be produced (too big, bad template). Permanent."""


@lru_cache(maxsize=32)
def _pieces(template_text: str) -> tuple[tuple[str, ...], tuple[str, ...]] | None:
    """The template split once into its text and placeholders: ``string.Template.substitute``
    writes ``texts[0] + value(names[0]) + texts[1] + ... + texts[-1]`` (``$$`` already made
    ``$``), so a render joins the values in instead of running the pattern with a callback per
    placeholder at every launch. ``None``: the template has an invalid placeholder (``substitute``
    raises its error: ``render`` takes its path then)."""
    t = string.Template
    texts: list[str] = []
    names: list[str] = []
    run: list[str] = []
    pos = 0
    for m in t.pattern.finditer(template_text):
        run.append(template_text[pos:m.start()])
        named = m.group("named") or m.group("braced")
        if named is not None:
            texts.append("".join(run))
            names.append(named)
            run = []
        elif m.group("escaped") is not None:
            run.append(t.delimiter)
        else:
            return None
        pos = m.end()
    run.append(template_text[pos:])
    texts.append("".join(run))
    return tuple(texts), tuple(names)


@dataclass(frozen=True)
class UserdataRenderer:
    template_text: str
    max_bytes: int = MAX_USERDATA_BYTES
    workers: dict[str, WorkerContext] = field(default_factory=dict)
    """Per domain: head node and context (``worker_contexts``)."""

    @classmethod
    def from_path(cls, path: str | Path | None = None, max_bytes: int = MAX_USERDATA_BYTES,
                  workers: dict[str, WorkerContext] | None = None) -> UserdataRenderer:
        p = Path(path) if path else DEFAULT_TEMPLATE
        try:
            return cls(p.read_text(), max_bytes, workers or {})
        except OSError as exc:
            raise UserdataError(f"cannot read userdata template {p}: {exc.strerror}") from None

    def render(self, values: dict[str, object]) -> str:
        ctx = {k: "" for k in CONTEXT_KEYS}
        worker = self.workers.get(str(values.get("domain", "")))
        if worker is not None:
            ctx.update(worker.values(str(values.get("node_name", "")), str(values.get("instance_id", ""))))
        ctx.update({k: v for k, v in values.items() if v is not None})
        quoted = {k: _quote(str(v)) for k, v in ctx.items()}
        pieces = _pieces(self.template_text)
        if pieces is not None and all(map(quoted.__contains__, pieces[1])):
            texts, names = pieces
            parts = [texts[0]]
            for name, text in zip(names, texts[1:], strict=True):
                parts.append(quoted[name])
                parts.append(text)
            doc = "".join(parts)
        else:  # an unknown or malformed placeholder: ``substitute`` says which
            try:
                doc = string.Template(self.template_text).substitute(quoted)
            except (KeyError, ValueError) as exc:
                raise UserdataError(f"userdata template: unknown or malformed placeholder {exc}") from None
        size = len(doc.encode())
        if size > self.max_bytes:
            raise UserdataError(f"userdata is {size} bytes, over the provider limit of {self.max_bytes}")
        return doc
