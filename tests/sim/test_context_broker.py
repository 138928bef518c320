"""The context broker in the simulated world (issue 26, defect 3): agents join through the real
broker as VMs come and go, a job on a worker forges joins with its credential, and invariant 9
checks every member's cluster view. With the identity binding taken out (today's main: fqdn and
ip free), the same seeds find the defect."""

from __future__ import annotations

import pytest
from epu.services.ctxbroker import core, store

from epu.sim.scenarios import get_scenario
from epu.sim.simulation import Simulation


def _run(name: str, seed: int) -> tuple[list, dict]:
    sim = Simulation(get_scenario(name), seed)
    result = sim.run()
    return result.violations, result.stats["context"]


@pytest.mark.parametrize("name", ["context-broker", "context-broker-lossy"])
def test_members_publish_only_their_own_names_and_address(name: str) -> None:
    violations, stats = _run(name, 3)
    assert not violations, [str(v) for v in violations[:5]]
    assert stats["joins"] >= 5 and stats["forged_tried"] >= 20, stats
    assert stats["forged_refused"] == stats["forged_tried"], stats
    assert stats["honest_refused"] == 0, stats  # every honest agent gets in (held at most)
    if name == "context-broker-lossy":
        assert stats["held"] > 0, stats  # joins waited for the address, then went through


def test_without_the_binding_the_adversary_takes_the_heads_names(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(core, "check_names", lambda node, domain="": None)
    monkeypatch.setattr(store, "check_address", lambda node, facts: None)
    violations, stats = _run("context-broker", 3)
    assert stats["forged_refused"] < stats["forged_tried"], stats
    found = [str(v) for v in violations if v.invariant == 9]
    assert any("was accepted" in v for v in found), found
    assert any("publishes the name head" in v or "publishes the address 10.255.255.254" in v for v in found), found


REOPEN_SEEDS = (1, 2, 3)


def test_a_reopened_launchs_node_joins_again_and_is_listed() -> None:
    """Issue 33, defect 5: launches closed failed (a lost create answer, then a capacity refusal)
    whose nodes live are reopened by reconciliation; their agents, refused while the launch was
    failed, retry and get in: every live VM is listed within the bound (invariant 9)."""
    for seed in REOPEN_SEEDS:
        violations, stats = _run("context-broker-reopen", seed)
        assert not violations, [str(v) for v in violations[:5]]
        assert stats["honest_refused"] > 0, stats  # agents of failed launches were refused, then got in
        assert stats["unlisted"] == 0, stats


def test_a_credential_revoked_for_ever_on_failed_leaves_reopened_nodes_out(monkeypatch: pytest.MonkeyPatch) -> None:
    """The broker before issue 33: ``failed`` revoked for good, a reopening restored nothing."""
    monkeypatch.setattr(store.Store, "reopen", lambda self, instance_id, seq, now=None, announced=False: False)
    found = []
    for seed in REOPEN_SEEDS:
        violations, _stats = _run("context-broker-reopen", seed)
        found += [str(v) for v in violations if v.invariant == 9 and "is not in the context" in v.detail]
    assert len(found) >= len(REOPEN_SEEDS), found
