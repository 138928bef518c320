"""Render docs/sensor-states.md from the tables in ``states`` (so the doc cannot drift).

``python -m epu.services.sensor.statesdoc > docs/sensor-states.md``; a test checks the file is current.
"""

from __future__ import annotations

from epu.services.sensor import states as s

HEADER = """\
# Sensor: native batch states → normalized states

Generated from `services/sensor/states.py` by `python -m epu.services.sensor.statesdoc` — edit the
tables there, then regenerate; `tests/sensor/test_states_doc.py` fails when this file is stale.

Normalized node states:

| state | meaning |
|---|---|
| `free` | in service and can take work (it may already run some: `cores_used`/`jobs` say how much) |
| `busy` | in service and full (all cores in use, or the batch system takes no more) |
| `offline` | taken out of service by an admin or by EPU: *draining* while it still runs jobs, drained when empty |
| `down` | not reachable or not usable |
| `unknown` | the sensor cannot tell — **every native state not in these tables maps here, with a warning in the log and in `epu sensor snapshot`**, never a crash and never `free` |

A native state that combines several tokens (Torque `down,offline`, Slurm `IDLE+DRAIN`,
`DOWN*`) maps each token and keeps the strongest: **down > offline > unknown > busy > free**.
Tokens marked "—" are flags that do not change availability on their own. A node whose
state says `free` but whose cores are all in use is reported `busy`.

Jobs: only pending jobs a new node could start are demand; each pending job's native reason
decides (every reason of every backend: [pending-reasons.md](pending-reasons.md)). Running
and finished jobs are counted apart. Arrays count each pending element.
"""


def _table(title: str, table: dict, notes: dict, key_header: str = "native") -> str:
    lines = [f"### {title}", "", f"| {key_header} | normalized | note |", "|---|---|---|"]
    for key, value in table.items():
        lines.append(f"| `{key}` | {('`' + value + '`') if value else '—'} | {notes.get(key, '')} |")
    return "\n".join(lines) + "\n"


def render() -> str:
    parts = [HEADER]
    parts.append("## Torque (`pbsnodes -x` `<state>`, comma-separated)\n")
    parts.append(_table("Node state tokens", s.TORQUE_NODE_STATES, s.TORQUE_NODE_NOTES))
    parts.append("Examples seen on TORQUE 6.1.3: `job-exclusive` → busy; `offline,job-exclusive` → offline "
                 "(draining); `down,offline` → down; `down,offline,MOM-list-not-sent` (a node just created) → down.\n")
    parts.append(_table("Job states (`job_state`)", s.TORQUE_JOB_STATES, s.TORQUE_JOB_NOTES, "job_state"))
    parts.append("\n## Slurm (base state + flags; `sinfo --json`, or text such as `IDLE+DRAIN`, `DOWN*`, `idle~`)\n")
    parts.append(_table("Node state tokens", s.SLURM_NODE_STATES, s.SLURM_NODE_NOTES))
    suffixes = ", ".join(f"`{k}` = {v}" for k, v in s.SLURM_SUFFIXES.items())
    parts.append(f"Text suffixes: {suffixes}.\n\nExamples: `MIXED` → free; `IDLE+DRAIN` → offline (drained); "
                 "`MIXED+DRAIN` → offline (draining); `DOWN*` → down; `IDLE+CLOUD+POWERED_DOWN` → offline "
                 "(an unused CLOUD pool slot — left out of snapshots unless `include_powered_down`); "
                 "`COMPLETING` → busy.\n")
    parts.append(_table("Job states (`job_state`)", s.SLURM_JOB_STATES, {}, "job_state"))
    parts.append("Whether a `PENDING` job is demand depends on its reason: see "
                 "[pending-reasons.md](pending-reasons.md) for every Slurm, Torque and HTCondor reason.\n")
    parts.append("\n## HTCondor (startd slot `State`; a machine = its slots)\n")
    parts.append(_table("Slot states", s.HTCONDOR_SLOT_STATES, s.HTCONDOR_SLOT_NOTES, "State"))
    parts.append("A slot with `Draining == true`, or `Activity == \"Retiring\"` while draining, is offline. "
                 "Partitionable slots: cores = `TotalSlotCpus`, used = the `Cpus` of their dynamic slots "
                 "(separate ads). The machine is offline if any slot is (Owner/Drained/draining), unknown if "
                 "any slot state is unmapped, else busy when every core is claimed, else free. HTCondor "
                 "has no `down`: a machine that stops advertising disappears from the collector.\n")
    job = {str(k): v for k, v in s.HTCONDOR_JOB_STATUS.items()}
    notes = {str(k): v for k, v in s.HTCONDOR_JOB_NOTES.items()}
    parts.append(_table("Job status (`JobStatus`)", job, notes, "JobStatus"))
    parts.append("An idle job with `DeferralTime` in the future is `blocked`. Procs of one cluster with "
                 "the same request are one entry with `count`.\n")
    parts.append("\n## Simulated (the demo's cluster)\n\nNodes are `free`, `busy` (all cores used), "
                 "`offline` (offlined; draining while jobs run) or `down` (failed); jobs `queued` or `held`.\n")
    return "\n".join(parts)


if __name__ == "__main__":
    print(render(), end="")
