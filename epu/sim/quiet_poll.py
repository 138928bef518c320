"""Skipping a simulated provisioner's poll of a site when it would be exactly a no-op.

The provisioner service polls every site every ``poll_seconds``: it lists the site, reads the
site's records and misses from its store and runs ``reconcile.observe`` on them. Over a long
simulated run most of those polls find nothing to do (``PollResult.steady``), and converting the
listing and judging it again is most of a quiet site's cost. The service itself does not skip
them: in production the SQL store and libcloud's drivers hand out new objects on every read, so
nothing there could tell cheaply that nothing changed. The simulator's own cloud and store can:
``SimNodeDriver.listing_unchanged`` (the cloud counts its changes in ``SimCloud.version``) and
``MemoryStore.records_version``. ``QuietPolls`` uses them, on the simulator's side only.

Why a skipped poll cannot hide a fault: a site's poll is skipped only when all of these hold

- the site's last poll was run by the service and answered ``steady`` (every watched record's
  node listed, nothing to do), and what it saw is kept: the very Node objects the driver listed,
  the store's records version and the rules;
- no miss is held for the site (``observe`` counts misses; with none held, the listing time plays
  no part in it, see ``reconcile.Plan.steady``);
- the store's ``records_version`` is the one kept: no record was stored since, by any handle on
  that database, so ``records_for`` would answer with the very same records;
- ``Provisioner.rules()`` equals the rules kept (the identity and the settings the service reads);
- the driver's ``listing_unchanged`` says a listing now would return those very Node objects and
  do nothing but count the call (it counts it): the cloud's version stands, no node is due to
  boot or to leave the listing, and no fault can strike the call (no transient error, partial or
  wrong-state listing is possible, so no random draw is skipped).

``observe`` is a pure function of the nodes, the records, the misses and the rules, and the
service's ``LibcloudSite.nodes`` a pure conversion of the driver's Nodes: with every input the
same, the service's poll would list (counted either way), plan nothing again and write nothing
(an empty plan's ``save_misses`` and ``save_sightings`` write nothing). A skipped poll is
therefore the poll, event for event; ``tests/sim/test_quiet_poll_exact.py`` runs every scenario
with and without skipping and requires identical digests. Any input the kept state does not
cover (the SQL store, which has no records version; a store switched at a restart: a new
``QuietPolls`` per boot) means the poll runs.
"""

from __future__ import annotations

from dataclasses import dataclass

from libcloud.compute.base import Node

from epu.services.provisioner.provisioner import Provisioner
from epu.services.provisioner.reconcile import Rules
from epu.sim.cloud import SimNodeDriver
from epu.sim.provisioner_memstore import MemoryStore


@dataclass(frozen=True)
class _Steady:
    """What a site's last steady poll saw."""

    nodes: tuple[Node, ...]
    records_version: int
    rules: Rules


class QuietPolls:
    """Runs a site's poll through the service, or skips it when it is exactly a no-op (see the
    module docstring). One per provisioner boot."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self._steady: dict[str, _Steady] = {}
        self.skipped = 0
        """Polls skipped (a test checks that skipping happened)."""
        self.run = 0
        """Polls run by the service."""

    def poll(self, prov: Provisioner, site: str, driver: SimNodeDriver, store: object) -> None:
        """Poll ``site`` as ``prov.poll`` does: skipped when exactly a no-op, else run."""
        last = self._steady.pop(site, None)
        if last is not None and isinstance(store, MemoryStore) and self._stands(last, prov, site, driver, store):
            self._steady[site] = last
            self.skipped += 1
            return
        self.run += 1
        result = prov.poll(site)
        if not (self.enabled and result.steady and isinstance(store, MemoryStore)):
            return
        listed = driver.last_answer
        if listed is not None:  # the poll's own listing: a steady poll makes no other cloud call
            self._steady[site] = _Steady(listed, store.records_version(), prov.rules())

    @staticmethod
    def _stands(last: _Steady, prov: Provisioner, site: str, driver: SimNodeDriver, store: MemoryStore) -> bool:
        """Would the service's poll now see exactly what ``last`` saw? The driver's test goes
        last: when it answers yes it counts the listing call as made."""
        return (not store.misses(site) and store.records_version() == last.records_version
                and prov.rules() == last.rules and driver.listing_unchanged(last.nodes))


__all__ = ["QuietPolls"]
