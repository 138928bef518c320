"""Slurm's own error messages, sorted into what a sensor must do with them.

The texts are Slurm's error table (``src/common/slurm_errno.c``, printed by ``scontrol`` and
``squeue`` as ``<command>: error: <text>``). Each failed command is one of:

* **transient** — slurmctld could not be reached or asked to wait (connection, send, receive or
  time-out failures, a rate limit, a backup controller in standby, a state that cannot change
  *now*): the result is not remembered, so the engine's re-send runs the command again;
* **already done** — what the command wanted is already so: a ``delete`` of a node Slurm does not
  know, a ``requeue`` of a job that ended;
* **permanent** — anything else (permission, an invalid state or value).
"""

from __future__ import annotations

TRANSIENT = (
    "unable to contact slurm controller",   # SLURMCTLD_COMMUNICATIONS_{CONNECTION,SEND,RECEIVE,SHUTDOWN}_ERROR
    "communication connection failure",     # SLURM_COMMUNICATIONS_CONNECTION_ERROR
    "message send failure", "message receive failure", "communication shutdown failure",
    "connection timed out",                 # SLURM_COMMUNICATIONS_{CONNECT,WRITE,READ}_TIMEOUT
    "socket timed out on send/recv",        # SLURM_PROTOCOL_SOCKET_IMPL_TIMEOUT
    "zero bytes were transmitted or received",
    "rate limit exceeded",                  # SLURMCTLD_COMMUNICATIONS_BACKOFF / HARD_DROP
    "slurm backup controller in standby mode",  # ESLURM_IN_STANDBY_MODE
    "try again later",                      # ESLURM_TRANSITION_STATE_NO_UPDATE and kin
    "process is shutting down",             # SLURM_SHUTTING_DOWN
    "resource temporarily unavailable",     # EAGAIN
    "connection refused", "timed out",
)
ALREADY = {
    "delete": ("invalid node name specified",),             # ESLURM_INVALID_NODE_NAME
    "requeue": ("invalid job id", "job/step already completing or completed", "already completed"),
}


def classify(text: str, command: str = "") -> str:
    """``transient``, ``already`` or ``permanent`` for a failed command's output."""
    low = (text or "").lower()
    if any(marker in low for marker in ALREADY.get(command, ())):
        return "already"
    if any(marker in low for marker in TRANSIENT):
        return "transient"
    return "permanent"
