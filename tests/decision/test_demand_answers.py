"""``nodes_needed``'s kept answers (``demand._ANSWERS``) against the search done afresh."""

from __future__ import annotations

import random

from epu.services.decision import demand
from epu.services.decision.demand import nodes_needed


def _fresh(shapes: dict[tuple[int, int], int], supply: list[int], node_cores: int) -> demand.DemandResult:
    """The answer with nothing kept: asked of an empty cache swapped in, the kept one put back."""
    kept, demand._ANSWERS = demand._ANSWERS, {}
    try:
        return nodes_needed(shapes, supply, node_cores)
    finally:
        demand._ANSWERS = kept


def test_kept_answers_equal_the_search_done_afresh() -> None:
    demand._ANSWERS.clear()
    rng = random.Random(17)
    seen: list[tuple[dict[tuple[int, int], int], list[int], int]] = []
    for _ in range(3000):
        if seen and rng.random() < 0.6:  # a question seen, its dict and list reordered, one part changed maybe
            shapes, supply, cores = rng.choice(seen)
            shapes = dict(rng.sample(list(shapes.items()), len(shapes)))
            supply = rng.sample(supply, len(supply))
            part = rng.randrange(4)
            if part == 0:
                cores = rng.randint(1, 8)
            elif part == 1:
                supply = [*supply, rng.randint(-1, 10)]
            elif part == 2 and shapes:
                shapes[next(iter(shapes))] = rng.randint(0, 6)
        else:
            shapes = {(rng.randint(1, 10), rng.randint(1, 4)): rng.randint(0, 6) for _ in range(rng.randint(0, 4))}
            supply = [rng.randint(-1, 10) for _ in range(rng.randint(0, 12))]
            cores = rng.randint(1, 8)
        seen.append((shapes, supply, cores))
        want = _fresh(shapes, supply, cores)
        got = nodes_needed(shapes, supply, cores)
        assert got == want, (shapes, supply, cores)
        got.unsatisfiable[(99, 99)] = 1  # a caller changing its result changes no kept answer
        got.new_nodes += 1
        assert nodes_needed(shapes, supply, cores) == want, (shapes, supply, cores)


def test_kept_answers_are_bounded() -> None:
    demand._ANSWERS.clear()
    for i in range(demand._ANSWERS_MAX + 10):
        nodes_needed({(1, 1): i}, [], 1)
    assert len(demand._ANSWERS) <= demand._ANSWERS_MAX
