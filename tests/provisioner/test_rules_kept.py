"""``Provisioner.rules()`` hands out the same ``Rules`` object while the identity and settings it
is made from are the very same values, and a new one as soon as any is set again (even to an
equal value of another type): over random changes of the settings, every answer has exactly the
fields, values and value types a freshly made one has, and a reconcile's ``resume_after`` never
sticks."""

from __future__ import annotations

import random

import pytest
from epu.services.provisioner.provisioner import Provisioner, ProvisionerSettings

from epu.sim.provisioner_memstore import MemoryStore


def _fields(rules) -> list[tuple[object, type]]:  # type: ignore[no-untyped-def]
    return [(v, type(v)) for v in vars(rules).values()]


@pytest.mark.parametrize("seed", range(4))
def test_kept_rules_are_freshly_made_ones(seed: int) -> None:
    rng = random.Random(seed)
    prov = Provisioner(MemoryStore(), {}, lambda _e: None, settings=ProvisionerSettings(deployment="d"))
    st, same = prov.settings, 0
    for _ in range(300):
        op = rng.random()
        if op < 0.15:
            st.vanish_misses = rng.choice((2, 3, 3.0))
        elif op < 0.3:
            st.vanish_min_seconds = rng.choice((60.0, 60, 30.0))
        elif op < 0.4:
            st.orphan_grace_seconds = rng.choice((600.0, 10.0))
        elif op < 0.5:
            st.max_destroys_per_reconcile = rng.choice((5, 1))
        elif op < 0.6:
            st.resume_after_seconds = rng.choice((30.0, 0.0, 30))
        resume_after = rng.choice((None, None, None, 0.0, 12.5))
        before = prov._rules
        rules = prov.rules(resume_after)
        assert _fields(rules) == _fields(prov._make_rules(resume_after))
        same += before is not None and resume_after is None and rules is before[1]
    assert same > 50
