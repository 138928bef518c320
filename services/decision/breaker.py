"""The circuit breaker: is this snapshot plausible enough to act on? Pure.

A snapshot in which most workers vanished at once — an HTCondor collector rejecting startd
ads, a wrong pool setting, a slurmctld restarting — must not be believed: after the stall
period every worker would be "lost" and terminated, running jobs and all. So before the
engine takes anything out on the word of a snapshot, it asks two questions:

* did more than ``share`` of the domain's joined nodes (and more than ``ok_count``) disappear?
  (joined: in service. A draining node leaving is what its drain asks for, ``census.counts_missing``)
  (cluster-autoscaler's max-total-unready-percentage and ok-total-unready-count);
* does the node list contradict ``running_jobs`` — jobs running on nodes that are not listed?

If so the breaker is open: no scale-down, no lost-node handling, until a snapshot answers both
questions well (or an operator releases it). Launches go on: demand is still real.
"""

from __future__ import annotations

from epu.common.messages import SensorSnapshot
from epu.services.decision.census import counts_missing
from epu.services.decision.view import Instance, NodeIndex


def check(instances: list[Instance], index: NodeIndex, snapshot: SensorSnapshot, *, share: float,
          ok_count: int) -> str:
    """Why this snapshot is implausible, or "" when it is fine."""
    if not snapshot.available:
        return ""
    known = [i for i in instances if counts_missing(i)]
    missing = sum(1 for i in known if index.find(i) is None)
    return missing_verdict(len(known), missing, share=share, ok_count=ok_count) or \
        jobs_verdict(snapshot, share=share, ok_count=ok_count)


def missing_verdict(known: int, missing: int, *, share: float, ok_count: int) -> str:
    """The first question, on counts (``census.refresh_census`` counts them in its pass):
    ``missing`` of the ``known`` joined nodes are not in the snapshot."""
    if known and missing > max(ok_count, share * known):
        return f"{missing} of {known} joined nodes missing from the snapshot at once"
    return ""


def jobs_verdict(snapshot: SensorSnapshot, *, share: float, ok_count: int) -> str:
    """The second question, a function of the snapshot alone (the engine asks it once per
    snapshot): does the node list hide most of ``running_jobs``?"""
    if not snapshot.available or not snapshot.running_jobs:
        return ""
    nodes = snapshot.nodes
    reports_jobs = any(n.jobs for n in nodes) or not any(n.cores_used for n in nodes)
    if reports_jobs:
        visible = len({j for n in nodes for j in n.jobs})
        hidden = snapshot.running_jobs - visible
        if hidden > max(ok_count, share * snapshot.running_jobs):
            return (f"{snapshot.running_jobs} jobs running but only {visible} on the {len(nodes)} "
                    f"listed node(s)")
    return ""
