"""TORQUE's own error messages, sorted into what a sensor must do with them.

Why a table: the CLI (``pbsnodes``, ``qmgr``, ``qrerun``) does not give a usable exit code —
``pbsnodes -o`` exits 0 on failures — so a failure is told by its text. The texts are TORQUE's
message database (``src/include/pbs_error_db.h``, the PBSE_* codes 15001–15140; the clients
print them after the server's name, e.g. ``PBS_Server System error: Resource temporarily
unavailable``). Each is one of:

* **transient** — the server, a MOM, trqauthd or the network could not do it *now* (a system
  error such as EAGAIN, no free connections, a time out, a server shutting down or busy): the
  command's result is not remembered, so the engine's re-send runs it again;
* **already done** — what the command wanted is already so (the node exists for ``create``,
  is unknown for ``delete``, the job ended for ``qrerun``): success;
* **permanent** — anything else (permission, a bad value, an unknown attribute): remembered.
"""

from __future__ import annotations

#: PBSE_* texts (lower case) that go away by themselves.
TRANSIENT = (
    "system error",                    # PBSE_SYSTEM 15012: " System error: " + strerror(errno)
    "resource temporarily unavailable",  # PBSE_RESCUNAV 15046 (and EAGAIN's strerror)
    "pbs server internal error",       # PBSE_INTERNAL 15013
    "batch protocol error",            # PBSE_PROTOCOL 15033
    "no free connections",             # PBSE_NOCONNECTS 15035
    "server shutting down",            # PBSE_SVRDOWN 15062
    "server could not connect to mom",  # PBSE_NORELYMOM 15072
    "time out",                        # PBSE_TIMEOUT 15085
    "error allocating memory",         # PBSE_MEM_MALLOC 15091
    "error allocating controling mutex",  # PBSE_MUTEX 15092 (sic)
    "error creating thread",           # PBSE_THREAD 15094
    "error in socket select",          # PBSE_SELECT 15095
    "unable to get connection to socket",  # PBSE_SOCKET_FAULT 15096
    "error writing data to socket",    # PBSE_SOCKET_WRITE 15097
    "error reading data from socket",  # PBSE_SOCKET_READ 15098
    "socket close detected",           # PBSE_SOCKET_CLOSE 15099
    "premature end of file",           # PBSE_PREMATURE_EOF 15114
    "can not establish connection",    # PBSE_CONNECT 15120
    "job function must be temporarily delayed",  # PBSE_JOBWORKDELAY 15121
    "could not connect to batch server",  # PBSE_SERVER_NOT_FOUND 15133
    "server busy",                     # PBSE_SERVER_BUSY 15134
    "possible transient failure",      # PBSE_CLIENT_CONN_NOT_FOUND 15135
    "could not connect to trqauthd",   # PBSE_DOMAIN_SOCKET_FAULT 15137
    # the clients' own words when no server answers (pbs_connect)
    "cannot connect", "communication failure", "timed out", "connection refused", "no route to host",
    "mom-list-not-sent",               # a node created moments ago (captured on 6.1.3)
)
#: Per command, the texts meaning "already so" (PBSE_NODEEXIST, PBSE_UNKNODE, PBSE_UNKJOBID, PBSE_BADSTATE).
ALREADY = {
    "create node": ("node name already exists",),
    "delete node": ("unknown node",),
    "qrerun": ("unknown job id", "request invalid for state of job"),
}


def classify(text: str, command: str = "") -> str:
    """``transient``, ``already`` or ``permanent`` for a failed command's output."""
    low = (text or "").lower()
    if any(marker in low for marker in ALREADY.get(command, ())):
        return "already"
    if any(marker in low for marker in TRANSIENT):
        return "transient"
    return "permanent"


def is_transient(text: str) -> bool:
    return classify(text) == "transient"
