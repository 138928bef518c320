"""The column-wise wire form of a snapshot's nodes and shapes (common/columns.py)."""

from __future__ import annotations

import pytest
from epu.common.codec import decode, encode
from epu.common.columns import decode_columns, encode_columns, validate_nodes
from epu.common.messages import DecodeError, Envelope, JobShape, NodeInfo, SensorSnapshot


def nodes(n: int) -> list[NodeInfo]:
    states = ["free", "busy", "offline", "down"]
    return [NodeInfo(name=f"w{i:04d}", state=states[i % 4], cores=8, cores_used=(i % 3) * 2,  # type: ignore[arg-type]
                     jobs=[str(i)] if i % 2 else [], state_since=1.0 * i if i % 5 else None,
                     native_state="ALLOCATED+CLOUD" if i % 4 == 1 else "IDLE", instance_id=f"id{i}" if i % 3 else None,
                     memory_mb=64000, gpus=2 if i % 7 == 0 else 0, features=["bigmem"] if i % 2 else [],
                     partitions=["cpu", "gpu"] if i % 7 == 0 else ["cpu"]) for i in range(n)]


def test_columns_round_trip_equals_the_verbose_form() -> None:
    records = nodes(100)
    doc = encode_columns(records, NodeInfo, frozenset({"state", "native_state", "features", "partitions"}))
    assert isinstance(doc["state"], dict) and "gpus_used" not in doc  # interned; all-default left out
    back = decode_columns(doc, NodeInfo, "nodes")
    assert back == records
    assert [NodeInfo.model_validate(r.model_dump()) for r in back] == records
    back[1].features.append("x")  # every record owns its lists
    assert back[3].features == ["bigmem"]
    back[0].job_ends.append(1.0)  # a column left out (every record at its default): fresh lists too
    assert back[2].job_ends == [] and back[0].__dict__ is not back[2].__dict__
    assert back[5].model_copy(update={"state": "down"}).state == "down" and back[5].model_dump()["name"] == "w0005"


def test_snapshot_wire_form_is_columnar_and_round_trips() -> None:
    shapes = [JobShape(count=10, cores=2, partition="cpu", demand=True, reason="Resources", reason_class="resources"),
              JobShape(count=1, demand=False, reason="JobHeldUser", reason_class="held", sample_job_ids=["7"])]
    snap = SensorSnapshot(domain="alpha", backend="slurm", taken_at=1.0, nodes=nodes(30), shapes=shapes)
    env = Envelope.wrap(snap, source="t")
    assert env.body["jobs"] == [] and env.body["nodes"]["n"] == 30 and env.body["shapes"]["n"] == 2
    _, back = decode(encode(env))
    assert back == snap


@pytest.mark.parametrize(("mutate", "reason"), [
    (lambda d: d.update(cores=[1, 2]), "nodes.cores: expected 30 values"),
    (lambda d: d.update(cores=["8"] * 30), "nodes.cores"),
    (lambda d: d.update(cores=[-1] * 30), "nodes.cores"),
    (lambda d: d["state"].update(i=[99] * 30), "index outside its table"),
    (lambda d: d["state"].update(t=["free", "sleeping", "busy", "down"]), "nodes.state"),
    (lambda d: d.pop("name"), "nodes.name: required column missing"),
    (lambda d: d.update(n="30"), "nodes.n"),
])
def test_malformed_columns_are_refused_with_the_field_named(mutate, reason: str) -> None:
    snap = SensorSnapshot(domain="alpha", backend="slurm", taken_at=1.0, nodes=nodes(30))
    env = Envelope.wrap(snap, source="t")
    body = env.body
    mutate(body["nodes"])
    with pytest.raises(DecodeError, match=reason.replace("[", r"\[")):
        decode(encode(env.model_copy(update={"body": body})))


def test_verbose_snapshots_are_still_accepted() -> None:
    snap = SensorSnapshot(domain="alpha", backend="torque", taken_at=1.0, nodes=nodes(3),
                          shapes=[JobShape(count=2)])
    body = snap.model_dump(mode="python")  # lists of maps, as a 1.0 sender writes them
    assert SensorSnapshot.from_wire(body) == snap


def test_node_maps_validated_column_wise_equal_model_validation() -> None:
    """``validate_nodes`` (what the sensor's parsers call) gives what ``model_validate`` gives
    per map, fills the defaults of left-out fields, ignores extra keys, and names a bad field."""
    same = [{"name": f"w{i}", "state": "busy", "cores": 4, "cores_used": 4, "jobs": [str(i)], "features": ["a"]}
            for i in range(3)]
    mixed = [{"name": "x", "state": "free"}, {"state": "down", "name": "y", "cores": 2, "unknown_key": 1}]
    for rows in (same, mixed):
        got = validate_nodes(rows)
        assert got == [NodeInfo.model_validate(r) for r in rows]
    assert validate_nodes(mixed)[0].jobs == [] and validate_nodes(mixed)[1].cores == 2
    with pytest.raises(ValueError, match="cores"):
        validate_nodes([{"name": "x", "state": "free", "cores": -1}])
    with pytest.raises(ValueError, match="name"):
        validate_nodes([{"name": "x", "state": "free"}, {"state": "free"}])


# ------------------------------------------------------------------ owners, grouped (schema 1.2)
def owners(n: int) -> dict[str, list[str]]:
    return {str(900 + i): [f"acct{i % 3}", f"user{i % 5}", "cpu" if i % 2 else ""] for i in range(n)}


def test_owners_grouped_round_trip_equals_the_plain_map() -> None:
    """``encode_owners``/``decode_owners`` against the plain definition: the same map back, one
    group per distinct owner, each job once; validation as strict as ``dict[str, list[str]]``."""
    from epu.common.columns import decode_owners, encode_owners

    plain = owners(40)
    groups = encode_owners(plain)
    assert len(groups) == len({tuple(o) for o in plain.values()})
    assert sorted(j for _, ids in groups for j in ids) == sorted(plain)
    assert decode_owners(groups) == plain
    assert encode_owners({}) == [] and decode_owners([]) == {}
    assert SensorSnapshot.model_validate({"domain": "a", "backend": "slurm", "taken_at": 1.0,
                                          "owners": decode_owners(groups)}).owners == plain


def test_snapshot_owners_travel_grouped_and_a_plain_map_is_still_read() -> None:
    snap = SensorSnapshot(domain="alpha", backend="slurm", taken_at=1.0, nodes=nodes(3), owners=owners(12))
    body = Envelope.wrap(snap, source="t").body
    assert "owners" not in body and len(body["owner_groups"]) == len({tuple(o) for o in snap.owners.values()})
    assert {tuple(o) for o, _ in body["owner_groups"]} == {tuple(o) for o in snap.owners.values()}
    _, back = decode(encode(Envelope.wrap(snap, source="t")))
    assert back == snap and back.owners == owners(12)
    plain = {**body, "owners": owners(12)}  # a 1.1 sender
    del plain["owner_groups"]
    assert SensorSnapshot.from_wire(plain) == snap
    verbose = snap.model_dump(mode="python")  # lists of maps and the plain map, as a 1.0 sender writes them
    assert SensorSnapshot.from_wire(verbose) == snap
    empty = Envelope.wrap(snap.model_copy(update={"owners": {}}), source="t").body
    assert empty["owners"] == {} and "owner_groups" not in empty  # what a 1.1 receiver reads as before


@pytest.mark.parametrize(("groups", "reason"), [
    ([[["a", "u", "p"], ["1"]], [["b", "u", "p"], ["1"]]], "appears more than once"),
    ([[["a", "u", "p"], [1]]], r"owners\[0.1.0\]"),
    ([[["a", "u", "p"]]], r"\[owner, \[job id"),
    ({"1": ["a", "u", "p"]}, "owners"),
])
def test_malformed_owner_groups_are_refused(groups, reason: str) -> None:
    env = Envelope.wrap(SensorSnapshot(domain="alpha", backend="slurm", taken_at=1.0, owners=owners(2)), source="t")
    body = {**env.body, "owner_groups": groups}
    with pytest.raises(DecodeError, match=reason):
        decode(encode(env.model_copy(update={"body": body})))
    both = {**env.body, "owners": owners(2)}
    with pytest.raises(DecodeError, match="given both"):
        decode(encode(env.model_copy(update={"body": both})))
