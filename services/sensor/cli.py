"""``epu sensor snapshot``: what the sensor sees on this head node, for an operator to check.

Why: before letting EPU act on a cluster, an admin should see the normalized view — which
jobs count as demand, which are held or blocked, and how every node's native state maps — and
compare it with ``squeue``/``qstat``/``condor_q`` on the same machine.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from epu.services.sensor.backend import BackendUnavailable, Observation

DESCRIPTION = """\
Read the local batch head node once, through the same backend and normalization the sensor
service uses, and print the result. Nothing is published and nothing is changed.

Demand is only jobs a new node could start (waiting for resources or priority). Pending jobs
are grouped into shapes (nodes, cores, memory, GPUs, features, partition, time limit) with
the native pending reason; held jobs, dependencies, begin times and limits (QOS, association,
licenses...) are listed but are not demand. Job arrays count each pending element. Node
states are normalized to:

  free     in service and can take work (it may already run some)
  busy     in service and full
  offline  taken out of service (draining while it still runs jobs, drained when empty)
  down     not reachable / not usable
  unknown  a native state the sensor has no mapping for (a warning is printed)

The mapping from every native state is in docs/sensor-states.md, every pending reason in
docs/pending-reasons.md.
"""

EPILOG = """\
JSON output (--json): an object with
  backend, queued_jobs, queued_cores, held_jobs, blocked_jobs, running_jobs, finished_jobs,
  shapes [{count, nodes, cores, memory_mb, gpus, features, partition, time_limit_s, demand,
           reason, reason_class, max_wait_s, sample_job_ids}]   pending jobs grouped by request
  jobs   [{job_id, state, cores, nodes, count, queue, wait_seconds}]   a sample (at most 200)
  nodes  [{name, state, native_state, cores, cores_used, jobs, instance_id, memory_mb,
           memory_used_mb, gpus, gpus_used, features, partitions}]
  warnings [text]
queued_jobs counts only demand (jobs a new node could start); held jobs, dependencies and
limits (QOS, association, licenses, ...) are demand: false with their native reason. Every
reason and its class: docs/pending-reasons.md.

Exit status: 0 read fine, 1 the batch system could not be read (error on stderr), 2 bad usage.

Examples:
  epu sensor snapshot --backend slurm
  SLURM_CONF=/etc/slurm/slurm.conf epu sensor snapshot --backend slurm --json | jq .queued_cores
  epu sensor snapshot --backend torque --option bin_dir=/usr/local/bin
  epu sensor snapshot --backend htcondor --option pool=cm.example.org
"""


def observation_to_json(backend: str, obs: Observation) -> dict[str, Any]:
    return {
        "backend": backend,
        "queued_jobs": obs.queued_jobs,
        "queued_cores": obs.queued_cores,
        "held_jobs": obs.held_jobs,
        "blocked_jobs": obs.blocked_jobs,
        "running_jobs": obs.running_jobs,
        "finished_jobs": obs.finished_jobs,
        "shapes": [s.model_dump(mode="json") for s in obs.all_shapes()],
        "jobs": [{"job_id": j.job_id, "state": j.state, "cores": j.cores, "nodes": j.nodes, "count": j.count,
                  "queue": j.queue, "wait_seconds": round(j.wait_seconds, 1)} for j in obs.jobs],
        "nodes": [{"name": n.name, "state": n.state, "native_state": n.native_state, "cores": n.cores,
                   "cores_used": n.cores_used, "jobs": list(n.jobs), "instance_id": n.instance_id,
                   "memory_mb": n.memory_mb, "memory_used_mb": n.memory_used_mb, "gpus": n.gpus,
                   "gpus_used": n.gpus_used, "features": list(n.features), "partitions": list(n.partitions)}
                  for n in obs.nodes],
        "warnings": list(obs.warnings),
    }


def render_table(doc: dict[str, Any]) -> str:
    lines = [f"backend {doc['backend']}: {doc['queued_jobs']} queued job(s) needing {doc['queued_cores']} "
             f"core(s); {doc['held_jobs']} held, {doc['blocked_jobs']} blocked, {doc['running_jobs']} running"]
    if doc["nodes"]:
        width = max(4, *(len(n["name"]) for n in doc["nodes"]))
        lines.append(f"{'NODE':<{width}}  {'STATE':<8} {'CORES':>5} {'USED':>5}  {'NATIVE':<28} JOBS")
        for n in doc["nodes"]:
            jobs = ",".join(n["jobs"][:6]) + (" ..." if len(n["jobs"]) > 6 else "")
            lines.append(f"{n['name']:<{width}}  {n['state']:<8} {n['cores']:>5} {n['cores_used']:>5}  "
                         f"{n['native_state'][:28]:<28} {jobs}")
    else:
        lines.append("(no nodes)")
    if doc["shapes"]:
        lines.append("")
        lines.append(f"{'JOBS':>6} {'DEMAND':<6} {'NODES':>5} {'CORES':>5} {'MEM_MB':>7} {'GPUS':>4}  "
                     f"{'PARTITION':<12} {'LIMIT':>7}  {'REASON':<24} FEATURES / E.G.")
        for s in doc["shapes"][:60]:
            limit = f"{s['time_limit_s'] // 60}m" if s["time_limit_s"] else "-"
            extra = ",".join(s["features"]) or "-"
            lines.append(f"{s['count']:>6} {'yes' if s['demand'] else 'no':<6} {s['nodes']:>5} {s['cores']:>5} "
                         f"{s['memory_mb']:>7} {s['gpus']:>4}  {s['partition'][:12]:<12} {limit:>7}  "
                         f"{(s['reason'] or s['reason_class'])[:24]:<24} {extra} {' '.join(s['sample_job_ids'][:2])}")
        if len(doc["shapes"]) > 60:
            lines.append(f"... and {len(doc['shapes']) - 60} more shapes")
    for w in doc["warnings"]:
        lines.append(f"warning: {w}")
    return "\n".join(lines)


def _options(pairs: list[str]) -> dict[str, Any]:
    import tomllib

    out: dict[str, Any] = {}
    for pair in pairs:
        if "=" not in pair:
            raise SystemExit(f"epu sensor snapshot: --option needs KEY=VALUE, got {pair!r}")
        key, value = pair.split("=", 1)
        try:
            out[key.strip()] = tomllib.loads(f"v = {value}")["v"]
        except tomllib.TOMLDecodeError:
            out[key.strip()] = value
    return out


def cmd_snapshot(args: argparse.Namespace) -> int:
    from epu.common.cliargs import config_path
    from epu.common.clock import RealClock
    from epu.common.config import SensorConfig, load_config
    from epu.services.sensor.factory import make_backend

    path = config_path(args.config, required=False)  # --backend/--option suffice without one
    base = load_config(path).sensor if path else SensorConfig()
    options = {**(base.options if base.backend == args.backend else {}), **_options(args.option)}
    sc = base.model_copy(update={"backend": args.backend, "options": options,
                                 "command_timeout_seconds": args.timeout})
    try:
        backend = make_backend(sc, RealClock())
        obs = backend.snapshot()
    except BackendUnavailable as exc:
        print(f"epu sensor snapshot: cannot read {args.backend}: {exc}", file=sys.stderr)
        return 1
    except (ImportError, ValueError) as exc:
        print(f"epu sensor snapshot: {args.backend} backend unusable here: {exc}", file=sys.stderr)
        return 1
    doc = observation_to_json(args.backend, obs)
    print(json.dumps(doc, indent=2) if args.json else render_table(doc))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    from epu.common.cliargs import nonneg_float

    p = sub.add_parser("sensor", help="inspect the batch head node the way the sensor sees it",
                       description="Sensor tools for operators, run on the batch head node: see what the sensor\n"
                                   "sees (queued jobs by shape, nodes with their normalized state) without\n"
                                   "a broker or any other EPU service.",
                       epilog="Examples:\n  epu sensor snapshot --backend slurm\n"
                              "  epu sensor snapshot --backend torque --json -c /etc/epu/epu.toml\n\n"
                              "Exit status: see `epu sensor snapshot --help`; 2 when no ACTION is given.",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.set_defaults(func=lambda _args: p.print_help() or 2)
    ssub = p.add_subparsers(dest="sensor_command", metavar="ACTION")
    s = ssub.add_parser("snapshot", help="print the normalized queue and nodes of the local head node",
                        description=DESCRIPTION, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    s.add_argument("--backend", required=True, choices=["torque", "slurm", "htcondor"],
                   help="which batch system to read")
    s.add_argument("--json", action="store_true", help="print JSON instead of a table")
    s.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                   help="backend option as in [sensor.options] (repeatable), e.g. bin_dir=/opt/slurm/bin")
    s.add_argument("--timeout", type=nonneg_float, default=60.0, metavar="SECONDS",
                   help="timeout per batch command (default 60)")
    s.add_argument("-c", "--config", metavar="FILE",
                   help="take [sensor.options] from this TOML config when its backend matches")
    s.set_defaults(func=cmd_snapshot)
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])
