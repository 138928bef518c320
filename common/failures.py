"""Which handler failures are the infrastructure's, and whether waiting can cure them.

Why: the runtime retries an infrastructure failure in place, for as long as it takes, holding
every later message of its queue behind it (design rule 5: nothing lost, nothing reordered).
That is right for a database that is failing over or locked and for a broker that is away; it
is wrong for a failure no wait can cure — a schema that does not match the code after an upgrade
(``no such column``), a read-only or missing database file, a refused login, a binary that is not
installed. Those used to be retried forever under the broad ``OSError`` and
``sqlite3.OperationalError``: the engine's input blocked, silently, with ``/healthz`` green.

``classify`` answers one of:

* ``"transient"`` — the infrastructure is away or busy: retry in place;
* ``"permanent"`` — the infrastructure is broken in a way only an operator can fix: stop
  consuming (the message goes back to its queue, nothing is lost) and say so once, loudly;
* ``None`` — not the infrastructure's: the message or a bug (retried a few times, then
  dead-lettered with the reason).

Databases are judged by their own codes: PostgreSQL's SQLSTATE classes, SQLite's messages (its
Python errors carry no code before 3.11's ``sqlite_errorname``, which is read when present). A
read-only *PostgreSQL* transaction is transient (a failover: the pool still points at the old
primary or a standby), a read-only *SQLite* file permanent (its mode or mount: only an operator
changes it).
Operating-system errors by ``errno``: a missing or forbidden path is permanent, the network's
errors (refused, reset, unreachable, timed out) are transient.
"""

from __future__ import annotations

import errno
import sqlite3
from typing import Literal

Kind = Literal["transient", "permanent"]

#: PostgreSQL SQLSTATE classes and codes that no wait cures (schema, privileges, login, the
#: database's name): https://www.postgresql.org/docs/current/errcodes-appendix.html
_PG_PERMANENT_CLASSES = ("42", "28", "3D", "3F", "0A", "2B")
#: ... and those that pass (connection, rollback of a serialization or deadlock, resources,
#: operator intervention such as a restart, system I/O, a lock not available).
_PG_TRANSIENT_CLASSES = ("08", "40", "53", "57", "58")
#: ... and single codes of other classes: a lock or object in use (``55P03``, ``55006``); a
#: read-only transaction (``25006``: the session reached a standby, or the old primary after a
#: failover, until the pool reconnects to the new primary); a transaction already aborted
#: (``25P02``: an earlier statement of it failed, typically on the connection the failover cut
#: — the next transaction on a fresh connection goes through). Both used to be "the message's":
#: an operator's change was dead-lettered after three tries in 0.6 s (issue 33, defect 7).
_PG_TRANSIENT_CODES = ("55P03", "55006", "25006", "25P02")
#: What a server answers at login, in a connection error that carries no SQLSTATE (psycopg).
_PG_LOGIN_REFUSALS = ("does not exist", "password authentication failed", "no pg_hba.conf entry",
                      "permission denied", "authentication failed")

#: SQLite result names (``sqlite_errorname``) and message fragments that no wait cures.
_SQLITE_PERMANENT_NAMES = ("SQLITE_READONLY", "SQLITE_CORRUPT", "SQLITE_NOTADB", "SQLITE_CANTOPEN", "SQLITE_PERM",
                           "SQLITE_AUTH")
_SQLITE_PERMANENT_TEXT = ("no such column", "no such table", "has no column named", "no such function",
                          "no such index", "no such collation", "readonly database", "unable to open database",
                          "file is not a database", "malformed", "syntax error", "not authorized")

#: errno values of a path that is missing, forbidden or of the wrong kind, or a program that
#: cannot run: an operator's fix, not a wait.
_OS_PERMANENT = frozenset({errno.ENOENT, errno.EACCES, errno.EPERM, errno.EROFS, errno.EISDIR, errno.ENOTDIR,
                           errno.ENAMETOOLONG, errno.ELOOP, errno.ENOEXEC})


def classify(exc: BaseException, transient: tuple[type[BaseException], ...] = ()) -> Kind | None:
    """What ``exc`` says of the infrastructure (module docstring). ``transient``: more types a
    service declares transient (its own "the backend is away" errors)."""
    flag = getattr(exc, "transient", None)
    if flag is not None:  # the raiser knows best (a publish the broker refused is the message's)
        return "transient" if flag else None
    db = _database(exc)
    if db is not None:
        return db
    if isinstance(exc, ConnectionError | TimeoutError):
        return "transient"
    if isinstance(exc, OSError):
        return "permanent" if exc.errno in _OS_PERMANENT else "transient"
    if transient and isinstance(exc, transient):
        return "transient"
    return None


def describe(exc: BaseException) -> str:
    """One line: the type and message (of the database's own error when wrapped)."""
    inner = getattr(exc, "orig", None) or exc
    return f"{type(inner).__name__}: {inner}".splitlines()[0][:500]


def _database(exc: BaseException) -> Kind | None:
    """SQLAlchemy's wrappers (judged by the driver's error inside), sqlite3 and psycopg."""
    try:
        from sqlalchemy import exc as sa
    except ImportError:  # a host without SQLAlchemy (a sensor)
        sa = None  # type: ignore[assignment]
    if sa is not None:
        if isinstance(exc, sa.DBAPIError) and exc.orig is not None:
            inner = _driver(exc.orig)
            if inner is not None:
                return inner
            if exc.connection_invalidated or isinstance(exc, sa.OperationalError | sa.InterfaceError):
                return "transient"
            return None
        if isinstance(exc, sa.TimeoutError | sa.DisconnectionError):
            return "transient"  # the pool: every connection busy, or one that died
    return _driver(exc)


def _driver(exc: BaseException) -> Kind | None:
    if isinstance(exc, sqlite3.Error):
        return _sqlite(exc)
    state = getattr(exc, "sqlstate", None)
    if isinstance(state, str) and len(state) == 5:
        if state.startswith(_PG_PERMANENT_CLASSES):
            return "permanent"
        if state.startswith(_PG_TRANSIENT_CLASSES) or state in _PG_TRANSIENT_CODES:
            return "transient"
        return None  # a constraint, a bad value: this message's
    if type(exc).__module__.startswith("psycopg") and type(exc).__name__ in ("OperationalError", "InterfaceError"):
        # no SQLSTATE: a connection that failed. The server's own refusal (a FATAL at login) is
        # permanent; a server never reached (refused, reset, timed out) is not
        text = str(exc)
        return "permanent" if "FATAL" in text and any(t in text for t in _PG_LOGIN_REFUSALS) else "transient"
    return None


def _sqlite(exc: sqlite3.Error) -> Kind | None:
    text = str(exc).lower()
    name = getattr(exc, "sqlite_errorname", "") or ""
    if name.startswith(_SQLITE_PERMANENT_NAMES) or any(t in text for t in _SQLITE_PERMANENT_TEXT):
        return "permanent"
    if isinstance(exc, sqlite3.OperationalError):
        return "transient"  # locked, busy, disk I/O, full, interrupted: what passes
    if isinstance(exc, sqlite3.IntegrityError | sqlite3.DataError | sqlite3.ProgrammingError | sqlite3.InterfaceError):
        return None  # this message's, or a bug
    if isinstance(exc, sqlite3.DatabaseError):
        return "permanent"  # corrupt, not a database
    return None
