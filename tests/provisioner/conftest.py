"""Fixtures for the provisioner: a simulated cloud, a store, and a Provisioner wired to both."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import pytest
from epu.common.clock import ManualClock
from epu.common.config.provisioner import SiteConfig
from epu.common.messages import InstanceEvent
from epu.services.provisioner.cloud import LibcloudSite
from epu.services.provisioner.provisioner import Provisioner, ProvisionerSettings
from epu.services.provisioner.runner import RetryPolicy
from epu.services.provisioner.sim import SimulatedNodeDriver
from epu.services.provisioner.store import Store
from epu.services.provisioner.userdata import UserdataRenderer

FAST_RETRY = RetryPolicy(attempts=5, initial=0.001, maximum=0.01, jitter=0.005)


class Events:
    """Collects published events; thread-safe, like the real publisher."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.items: list[InstanceEvent] = []
        self._listeners: list[Callable[[InstanceEvent], object]] = []

    def __call__(self, event: InstanceEvent) -> None:
        with self._lock:
            self.items.append(event)
        for listener in self._listeners:
            listener(event)

    def subscribe(self, listener: Callable[[InstanceEvent], object]) -> None:
        """Also hand every event to ``listener`` (as the service hands them to its metrics)."""
        self._listeners.append(listener)

    def for_(self, instance_id: str) -> list[InstanceEvent]:
        with self._lock:
            return [e for e in self.items if e.instance_id == instance_id]

    def states(self, instance_id: str) -> list[str]:
        return [e.state for e in self.for_(instance_id)]


def site_config(**kw: object) -> SiteConfig:
    base: dict[str, object] = {"driver": "epu-sim", "image": "sim-image", "size": "sim.1core",
                               "rate_limit_per_second": 1000.0, "max_in_flight": 8}
    base.update(kw)
    return SiteConfig.model_validate({k: v for k, v in base.items() if v is not None})  # None: drop the default


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def cloud(tmp_path, clock: ManualClock) -> SimulatedNodeDriver:
    return SimulatedNodeDriver(path=str(tmp_path / "cloud.db"), boot_time_min=10, boot_time_max=20,
                               clock=clock, seed=1)


@pytest.fixture
def made() -> Iterator[list[Provisioner]]:
    """Provisioners a test made: stopped and their stores closed at the end."""
    out: list[Provisioner] = []
    yield out
    for p in out:
        p.shutdown(wait=True)
        p.store.close()


@pytest.fixture
def make_provisioner(sqlite_url: str, clock: ManualClock,
                     made: list[Provisioner]) -> Callable[..., tuple[Provisioner, Events]]:

    def make(drivers: dict[str, SimulatedNodeDriver], *, url: str | None = None, deployment: str = "epu",
             grace: float = 600.0, site_kw: dict[str, object] | None = None,
             clock_: object = None, on_cloud_call: object = None) -> tuple[Provisioner, Events]:
        events = Events()
        sites = {name: LibcloudSite(name, site_config(**(site_kw or {})), d, deployment)
                 for name, d in drivers.items()}
        renderers = {name: UserdataRenderer.from_path() for name in drivers}
        prov = Provisioner(Store(url or sqlite_url), sites, events, clock=clock_ or clock, renderers=renderers,
                           settings=ProvisionerSettings(deployment=deployment, orphan_grace_seconds=grace,
                                                        retry=FAST_RETRY), on_cloud_call=on_cloud_call)
        made.append(prov)
        return prov, events

    return make
