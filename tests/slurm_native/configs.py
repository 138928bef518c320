"""A two-site engine config with a typed catalogue, for ``epu slurm conf``'s tests."""

from __future__ import annotations

from pathlib import Path

CONFIG = """\
[decision]
store_url = "sqlite:///{dir}/decision.db"

[domains.alpha]
policy = "queue-demand"
max_nodes = 6
sites = ["east", "west"]
default_partition = "cpu"

[domains.alpha.params]
idle_seconds = 120.0
stall_seconds = 240.0

[domains.alpha.partitions]
cpu = ["c2"]
bigmem = ["west/m8"]
gpu = ["g1"]

[sites.east]
driver = "epu-sim"
image = "img"
quota = 4

[sites.east.types.c2]
cores = 2
memory_mb = 1000
price_per_hour = 0.10

[sites.east.types.g1]
cores = 4
memory_mb = 4000
gpus = 1
features = ["gpu"]
price_per_hour = 1.00
quota = 2

[sites.west]
driver = "epu-sim"
image = "img"
quota = 4

[sites.west.types.c2]
cores = 2
memory_mb = 1000
price_per_hour = 0.12

[sites.west.types.m8]
cores = 2
memory_mb = 8000
features = ["bigmem"]
price_per_hour = 0.40
"""


def write_config(directory: Path, text: str = CONFIG) -> Path:
    path = directory / "epu.toml"
    path.write_text(text.format(dir=directory))
    return path
