"""Expected failures of ``epu`` commands, as one line an operator can act on.

A wrong password, an unreachable RabbitMQ, an unreadable file or a refused permission is not
a bug: printing 60 lines of traceback for it hides the one line that matters. ``explain`` turns
the failures an operator can fix into that line and the documented exit status (1: the outside
world refused or failed; 2: bad configuration); anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import errno
import socket
from typing import Any

from epu.common import cliargs

BROKER_HINT = "check [broker] url (or EPU_BROKER__URL)"


def _broker() -> str:
    return f"RabbitMQ at {cliargs.loaded_broker_url}" if cliargs.loaded_broker_url else "RabbitMQ"


#: top-level module → the extra of pyproject.toml that installs it (docs/deploy.md, "Install")
EXTRA_OF = {"httpx": "operator", "sqlalchemy": "control", "libcloud": "control", "tenacity": "control",
            "fastapi": "ctxbroker", "starlette": "ctxbroker", "uvicorn": "ctxbroker", "cryptography": "ctxbroker",
            "yaml": "agent", "matplotlib": "plots", "psycopg": "postgres", "htcondor": "htcondor"}


def explain(exc: BaseException) -> tuple[int, str] | None:
    """(exit status, message) for an expected failure; None for a bug."""
    from epu.common.config import ConfigError

    if isinstance(exc, ModuleNotFoundError) and (exc.name or "").split(".")[0] in EXTRA_OF:
        extra = EXTRA_OF[(exc.name or "").split(".")[0]]
        return 1, (f"this command needs {exc.name}, which this install does not have: "
                   f"pip install 'epu[{extra}]' (docs/deploy.md, Install)")

    if isinstance(exc, ConfigError):
        return 2, f"bad configuration:\n{exc}"
    name = type(exc).__name__
    if name in ("UserdataError", "SiteConfigError"):  # the provisioner's configuration errors
        return 2, f"bad configuration: {exc}"
    from epu.common.broker import PERMANENT_HINTS, BrokerRefused, BrokerUnavailable, PublishRefused

    if isinstance(exc, PublishRefused):  # nothing was delivered: the reason is the broker's
        why = "; ".join(sorted(set(exc.refused.values()))) or str(exc)
        return 1, (f"{_broker()} refused the request ({why}); nothing was sent. Are the RabbitMQ definitions "
                   "loaded (docs/deploy.md, step 3) and is this the operator's user?")
    if isinstance(exc, BrokerRefused):
        return 1, f"{_broker()} refused this service ({exc}): {PERMANENT_HINTS[exc.kind]}"

    if isinstance(exc, BrokerUnavailable):  # every URL tried; the message says how each failed
        text = str(exc)
        if "Login was refused" in text or ("ACCESS_REFUSED" in text and "(0, 0)" in text):
            return 1, (f"{_broker()} refused the login (ACCESS_REFUSED): check the user name and password "
                       f"in [broker] url (or EPU_BROKER__URL)")
        if "NOT_ALLOWED" in text:
            return 1, f"{_broker()} refused the virtual host (NOT_ALLOWED): the user has no access to it; {BROKER_HINT}"
        return 1, f"cannot reach RabbitMQ: {text.removeprefix('cannot reach the broker: ')}; {BROKER_HINT}"
    from epu.common.stall import BrokerStalled

    if isinstance(exc, BrokerStalled):  # it took the connection, then stopped answering
        return 1, f"{_broker()}: {exc}"
    amqp = _amqp(exc)
    if amqp is not None:
        return amqp
    if isinstance(exc, socket.gaierror):
        return 1, f"cannot resolve the host of {_broker()}: {exc.strerror}; {BROKER_HINT}"
    if isinstance(exc, ConnectionRefusedError):
        return 1, f"cannot reach {_broker()}: connection refused (is it running? {BROKER_HINT})"
    if isinstance(exc, OSError):
        if exc.errno == errno.EADDRINUSE:
            if "metrics_port" in str(exc.strerror):  # common.observability names the port and the service
                return 1, f"a port is already in use: {exc.strerror}"
            return 1, f"a port is already in use ({exc.strerror}): check metrics_port and [ctxbroker] port"
        if exc.filename:
            return 1, f"{exc.filename}: {exc.strerror}"
        if isinstance(exc, TimeoutError | ConnectionError):
            return 1, f"cannot reach {_broker()}: {exc.strerror or exc}; {BROKER_HINT}"
    return None


def _amqp(exc: BaseException) -> tuple[int, str] | None:
    try:
        from amqp import exceptions as amqp_exc
        from kombu.exceptions import OperationalError
    except ImportError:  # pragma: no cover (kombu is a base dependency)
        return None
    cause: Any = exc.__cause__ if isinstance(exc, OperationalError) and exc.__cause__ else exc
    if isinstance(cause, amqp_exc.AccessRefused):
        text = str(getattr(cause, "reply_text", "") or cause)
        if "Login was refused" in text or getattr(cause, "method_sig", None) in (None, (0, 0)):
            return 1, (f"{_broker()} refused the login (ACCESS_REFUSED): check the user name and password "
                       f"in [broker] url (or EPU_BROKER__URL)")
        return 1, (f"{_broker()} refused an operation: {text}. The user lacks that permission: see "
                   "deploy/rabbitmq and docs/deploy.md for what each user may do")
    if isinstance(cause, amqp_exc.NotAllowed):
        return 1, f"{_broker()} refused the virtual host: {getattr(cause, 'reply_text', cause)}; {BROKER_HINT}"
    if isinstance(cause, amqp_exc.AMQPError):
        return 1, f"{_broker()}: {getattr(cause, 'reply_text', '') or cause}"
    if isinstance(exc, OperationalError):
        inner = exc.__cause__ or exc.__context__
        if isinstance(inner, BaseException) and inner is not exc:
            nested = explain(inner)
            if nested is not None:
                return nested
        return 1, f"cannot reach {_broker()}: {exc}; {BROKER_HINT}"
    return None
