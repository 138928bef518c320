"""The mixed-shapes scenario, looked at after the run: each partition got its own type, no node
was launched for the limit-blocked or the unsatisfiable jobs, and the domain went back to zero
with them still pending (the invariants — nothing killed, convergence — are checked by the run)."""

from __future__ import annotations

from collections import Counter

import pytest

from epu.sim.scenarios import BLOCKED, MIXED_WAVES, get_scenario
from epu.sim.simulation import Simulation


@pytest.mark.parametrize("name", ["mixed-shapes", "mixed-shapes-faults"])
def test_types_per_partition_nothing_for_blocked_jobs_and_back_to_zero(name: str) -> None:
    sim = Simulation(get_scenario(name), seed=1)
    result = sim.run()
    assert not result.violations, [str(v) for v in result.violations[:5]]
    vms = [vm for c in sim.clouds.values() for vm in c.vms.values()]
    sizes = Counter(vm.size for vm in vms)
    # the dearer cpu type only as the failover of a capacity error
    assert set(sizes) <= {"sim.c4", "sim.r16", "sim.g8"} | ({"sim.m4"} if name.endswith("faults") else set())
    assert sizes["sim.c4"] and sizes["sim.r16"] and sizes["sim.g8"]
    assert all(vm.terminated_at is not None for vm in vms)  # back to zero
    inner = sim.batch.inner
    pending = Counter("blocked" if j.blocked == BLOCKED else f"{j.cores}c" for j in inner._queue)
    assert pending == {"blocked": 4, "64c": 1}  # still pending at the end, never started
    assert inner.completed == inner.submitted - 5
    if name == "mixed-shapes":
        # fault-free: at most the cheapest fit of each wave (4 x 1c per c4, 2 x 200 GB per r16, one GPU
        # job per g8); one launch for the 4 limit-blocked 1-core jobs would add a c4 to a wave
        assert sizes["sim.c4"] <= sum(-(-cpu // 4) + 2 * multi for cpu, _b, _g, multi in MIXED_WAVES)
        assert sizes["sim.r16"] <= sum(-(-b // 2) for _c, b, _g, _m in MIXED_WAVES)
        assert sizes["sim.g8"] <= sum(g for _c, _b, g, _m in MIXED_WAVES)
