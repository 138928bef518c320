"""docs/promises.md: every promise names invariants and scenarios that exist, and every invariant
checks some promise (a promise without an invariant is a hope; an invariant without a promise is
a check nobody relies on)."""

from __future__ import annotations

import re
from pathlib import Path

from epu.sim.invariants import NAMES
from epu.sim.scenarios import names

DOC = Path(__file__).resolve().parents[2] / "docs" / "promises.md"
MARK = "<!-- promises:"


def rows(text: str) -> list[tuple[str, str, list[int], list[str]]]:
    """The table after the marker: (promise, made in, invariants, scenarios) per row."""
    lines = text.split(MARK, 1)[1].splitlines()
    table = [ln for ln in lines if ln.startswith("|")]
    header = [c.strip() for c in table[0].strip("|").split("|")]
    assert header == ["promise", "made in", "invariants", "scenarios that challenge it"], header
    out = []
    for ln in table[2:]:
        promise, made, inv, scen = (c.strip() for c in ln.strip().strip("|").split("|"))
        out.append((promise, made, [int(x) for x in inv.replace(" ", "").split(",") if x],
                    [s.strip() for s in scen.split(",") if s.strip()]))
    return out


def problems(text: str) -> list[str]:
    known = set(names())
    out = []
    checked: set[int] = set()
    for promise, _made, invariants, scenarios in rows(text):
        what = promise[:60]
        if not invariants:
            out.append(f"{what}: no invariant")
        if not scenarios:
            out.append(f"{what}: no scenario")
        out += [f"{what}: no invariant {i}" for i in invariants if i not in NAMES]
        out += [f"{what}: no scenario {s}" for s in scenarios if s not in known]
        checked.update(invariants)
    out += [f"invariant {i} ({NAMES[i]}) checks no promise" for i in sorted(set(NAMES) - checked)]
    return out


def test_every_promise_has_an_invariant_and_scenarios_and_every_invariant_a_promise() -> None:
    assert problems(DOC.read_text()) == []


def test_a_promise_without_an_invariant_fails() -> None:
    text = DOC.read_text() + "| Jobs always finish by lunch. | README |  | baseline |\n"
    assert any("no invariant" in p for p in problems(text))
    text = DOC.read_text() + "| A new promise. | README | 99 | no-such-scenario |\n"
    assert {p.split(": ", 1)[1] for p in problems(text)} >= {"no invariant 99", "no scenario no-such-scenario"}


def test_epu_sim_help_lists_every_invariant() -> None:
    """The man-page help is where an operator first reads what the judge checks."""
    from epu.sim.cli import DESCRIPTION

    listed = {int(m) for m in re.findall(r"(?:^|\s{2,})(\d{1,2}) [a-z]", DESCRIPTION, re.M)}
    assert listed == set(NAMES), sorted(set(NAMES) ^ listed)
