"""A provisioner process for the crash test: launches N instances, and (with
EPU_PROVISIONER_CRASH_AT=after_cloud_call) is SIGKILLed by its own crash point right after the
first create call returns — before the store learns the cloud id.

Usage: python -m tests.provisioner.crash_worker STORE_URL CLOUD_DB COUNT
"""

from __future__ import annotations

import sys
import time

from epu.common.config.provisioner import SiteConfig
from epu.common.messages import LaunchRequest
from epu.services.provisioner.cloud import LibcloudSite
from epu.services.provisioner.provisioner import Provisioner, ProvisionerSettings
from epu.services.provisioner.sim import SimulatedNodeDriver
from epu.services.provisioner.store import Store


def main() -> None:
    url, cloud_db, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    cfg = SiteConfig(driver="epu-sim", image="sim-image", size="sim.1core", max_in_flight=4,
                     rate_limit_per_second=1000.0)
    driver = SimulatedNodeDriver(path=cloud_db, api_latency=0.05)
    prov = Provisioner(Store(url), {"sim": LibcloudSite("sim", cfg, driver, "epu")}, lambda e: None,
                       settings=ProvisionerSettings(deployment="epu"))
    requests = [LaunchRequest(launch_id=f"crash-{i}", domain="alpha", site="sim", node_name=f"c{i}")
                for i in range(count)]
    for req in requests:  # intents first, as a consumer with prefetch would have them
        prov.store.record_launch(req, time.time())
    for req in requests:  # then driven, as on redelivery
        prov.handle_launch(req)
    print("stored", flush=True)
    prov.wait_idle(60)
    time.sleep(0.5)
    print("not killed", flush=True)


if __name__ == "__main__":
    main()
