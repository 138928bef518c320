"""Structured logging: one event name plus fields, rendered as JSON or as key=value text.

Why not plain %-formatting: operators grep and ship logs; fields must stay fields. Secrets
never reach a log line: any field whose name looks like a credential is replaced.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

SECRET_WORDS = ("secret", "password", "passwd", "token", "credential", "private_key", "api_key")
REDACTED = "***"
_STD_ATTRS = set(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


def redact(fields: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for k, v in fields.items():
        if any(w in k.lower() for w in SECRET_WORDS):
            out[k] = REDACTED
        elif isinstance(v, dict):
            out[k] = redact(v)
        else:
            out[k] = v
    return out


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    return redact({k: v for k, v in record.__dict__.items() if k not in _STD_ATTRS and not k.startswith("_")})


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        doc = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": record.getMessage(),
            **_fields(record),
        }
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str)


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%H:%M:%S", time.localtime(record.created))
        kv = " ".join(f"{k}={v}" for k, v in _fields(record).items())
        line = f"{ts} {record.levelname:<7} {record.name}: {record.getMessage()}" + (f" {kv}" if kv else "")
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def setup_logging(level: str = "info", json_format: bool = False, stream: Any = None) -> None:
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if json_format else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for noisy in ("amqp", "kombu", "urllib3", "libcloud", "httpx", "uvicorn.access"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def get_logger(name: str) -> logging.Logger:
    return logging.getLogger(name)
