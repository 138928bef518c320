"""A node command answered with an error is planned again after a backoff, not at every iteration.

Why: an error answer is news about the batch system — its controller down, a node that refuses
removal while the schedd still lists its jobs, an add the controller cannot take — and the life
cycle used to plan the same command anew at the next iteration, so a batch system that stayed
down for an hour was asked 360 times an hour per node (invariant 12, "bounded work", in
``htcondor-two-views`` and ``our-outage``). Now each (instance, command kind) that failed waits a
doubling delay, from ``initial`` to ``maximum``, before the planner may send it again; a success,
or the instance's end, clears it. An operator sees nothing new: the command still goes, less often.

Kept in memory, not in the store: an engine that restarts (or takes a domain over) asks once at
once, which is only the old behaviour once."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class _Backoff:
    failures: int
    until: float
    command_id: str


class CommandRetries:
    """Per (instance, kind): how long a failed node command waits before it is planned again."""

    def __init__(self, initial: float = 20.0, maximum: float = 300.0) -> None:
        self.initial = initial
        self.maximum = maximum
        self._waiting: dict[tuple[str, str], _Backoff] = {}

    def answered(self, instance_id: str, kind: str, command_id: str, ok: bool, now: float) -> None:
        """A command's answer. The same command answered twice (a redelivery, a handler run again
        after a conflict) counts once."""
        key = (instance_id, kind)
        if ok:
            self._waiting.pop(key, None)
            return
        prev = self._waiting.get(key)
        if prev is not None and prev.command_id == command_id:
            return
        n = (prev.failures if prev is not None else 0) + 1
        delay = min(self.maximum, self.initial * 2 ** (n - 1))
        self._waiting[key] = _Backoff(n, now + delay, command_id)

    def waiting(self, now: float) -> set[tuple[str, str]]:
        """The (instance, kind) pairs not to plan now."""
        return {k for k, b in self._waiting.items() if b.until > now}

    def next_end(self, now: float) -> float | None:
        """When the first backoff still running ends (an iteration may then plan again)."""
        ends = [b.until for b in self._waiting.values() if b.until > now]
        return min(ends) if ends else None

    def forget(self, instance_ids: set[str] | None = None) -> None:
        """Drop the backoffs of ``instance_ids`` (ended instances), or all."""
        if instance_ids is None:
            self._waiting.clear()
        else:
            self._waiting = {k: b for k, b in self._waiting.items() if k[0] not in instance_ids}

    def __len__(self) -> int:
        return len(self._waiting)


__all__ = ["CommandRetries"]
