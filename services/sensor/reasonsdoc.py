"""Render docs/pending-reasons.md from the tables in ``reasons`` (so the doc cannot drift).

``python -m epu.services.sensor.reasonsdoc > docs/pending-reasons.md``; a test checks the file is current.
"""

from __future__ import annotations

from epu.services.sensor import reasons as r

HEADER = """\
# Sensor: pending reasons → demand or not

Generated from `services/sensor/reasons.py` by `python -m epu.services.sensor.reasonsdoc` — edit the
tables there, then regenerate; `tests/sensor/test_states_doc.py` fails when this file is stale.

A pending job is **demand** only when a new node could start it. Every pending job is reported in a
shape (`epu sensor snapshot --json`, key `shapes`) with its native `reason`, the `reason_class`
below, and `demand`. `queued_jobs` counts only demand; held jobs, dependencies, begin times and
limits are reported with `demand: false`. **A reason missing from these tables counts as not
demand**, with a warning in the sensor's log and in `epu sensor snapshot` — the cautious side: an
unknown reason costs waiting, never a VM that the job cannot use.

| class | demand | meaning |
|---|---|---|
"""


def _table(title: str, table: dict[str, tuple[str, str]], key_header: str) -> str:
    lines = [f"### {title}", "", f"| {key_header} | class | demand | note |", "|---|---|---|---|"]
    for key, (cls, note) in table.items():
        demand = "**yes**" if r.REASON_CLASSES[cls][0] else "no"
        lines.append(f"| `{key}` | {cls} | {demand} | {note} |")
    return "\n".join(lines) + "\n"


def render() -> str:
    parts = [HEADER + "\n".join(f"| `{c}` | {'**yes**' if d else 'no'} | {m} |"
                                for c, (d, m) in r.REASON_CLASSES.items()) + "\n"]
    parts.append(f"\n## Slurm (`state_reason`, {len(r.SLURM_REASONS)} reasons of 22.05, 23.02, 23.11, 24.05 "
                 "and 24.11)\n")
    parts.append("The note starts with the reason's name in Slurm's `enum job_state_reason`. The text read "
                 "(`squeue -O`) sees the job's description when slurmctld set one; the descriptions it writes "
                 "are mapped back to these reasons (`services/sensor/slurm/text.py`), and a job whose text is "
                 "neither is read again with `squeue --json`. A `PENDING` job with priority 0, or in state "
                 "`REQUEUE_HOLD`/`SPECIAL_EXIT`, is held whatever its reason.\n")
    parts.append("Seen on real Slurm 22.05 daemons, read by the sensor (`tests/sensor/slurm/*_integration.py`, a "
                 "private cluster; with a private slurmdbd and MariaDB for the accounting limits): `JobHeldUser`, "
                 "`Dependency`, `Licenses`, `JobArrayTaskLimit`, `QOSMaxJobsPerUserLimit` (a QOS with "
                 "`MaxJobsPerUser=1`), `AssocGrpCpuLimit` (an association with `GrpTRES=cpu=1`) and, as demand, a job waiting "
                 "for a full node (`Resources` or `Priority`); the other reasons are tested on the parser.\n")
    parts.append(_table("Reasons", dict(sorted(r.SLURM_REASONS.items())), "state_reason"))
    parts.append("\n## Torque (`job_state`, `Hold_Types`, `depend`)\n\nTorque reports no pending reason: the "
                 "reason is the job state, and for a held job `H/<hold type>` (`H/depend` when it has a "
                 "dependency).\n")
    parts.append(_table("Reasons", r.TORQUE_REASONS, "reason"))
    parts.append("\n## HTCondor (`JobStatus`, `DeferralTime`, `Requirements` against the worker template)\n\n"
                 "With `[sensor.options] template` (the machine attributes a new worker advertises), an idle "
                 "job's `Requirements` are evaluated against it, once per distinct requirement and request.\n")
    parts.append(_table("Reasons", r.HTCONDOR_REASONS, "reason"))
    return "\n".join(parts)


if __name__ == "__main__":
    print(render(), end="")
