"""``InlineRunner``: the site runner without threads, for the simulator (deterministic)."""

from __future__ import annotations

import pytest
from epu.services.provisioner.runner import InlineRunner, RetryPolicy
from libcloud.common.exceptions import BaseHTTPError
from libcloud.common.types import LibcloudError


def test_tasks_and_observations_go_to_the_callers_scheduler_and_observations_do_not_pile_up():
    queued: list[tuple[str, object]] = []
    r = InlineRunner("s", lambda fn, what: queued.append((what, fn)))
    ran: list[str] = []
    r.submit(lambda: ran.append("launch"))
    assert r.observe("poll", lambda: ran.append("poll"))
    assert not r.observe("poll", lambda: ran.append("poll again"))  # one of a kind at a time
    assert [w for w, _ in queued] == ["task", "poll"] and ran == [] and r.in_flight == 1
    for _, fn in queued:
        fn()
    assert ran == ["launch", "poll"] and r.in_flight == 0
    assert r.observe("poll", lambda: ran.append("poll 2"))  # free again once it ran


def test_transient_errors_are_retried_without_real_sleep_others_raise_at_once():
    slept: list[float] = []
    r = InlineRunner("s", lambda fn, what: fn(), RetryPolicy(attempts=4, initial=0.5), sleep=slept.append)
    calls = []

    def flaky():
        calls.append(1)
        if len(calls) < 3:
            raise BaseHTTPError(503, "ServiceUnavailable")
        return "ok"

    assert r.call(flaky, "create") == "ok" and len(calls) == 3 and len(slept) == 2
    with pytest.raises(LibcloudError):
        r.call(lambda: (_ for _ in ()).throw(LibcloudError("InsufficientInstanceCapacity", None)), "create")


def test_a_shut_down_runner_drops_what_was_queued():
    queued = []
    r = InlineRunner("s", lambda fn, what: queued.append(fn))
    ran = []
    r.submit(lambda: ran.append(1))
    r.shutdown()
    queued[0]()
    assert ran == []
