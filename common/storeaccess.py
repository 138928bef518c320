"""Whether an operator command on this host can read a service's store, and why not.

Why a module of its own, free of SQLAlchemy: the operator's install is the base one (the
broker only). ``epu instances list``, ``epu policy show`` and ``epu instances terminate`` read
a store only where one is readable — the control-plane host, as a user allowed to — and fall
back to the decision engine's retained status over the broker everywhere else: on a
workstation without SQLAlchemy, where the SQLite file does not exist (opening it would create
an empty store and report that emptiness as the system's state), or where the file is closed
to this user (``/var/lib/epu-decision`` is 0750). The reason is one line, never a traceback.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def sqlite_path(url: str) -> str | None:
    """The file a ``sqlite:///PATH`` URL names (None: not a SQLite file URL)."""
    if not url.startswith("sqlite") or "///" not in url:
        return None
    path = url.split("///", 1)[1].split("?", 1)[0]
    return None if not path or path == ":memory:" else path


def store_unreadable(url: str, key: str) -> str | None:
    """Why this host cannot read the store ``url`` (config key ``key``); None when it can try."""
    if importlib.util.find_spec("sqlalchemy") is None:
        return f"this install has no SQL layer (SQLAlchemy; the 'control' extra) to read {key}"
    path = sqlite_path(url)
    if path is None:
        return None
    try:
        os.stat(path)
    except FileNotFoundError:
        return f"no store at {path} ({key})"
    except PermissionError:
        return f"the store {path} ({key}) is closed to this user (permission denied)"
    except OSError as exc:
        return f"the store {path} ({key}) cannot be read: {exc.strerror}"
    if not os.access(path, os.R_OK):
        return f"the store {path} ({key}) is closed to this user (permission denied)"
    return None


def read_store(url: str, key: str, read: Callable[[], T]) -> tuple[T | None, str | None]:
    """``read()`` the store, or why it could not be: (result, None) or (None, one line).

    Failures of the SQL layer (a file this user may read but not lock, a PostgreSQL server that
    refuses this user) are reported by type and first line only: the URL is not repeated, so a
    password in it is never printed."""
    why = store_unreadable(url, key)
    if why is not None:
        return None, why
    try:
        return read(), None
    except Exception as exc:  # noqa: BLE001 - any failure of the SQL layer means: use the broker
        if not _is_store_error(exc):
            raise
        first = (str(getattr(exc, "orig", None) or exc).splitlines() or [""])[0][:200]
        return None, f"the store ({key}) cannot be read here: {type(exc).__name__}: {first}"


def _is_store_error(exc: BaseException) -> bool:
    if isinstance(exc, OSError | ImportError):  # ImportError: a PostgreSQL store without the 'postgres' extra
        return True
    try:
        from sqlalchemy.exc import SQLAlchemyError
    except ImportError:  # pragma: no cover - store_unreadable returned first
        return False
    return isinstance(exc, SQLAlchemyError)


