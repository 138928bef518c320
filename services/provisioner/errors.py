"""Cloud errors sorted into the three kinds the rest of EPU acts on — pure, no I/O.

* ``transient``: timeouts, 5xx, throttling. Retried here with backoff and jitter.
* ``capacity``: the cloud is full or our quota there is spent. Never retried here: the
  decision engine learns it at once (``InstanceEvent.error_kind``) and fails over to
  another site, which is what a person would do.
* ``permanent``: auth, a bad image or size, invalid parameters. Failed with the reason.

libcloud raises many exception classes and often just ``Exception`` with the provider's
message, so classification looks at the class, the HTTP status and the provider's error
code in the text, in that order. Unknown errors count as permanent: retrying something we
do not understand risks duplicates and hides the problem.
"""

from __future__ import annotations

import re
import socket
import ssl
from typing import Literal

from libcloud.common.exceptions import BaseHTTPError, RateLimitReachedError
from libcloud.common.types import InvalidCredsError, LibcloudError

ErrorKind = Literal["transient", "capacity", "permanent"]

CAPACITY_CODES = (
    "InsufficientInstanceCapacity", "InstanceLimitExceeded", "InsufficientHostCapacity",
    "InsufficientCapacity", "VcpuLimitExceeded", "MaxSpotInstanceCountExceeded", "QuotaExceeded",
    "quota exceeded", "over quota", "No valid host", "ZONE_RESOURCE_POOL_EXHAUSTED",
    "SkuNotAvailable", "OperationNotAllowed", "capacity",
)
TRANSIENT_CODES = (
    "RequestLimitExceeded", "Throttling", "ThrottlingException", "ServiceUnavailable",
    "InternalError", "Unavailable", "RequestTimeout", "timed out", "timeout", "Connection reset",
    "temporarily", "try again",
)
PERMANENT_CODES = (
    "AuthFailure", "UnauthorizedOperation", "InvalidAMIID", "InvalidInstanceType", "InvalidParameter",
    "InvalidKeyPair", "InvalidGroup", "Unsupported", "not found", "invalid",
)


class CloudError(Exception):
    """An error raised by our own drivers with its kind already known."""

    def __init__(self, message: str, kind: ErrorKind, code: str = "") -> None:
        super().__init__(message)
        self.kind: ErrorKind = kind
        self.code = code


def _has(text: str, codes: tuple[str, ...]) -> bool:
    low = text.lower()
    return any(c.lower() in low for c in codes)


def classify(exc: BaseException) -> ErrorKind:
    """The kind of a cloud API error (see the module docstring)."""
    if isinstance(exc, CloudError):
        return exc.kind
    if isinstance(exc, InvalidCredsError):
        return "permanent"
    if isinstance(exc, RateLimitReachedError):
        return "transient"
    if isinstance(exc, TimeoutError | socket.timeout | ConnectionError | ssl.SSLError):
        return "transient"
    text = f"{type(exc).__name__}: {exc}"
    if _has(text, CAPACITY_CODES):
        return "capacity"
    status = getattr(exc, "code", None) if isinstance(exc, BaseHTTPError) else None
    if status is None:
        m = re.search(r"\b(4\d\d|5\d\d)\b", str(exc))
        status = int(m.group(1)) if m and isinstance(exc, LibcloudError | BaseHTTPError) else None
    if isinstance(status, int):
        if status in (408, 429) or status >= 500:
            return "transient"
        if status in (401, 403):
            return "permanent"
    if _has(text, TRANSIENT_CODES):
        return "transient"
    return "permanent"


THROTTLE_CODES = ("RequestLimitExceeded", "Throttling", "ThrottlingException", "Too Many Requests")


def is_throttled(exc: BaseException) -> bool:
    """A rate-limit refusal: the request was turned away unprocessed, so repeating it can make
    nothing twice (unlike a timeout or a 5xx, after which a create may have happened)."""
    if isinstance(exc, RateLimitReachedError):
        return True
    if isinstance(exc, BaseHTTPError) and getattr(exc, "code", None) == 429:
        return True
    return _has(f"{exc}", THROTTLE_CODES)


#: Transient failures after which a request may have been carried out all the same: the server
#: took it and the answer was lost (a gateway timeout, a read timeout, a reset connection) or it
#: failed midway (500). A 503 or a throttle is a refusal of a request left unprocessed.
AMBIGUOUS_CODES = ("GatewayTimeout", "Gateway Timeout", "timed out", "timeout", "Connection reset", "InternalError")


def may_have_taken_effect(exc: BaseException) -> bool:
    """Might the request that failed with ``exc`` have taken effect (a create: made its node)?"""
    if is_throttled(exc):
        return False
    if isinstance(exc, TimeoutError | socket.timeout | ConnectionResetError):
        return True
    status = getattr(exc, "code", None) if isinstance(exc, BaseHTTPError) else None
    if isinstance(status, int):
        return status in (500, 502, 504)
    return _has(f"{exc}", AMBIGUOUS_CODES)


def describe(exc: BaseException) -> str:
    """A one-line reason for an operator: the class and the provider's message, trimmed."""
    text = str(exc).strip().replace("\n", " ") or type(exc).__name__
    return f"{type(exc).__name__}: {text}"[:500]
