"""``QuietPolls`` skips a site's poll only while every input its docstring names stands: after a
steady poll, a store write, a held miss, other rules, a listing the driver does not vouch for, or
a poll that was not steady each make the next poll run. (The whole-run check is
tests/sim/test_quiet_poll_exact.py; this one makes each condition fail on its own.)"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from epu.common.messages import LaunchRequest
from epu.services.provisioner.provisioner import PollResult
from epu.services.provisioner.reconcile import Rules
from epu.services.provisioner.store import Miss

from epu.sim.provisioner_memstore import MemoryStore
from epu.sim.quiet_poll import QuietPolls

RULES = Rules(deployment="d", store_id="s", vanish_misses=3, vanish_min_seconds=60.0, orphan_grace_seconds=600.0,
              max_destroys=5, resume_after_seconds=30.0)


@dataclass
class FakeProv:
    """What ``QuietPolls`` calls of a ``Provisioner``: ``poll`` (counted) and ``rules``."""

    steady: bool = True
    rules_now: Rules = RULES
    polls: int = 0

    def poll(self, site: str) -> PollResult:
        self.polls += 1
        return PollResult(0, self.steady)

    def rules(self) -> Rules:
        return self.rules_now


@dataclass
class FakeDriver:
    """A driver whose last answer is fixed and whose ``listing_unchanged`` says what it is told."""

    unchanged: bool = True
    last_answer: tuple = field(default_factory=lambda: (object(),))
    asked: list = field(default_factory=list)

    def listing_unchanged(self, nodes: tuple) -> bool:
        self.asked.append(nodes)
        return self.unchanged and nodes is self.last_answer


def _polled(quiet: QuietPolls, prov: FakeProv, driver: FakeDriver, store: MemoryStore) -> bool:
    before = prov.polls
    quiet.poll(prov, "site", driver, store)  # type: ignore[arg-type]
    return prov.polls > before


def _setup() -> tuple[QuietPolls, FakeProv, FakeDriver, MemoryStore]:
    quiet, prov, driver, store = QuietPolls(), FakeProv(), FakeDriver(), MemoryStore()
    assert _polled(quiet, prov, driver, store)  # the first poll runs
    assert not _polled(quiet, prov, driver, store)  # steady, nothing changed: skipped
    return quiet, prov, driver, store


def test_a_store_write_makes_the_next_poll_run() -> None:
    quiet, prov, driver, store = _setup()
    store.record_launch(LaunchRequest(launch_id="L1", domain="dom", site="site", node_name="n"), 0.0)
    assert _polled(quiet, prov, driver, store)
    assert not _polled(quiet, prov, driver, store)


def test_a_held_miss_makes_every_poll_run() -> None:
    quiet, prov, driver, store = _setup()
    store.save_misses([Miss("L1", "site", 1, 0.0, 0.0)], [])
    assert _polled(quiet, prov, driver, store)
    assert _polled(quiet, prov, driver, store)


def test_other_rules_make_the_next_poll_run() -> None:
    quiet, prov, driver, store = _setup()
    prov.rules_now = replace(RULES, vanish_misses=4)
    assert _polled(quiet, prov, driver, store)
    assert not _polled(quiet, prov, driver, store)


def test_a_listing_the_driver_does_not_vouch_for_makes_the_poll_run() -> None:
    quiet, prov, driver, store = _setup()
    driver.unchanged = False
    assert _polled(quiet, prov, driver, store)
    assert _polled(quiet, prov, driver, store)
    assert all(nodes is driver.last_answer for nodes in driver.asked)  # the steady poll's own listing


def test_a_poll_that_was_not_steady_is_not_skipped_after() -> None:
    quiet, prov, driver, store = _setup()
    prov.steady, driver.unchanged = False, False
    assert _polled(quiet, prov, driver, store)
    driver.unchanged = True
    assert _polled(quiet, prov, driver, store)  # the last poll planned something: run again
    prov.steady = True
    assert _polled(quiet, prov, driver, store)
    assert not _polled(quiet, prov, driver, store)


def test_off_runs_every_poll() -> None:
    quiet, prov, driver, store = QuietPolls(enabled=False), FakeProv(), FakeDriver(), MemoryStore()
    assert all(_polled(quiet, prov, driver, store) for _ in range(5))
