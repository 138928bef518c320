"""The in-memory intent log's rows (``memstore._ActionRow``: ``body`` made when first read) and
``memory``'s shortcut for an empty memory, against what they stand for, made eagerly."""

from __future__ import annotations

import json
import random
from typing import Any

from epu.common.messages import NodeCommand
from epu.services.decision.memstore import MemoryDecisionDatabase, MemoryStore
from epu.services.decision.planner import Plan, Planned


def _command(rng: random.Random, k: int) -> NodeCommand:
    return NodeCommand(command_id=f"c{k}", domain="d", action=rng.choice(["add", "offline", "online", "remove"]),
                       node=f"n{rng.randint(0, 9)}", instance_id=f"i{rng.randint(0, 9)}", reason=f"r{k}")


def test_rows_read_as_if_their_body_was_made_at_insert() -> None:
    rng = random.Random(16)
    store = MemoryStore(MemoryDecisionDatabase())
    want: dict[str, dict[str, Any]] = {}
    k = 0
    for step in range(300):
        roll = rng.random()
        if roll < 0.5:
            plan = Plan()
            for _ in range(rng.randint(1, 3)):
                msg = _command(rng, k)
                p = Planned(msg.command_id, msg.action, msg.instance_id or "", "s", msg.reason or "", msg)
                plan.actions.append(p)
                want[p.action_id] = {"action_id": p.action_id, "domain": "d", "kind": p.kind,
                                     "target": p.instance_id, "site": "s", "reason": p.reason, "type": msg.TYPE,
                                     "body": msg.model_dump_json(), "created_at": float(step), "sent_at": None,
                                     "attempts": 0, "done": False, "outcome": None}
                k += 1
            store.store_actions("d", plan, float(step))
        elif roll < 0.7 and want:
            aid = rng.choice(list(want))
            store.mark_sent([aid], float(step))
            row = want[aid]
            row["sent_at"], row["attempts"] = float(step), row["attempts"] + 1
        elif roll < 0.85 and want:
            aid = rng.choice(list(want))
            if store.complete(action_id=aid, outcome="ok"):
                want[aid]["done"], want[aid]["outcome"] = True, "ok"
        elif want:
            aid = rng.choice(list(want))
            got = store.action(aid)
            assert got == want[aid] and list(got) == list(want[aid])
            got["body"] = "changed"  # a copy: the stored row is not touched
        rows = store.actions("d")
        assert rows == sorted(want.values(), key=lambda r: r["created_at"])
        assert all(list(r) == list(want[r["action_id"]]) for r in rows)
        unsent = store.unsent_or_due(["d"], float(step), 1e9)
        assert all(m == NodeCommand.model_validate(json.loads(want[m.command_id]["body"])) for m in unsent)


def test_memory_shortcut_answers_as_the_parser() -> None:
    store = MemoryStore(MemoryDecisionDatabase())
    assert store.memory("d") == ({}, 0)
    for text, iteration in (("{}", 3), ("", 0), ('{"a": [1, 2]}', 5), ("{}", None)):
        store.db.state["d"] = {"memory": text, "iteration": iteration, "file_config": None}
        got, at = store.memory("d")
        assert (got, at) == (json.loads(text or "{}"), iteration or 0)
        got["x"] = 1  # each call a dict of its own
        assert "x" not in store.memory("d")[0]
