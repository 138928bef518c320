"""What came off the wire, opened defensively: every property of a delivery is hostile input.

A consumer gets a ``Delivery`` (raw body bytes, AMQP properties and headers, where it was
published) and calls ``open_delivery``, which either returns the envelope and typed message
or raises ``DecodeError`` with a reason an operator can act on — never anything else, and
never after using unbounded memory or recursion:

* the body is bounded (``MessageLimits.max_body_bytes``) before anything is parsed;
* ``content_type`` must be msgpack (or absent), ``content_encoding`` one that means "bytes"
  (the body is binary msgpack: a text encoding such as ``cp1252`` is refused, not applied);
* a ``compression`` header (kombu's convention) is inflated only for zlib/gzip, bzip2 and
  lzma, incrementally, and refused as soon as the output passes ``max_inflated_bytes`` (a
  64 KB zlib bomb stops at the limit instead of growing to 64 MB); unknown or corrupt
  compression is a reason, not a crash;
* headers beyond ``SAFE_HEADER_*`` (nesting, items, bytes) make the message unusable: no
  EPU message carries such headers;
* msgpack itself limits nesting (its unpacker refuses deeper than 1024 levels), and the
  envelope's version numbers are bounded (a 5,000-digit major is invalid, not an int-
  conversion crash).

AMQP headers are parsed by py-amqp before we see them; how deep they can nest is bounded by
the frame size (one content-header frame, at most ``broker.FRAME_MAX`` bytes, about 26,000
levels), and ``allow_deep_headers`` sets the recursion limit so py-amqp's recursive parser
gets through any header a broker with that frame size can deliver. ``safe_headers`` decides
(without recursion) whether headers may be copied into a dead letter, so a hostile header
never makes the dead letter itself unpublishable.
"""

from __future__ import annotations

import bz2
import lzma
import sys
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from epu.common.broker import FRAME_MAX, MessageLimits
from epu.common.codec import CONTENT_TYPE, decode
from epu.common.messages import DecodeError, Envelope, Message

#: content_encoding values that leave bytes as bytes (kombu writes "binary"; pika writes none).
BYTE_ENCODINGS = frozenset({"", "binary", "identity", "utf-8", "utf8"})
#: content_type values taken as msgpack (none: clients that follow docs/messages.md loosely).
MSGPACK_TYPES = frozenset({"", CONTENT_TYPE, "application/msgpack"})

#: Headers copied into a dead letter only below these bounds (else replaced by a note).
SAFE_HEADER_DEPTH = 16
SAFE_HEADER_ITEMS = 512
SAFE_HEADER_BYTES = 32 * 1024
DROPPED_HEADERS = "x-epu-headers-dropped"


@dataclass
class Delivery:
    """One message as the broker handed it over, before any decoding."""

    body: bytes
    properties: dict[str, Any] = field(default_factory=dict)
    headers: dict[str, Any] = field(default_factory=dict)
    exchange: str = ""
    routing_key: str = ""
    redelivered: bool = False

    @property
    def content_type(self) -> Any:
        return self.properties.get("content_type")

    @property
    def content_encoding(self) -> Any:
        return self.properties.get("content_encoding")


def _short(value: Any, n: int = 60) -> str:
    text = repr(value) if not isinstance(value, str) else value
    return text if len(text) <= n else text[:n] + "..."


def _bounded(decompressor: Any, data: bytes, limit: int, what: str) -> bytes:
    """Inflate with ``decompressor`` (zlib/bz2/lzma object), never producing more than ``limit``."""
    out = decompressor.decompress(data, limit + 1)
    if len(out) > limit:
        raise DecodeError(f"compressed body ({what}) inflates beyond the {limit}-byte limit "
                          f"({len(data)} bytes compressed): refused as a compression bomb")
    if not getattr(decompressor, "eof", True):
        raise DecodeError(f"compressed body ({what}) is truncated or corrupt: the stream does not end")
    return out


def _zlib(data: bytes, limit: int) -> bytes:
    return _bounded(zlib.decompressobj(wbits=47), data, limit, "zlib/gzip")  # 47: zlib or gzip header


def _bz2(data: bytes, limit: int) -> bytes:
    return _bounded(bz2.BZ2Decompressor(), data, limit, "bzip2")


def _lzma(data: bytes, limit: int) -> bytes:
    return _bounded(lzma.LZMADecompressor(), data, limit, "lzma")


#: kombu's names for its codecs (content types and aliases) → a bounded inflater.
INFLATERS: dict[str, Callable[[bytes, int], bytes]] = {
    "application/x-gzip": _zlib, "gzip": _zlib, "zlib": _zlib, "application/zlib": _zlib,
    "application/x-bz2": _bz2, "bzip2": _bz2, "bzip": _bz2, "bz2": _bz2,
    "application/x-lzma": _lzma, "lzma": _lzma, "xz": _lzma, "application/x-xz": _lzma,
}


def body_bytes(delivery: Delivery, limits: MessageLimits) -> bytes:
    """The msgpack bytes of a delivery: size, type, encoding and compression checked."""
    body = delivery.body
    if not isinstance(delivery.headers, dict):
        raise DecodeError(f"headers are a {type(delivery.headers).__name__}, not a table")
    depth, items, size = header_shape(delivery.headers)
    if depth > SAFE_HEADER_DEPTH or items > SAFE_HEADER_ITEMS or size > SAFE_HEADER_BYTES:
        raise DecodeError(f"headers too large: nesting {depth}, {items} items, ~{size} bytes "
                          f"(limits {SAFE_HEADER_DEPTH}, {SAFE_HEADER_ITEMS}, {SAFE_HEADER_BYTES})")
    if len(body) > limits.max_body_bytes:
        raise DecodeError(f"body of {len(body)} bytes exceeds the {limits.max_body_bytes}-byte limit")
    ctype = delivery.content_type
    if ctype is not None and (not isinstance(ctype, str) or ctype.lower() not in MSGPACK_TYPES):
        raise DecodeError(f"content_type {_short(ctype)!r} is not {CONTENT_TYPE}")
    cenc = delivery.content_encoding
    if cenc is not None and (not isinstance(cenc, str) or cenc.lower() not in BYTE_ENCODINGS):
        raise DecodeError(f"content_encoding {_short(cenc)!r} is not supported: the body is binary msgpack "
                          f"(send content_encoding 'binary' or none)")
    compression = delivery.headers.get("compression")
    if compression is not None:
        name = compression.lower() if isinstance(compression, str) else None
        inflate = INFLATERS.get(name or "")
        if inflate is None:
            raise DecodeError(f"compression {_short(compression)!r} is not supported "
                              f"(known: zlib/gzip, bzip2, lzma)")
        try:
            body = inflate(body, limits.max_inflated_bytes)
        except DecodeError:
            raise
        except (zlib.error, OSError, lzma.LZMAError, EOFError, ValueError) as exc:
            raise DecodeError(f"compressed body ({compression}) is corrupt: {type(exc).__name__}: {exc}") from None
    return body


def open_delivery(delivery: Delivery, limits: MessageLimits) -> tuple[Envelope, Message]:
    """Bytes and properties → (envelope, message), or ``DecodeError`` with the reason."""
    try:
        return decode(body_bytes(delivery, limits))
    except DecodeError:
        raise
    except RecursionError:
        raise DecodeError("message nests too deeply to decode") from None
    except Exception as exc:  # anything else a hostile body can provoke is still a reason
        raise DecodeError(f"undecodable: {type(exc).__name__}: {_short(str(exc), 200)}") from None


def header_shape(value: Any) -> tuple[int, int, int]:
    """(depth, items, approximate bytes) of a header value, walked without recursion."""
    depth = items = size = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        v, d = stack.pop()
        depth = max(depth, d)
        items += 1
        if items > SAFE_HEADER_ITEMS * 4:
            break  # already far too big to copy; stop counting
        if isinstance(v, dict):
            for k, child in v.items():
                size += len(k) if isinstance(k, str | bytes) else 8
                stack.append((child, d + 1))
        elif isinstance(v, list | tuple):
            stack.extend((child, d + 1) for child in v)
        elif isinstance(v, str | bytes | bytearray):
            size += len(v)
        else:
            size += 8
    return depth, items, size


def safe_headers(headers: Any) -> dict[str, Any]:
    """``headers`` if they are small and shallow enough to republish, else a note saying why not."""
    if not isinstance(headers, dict):
        return {DROPPED_HEADERS: f"headers were a {type(headers).__name__}, not a table"}
    depth, items, size = header_shape(headers)
    if depth > SAFE_HEADER_DEPTH or items > SAFE_HEADER_ITEMS or size > SAFE_HEADER_BYTES:
        return {DROPPED_HEADERS: f"original headers dropped: nesting {depth}, {items} items, ~{size} bytes "
                                 f"(limits {SAFE_HEADER_DEPTH}, {SAFE_HEADER_ITEMS}, {SAFE_HEADER_BYTES})"}
    return dict(headers)


def allow_deep_headers() -> None:
    """Let py-amqp's recursive table parser read the deepest headers one frame can hold.

    Why: a header table nested 3,000 deep (valid AMQP, accepted by RabbitMQ) raised
    RecursionError inside the frame reader, which left the connection mid-frame and killed
    the consumer on every redelivery. A nesting level costs at least 5 bytes of a content-
    header frame, so ``FRAME_MAX / 5`` levels is the most a broker with the default frame
    size can deliver. On Python ≥ 3.11 pure-Python recursion does not consume the C stack,
    so the higher limit costs nothing until used."""
    need = FRAME_MAX // 5 + 2000
    if sys.getrecursionlimit() < need:
        sys.setrecursionlimit(need)
