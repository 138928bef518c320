"""Instance types from the clouds: each site that ``discover``s sizes lists them (libcloud
``list_sizes()``) and turns them into instance types, config overrides winning.

Why here: the provisioner holds the drivers and the credentials; the engine holds neither. The
types found go to the engine in the provisioner's periodic ``instance.report`` (``offered``), so
its catalogue of such a site is what the cloud offers (EC2 sizes carry vCPUs, RAM, GPUs and an
on-demand price) rather than only what the config spelled out.

Listed at start and every ``[provisioner] discover_seconds`` on the site's observer thread (a
slow cloud never holds up the message loop). A failed listing keeps the last good catalogue
(with a log line); a site whose listing never succeeded offers nothing discovered yet, only its
declared types with cores (``site_types``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Mapping
from typing import Any

from epu.common.config.catalogue import InstanceType, site_types
from epu.common.messages import OfferedType

log = logging.getLogger("epu.provisioner.discovery")


class Catalogues:
    """Site → the instance types its last successful listing gave. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._types: dict[str, list[InstanceType]] = {}
        self._declared: dict[str, tuple[Any, list[InstanceType]]] = {}
        """Site → (its config, the types it declares): a launch's price without a catalogue built per launch."""

    def discover(self, name: str, site: Any, list_sizes: Any) -> list[InstanceType]:
        """List ``site``'s sizes with ``list_sizes()`` (a rate-limited, retried cloud call) and
        keep the types they make; raises what the listing raised (the last catalogue stays)."""
        sizes = list_sizes()
        types = site_types(name, site.config, list(sizes))
        with self._lock:
            self._types[name] = types
        log.info("instance types discovered", extra={"site": name, "types": len(types), "sizes": len(sizes)})
        return types

    def get(self, name: str) -> list[InstanceType] | None:
        with self._lock:
            types = self._types.get(name)
        return list(types) if types is not None else None

    def price_at_launch(self, name: str, config: Any, instance_type: str) -> float | None:
        """$/h of one instance of ``instance_type`` at site ``name`` (its ``SiteConfig``) as this
        provisioner's catalogue says now — what its record keeps as the price at launch (None:
        nobody priced it). "" is the site's single type (its ``price_per_hour``)."""
        if not instance_type:
            return config.price_per_hour
        types = self.get(name)
        if types is None:
            declared = self._declared.get(name)
            if declared is None or declared[0] is not config:
                declared = self._declared[name] = (config, site_types(name, config))
            types = declared[1]
        for t in types:
            if instance_type in (t.name, t.size):
                return t.price
        return None

    def offered(self, sites: Iterable[str]) -> dict[str, list[OfferedType]]:
        """What ``instance.report`` carries for a domain using ``sites``: the discovered ones."""
        out = {}
        for name in sites:
            types = self.get(name)
            if types is not None:
                out[name] = [to_offered(t) for t in types]
        return out


def to_offered(t: InstanceType) -> OfferedType:
    return OfferedType(name=t.name, size=t.size, cores=t.cores, memory_mb=t.memory_mb, gpus=t.gpus,
                       features=list(t.features), price_per_hour=t.price_per_hour, priced=t.priced, spot=t.spot, quota=t.quota,
                       image=t.image)


def domain_sites(domains: Mapping[str, Any], sites: Iterable[str]) -> dict[str, list[str]]:
    """Domain → the sites it may use (its ``sites``, else every site)."""
    names = list(sites)
    return {d: list(cfg.sites) or names for d, cfg in domains.items()}
