"""Pick and configure the backend named in ``[sensor] backend`` from ``[sensor.options]``.

Options per backend (all optional):

* simulated: ``nodes`` (table name → cores) or ``node_count``/``node_cores``/``node_prefix``
* torque: ``bin_dir`` (where qstat/pbsnodes/qmgr live), ``server``, ``use_pbs_python`` (default true)
* slurm: ``bin_dir``, ``partition`` (where added nodes go), ``features``, ``conf`` (SLURM_CONF)
* htcondor: ``pool`` (collector host), ``schedd`` (schedd name), ``drain_type`` (``peaceful``, the
  default: never evicts), ``template``,
  ``read_format`` (``bindings``, the default, or ``af``: condor_q/condor_status -af text, with
  ``bin_dir`` and ``condor_config``), ``shutdown_state_path`` (default: ``state_path`` +
  ``.htcondor-shutdowns.json``: the masters told to shut down, kept across restarts)
"""

from __future__ import annotations

from typing import Any

from epu.common.clock import Clock
from epu.common.config import SensorConfig
from epu.common.config.sensor import command_log_path
from epu.services.sensor.backend import BatchBackend


def make_backend(sc: SensorConfig, clock: Clock, backend: str | None = None) -> BatchBackend:
    name = backend or sc.backend
    opts: dict[str, Any] = dict(sc.options)
    timeout = sc.command_timeout_seconds
    if name == "simulated":
        from epu.services.sensor.simulated import SimulatedBatch

        nodes = opts.get("nodes")
        if nodes is None:
            n = int(opts.get("node_count", 0))
            nodes = {f"{opts.get('node_prefix', 'sim')}{i:03d}": int(opts.get("node_cores", 4)) for i in range(n)}
        return SimulatedBatch(clock, nodes={str(k): int(v) for k, v in nodes.items()})
    if name == "torque":
        from epu.services.sensor.torque.backend import TorqueBackend

        return TorqueBackend.from_options(opts, timeout=timeout, clock=clock)
    if name == "slurm":
        from epu.services.sensor.slurm.backend import SlurmBackend

        return SlurmBackend.from_options(opts, timeout=timeout, clock=clock)
    if name == "htcondor":
        from epu.services.sensor.htcondor.backend import HTCondorBackend

        path = command_log_path(sc)  # the masters told to shut down, kept beside the command log
        if path is not None and "shutdown_state_path" not in opts:
            opts["shutdown_state_path"] = f"{path}.htcondor-shutdowns.json"

        return HTCondorBackend.from_options(opts, timeout=timeout, clock=clock)
    raise ValueError(f"unknown sensor backend {name!r}")
