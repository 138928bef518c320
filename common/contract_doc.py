"""Generates the reference half of docs/messages.md from the message models and the topology.

Why generated: the document is the contract outside clients follow (tests/common/
test_conformance_pika.py uses nothing else), so it must never drift from the code. The prose
around it is written by hand; the part between the markers is rewritten by
``python -m epu.common.contract_doc`` and checked by a test.
"""

from __future__ import annotations

import enum
import json
import sys
import typing
from pathlib import Path
from typing import Any

from epu.common import messages as m
from epu.common.topology import COMMAND_TYPES, DELIVERY_LIMIT, STATUS_DEPTH, Topology
from pydantic import BaseModel

BEGIN = "<!-- BEGIN GENERATED: python -m epu.common.contract_doc -->"
END = "<!-- END GENERATED -->"
T0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z

EXAMPLES: dict[str, m.Message] = {
    "sensor.snapshot": m.SensorSnapshot(
        domain="alpha", backend="slurm", taken_at=T0, running_jobs=3,
        shapes=[m.JobShape(count=8, nodes=1, cores=4, memory_mb=16000, partition="batch", time_limit_s=3600,
                           demand=True, reason="Resources", reason_class="resources", max_wait_s=90,
                           sample_job_ids=["1043_[1-8]"]),
                m.JobShape(count=1, nodes=2, cores=4, gpus=1, features=["a100"], partition="gpu", demand=True,
                           reason="Priority", reason_class="priority", max_wait_s=30, sample_job_ids=["1042"]),
                m.JobShape(count=1, nodes=1, cores=1, partition="batch", demand=False, reason="JobHeldUser",
                           reason_class="held", max_wait_s=600, sample_job_ids=["1044"])],
        nodes=[m.NodeInfo(name="alpha-3f2a9c1d", state="busy", cores=4, cores_used=4, jobs=["1040"],
                          state_since=T0 - 300, native_state="ALLOCATED+CLOUD",
                          instance_id="3f2a9c1d0e8b4f6a9c7d5e3b1a2f4c6d", memory_mb=16000, partitions=["batch"]),
               m.NodeInfo(name="alpha-77b0e412", state="free", cores=4, state_since=T0 - 20, native_state="IDLE+CLOUD",
                          instance_id="77b0e4120e8b4f6a9c7d5e3b1a2f4c6d", memory_mb=16000, partitions=["batch"])],
        owners={"1040": ["physics", "alice", "batch"]}),
    "node.command": m.NodeCommand(command_id="5b0c6f7e9d2a4c1b8e3f0a9d7c6b5a41", domain="alpha", action="add",
                                  node="alpha-3f2a9c1d", instance_id="3f2a9c1d0e8b4f6a9c7d5e3b1a2f4c6d",
                                  address="10.0.0.17", cores=4, reason="instance started"),
    "node.result": m.NodeCommandResult(command_id="5b0c6f7e9d2a4c1b8e3f0a9d7c6b5a41", domain="alpha", action="add",
                                       node="alpha-3f2a9c1d", ok=True, output=""),
    "slurm.power": m.SlurmPower(
        batch_id="e4d2c0a8b6f44e1c9a7b5d3f1e0c2a4b", domain="alpha", action="resume",
        nodes=["alpha-c5-001", "alpha-c5-002"], called_at=T0,
        jobs=[m.SlurmResumeJob(job_id=140814, nodes_alloc=["alpha-c5-001", "alpha-c5-002"],
                               nodes_resume=["alpha-c5-001", "alpha-c5-002"], features="c5", partition="cloud")]),
    "instance.launch": m.LaunchRequest(launch_id="3f2a9c1d0e8b4f6a9c7d5e3b1a2f4c6d", domain="alpha", site="ec2-east",
                                       node_name="alpha-3f2a9c1d", cores=4),
    "instance.terminate": m.TerminateRequest(request_id="8d1e2f3a4b5c6d7e8f9a0b1c2d3e4f5a",
                                             instance_id="3f2a9c1d0e8b4f6a9c7d5e3b1a2f4c6d", domain="alpha",
                                             reason="idle and removed from the batch system"),
    "instance.state": m.InstanceEvent(instance_id="3f2a9c1d0e8b4f6a9c7d5e3b1a2f4c6d", domain="alpha", site="ec2-east",
                                      state="started", previous="pending", seq=3, node_name="alpha-3f2a9c1d",
                                      ip="10.0.0.17", cloud_id="i-0abc123", cores=4, at=T0),
    "provisioner.alert": m.ProvisionerAlert(
        site="ec2-east", kind="orphan-sweep-refused", deployment="epu-5d41402abc4b",
        message="12 orphan nodes at site ec2-east are due for destruction, more than the cap of 5 per "
                "reconciliation: destroying none. ...",
        cloud_ids=["i-0abc123", "i-0abc124"], count=12, at=T0),
    "decision.record": m.DecisionRecord(
        domain="alpha", iteration=128, policy="queue-demand", policy_version=2, at=T0,
        saw=m.ViewSummary(queued_jobs=10, queued_cores=16, nodes_by_state={"busy": 1, "free": 1},
                          instances_by_state={"joined": 2, "pending": 1}, instances_by_site={"ec2-east": 3}),
        actions=[m.ActionRecord(kind="launch", target="alpha-9c1d3f2a", site="ec2-east",
                                reason="16 queued cores - (4 free + 4 pending) = 8 → 2 instances of 4 cores",
                                action_id="9c1d3f2a0e8b4f6a9c7d5e3b1a2f4c6d")]),
    "decision.status": m.EngineStatus(
        domain="alpha", at=T0, policy="queue-demand", policy_version=2, min_nodes=0, max_nodes=20,
        snapshot_at=T0 - 4, queued_jobs=10, queued_cores=16, nodes_by_state={"busy": 1, "free": 1},
        instances=[m.InstanceStatus(instance_id="3f2a9c1d0e8b4f6a9c7d5e3b1a2f4c6d", site="ec2-east", state="joined",
                                    seq=3, node_name="alpha-3f2a9c1d", ip="10.0.0.17", in_batch=True,
                                    node_state="busy", since=T0 - 200)]),
    "policy.change": m.PolicyChange(change_id="op-20260101-1", domain="alpha", policy="threshold",
                                    params={"waiting_jobs": 5, "jobs_per_vm": 4}, max_nodes=20, operator="alice"),
    "policy.outcome": m.PolicyOutcome(change_id="op-20260101-1", domain="alpha", applied=True, version=3,
                                      config={"policy": "threshold", "max_nodes": 20}),
    "instance.report": m.InstanceReport(
        domain="alpha", as_of=T0, horizon_seconds=3600.0,
        instances=[m.InstanceEvent(instance_id="3f2a9c1d0e8b4f6a9c7d5e3b1a2f4c6d", domain="alpha", site="ec2-east",
                                   state="started", seq=3, node_name="alpha-3f2a9c1d", ip="10.0.0.17",
                                   cloud_id="i-0abc123", cores=4, at=T0 - 240)],
        offered={"ec2-east": [m.OfferedType(name="c5.xlarge", size="c5.xlarge", cores=4, memory_mb=8192,
                                            price_per_hour=0.17, quota=20, image="ami-0abc123")]}),
    "context.member": m.ContextMembership(context_id="c9a1f0e2", entry_id=7, kind="join", hostname="alpha-3f2a9c1d",
                                          fqdn="alpha-3f2a9c1d.cluster.local", ip="10.0.0.17", at=T0),
}


def _type_name(ann: Any) -> str:
    origin = typing.get_origin(ann)
    if origin is typing.Annotated:
        base, *meta = typing.get_args(ann)
        extra = []
        for x in meta:
            inner = getattr(x, "metadata", [x])
            for y in inner:
                if getattr(y, "pattern", None):
                    extra.append(f"pattern `{y.pattern}`")
                if getattr(y, "ge", None) is not None:
                    extra.append(f"≥ {y.ge}")
                if getattr(y, "max_length", None):
                    extra.append(f"max {y.max_length} chars")
        return _type_name(base) + (f" ({', '.join(extra)})" if extra else "")
    if origin in (typing.Union, __import__("types").UnionType):
        args = [a for a in typing.get_args(ann) if a is not type(None)]
        inner = " or ".join(_type_name(a) for a in args)
        return f"{inner} or nil" if len(args) < len(typing.get_args(ann)) else inner
    if origin is typing.Literal:
        return "one of " + ", ".join(f"`{a}`" for a in typing.get_args(ann))
    if origin is list:
        return f"array of {_type_name(typing.get_args(ann)[0])}"
    if origin is dict:
        k, v = typing.get_args(ann)
        return f"map {_type_name(k)} → {_type_name(v)}"
    if ann is typing.Any:
        return "any msgpack scalar"
    if isinstance(ann, type) and issubclass(ann, enum.Enum):
        return "one of " + ", ".join(f"`{m.value}`" for m in ann)
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return f"[{ann.__name__}](#{ann.__name__.lower()})"
    return {str: "string", int: "integer", float: "float (epoch seconds for times)", bool: "boolean"}.get(ann, str(ann))


def _doc(cls: type, name: str) -> str:
    import inspect

    # attribute docstrings: the string literal right after the field line, in this class only
    lines = inspect.getsource(cls).splitlines()
    for i, line in enumerate(lines):
        if line.strip().startswith(f"{name}:") and i + 1 < len(lines) and lines[i + 1].strip().startswith('"""'):
            text = []
            for nxt in lines[i + 1:]:
                text.append(nxt.strip().strip('"'))
                if nxt.rstrip().endswith('"""') and (len(text) > 1 or nxt.strip().count('"""') == 2):
                    break
            return " ".join(t for t in text if t)
    return ""


def _fields_table(cls: type[BaseModel]) -> list[str]:
    out = ["| field | type | required | default | meaning |", "|---|---|---|---|---|"]
    for name, info in cls.model_fields.items():
        required = info.is_required()
        default = "" if required else json.dumps(info.get_default(call_default_factory=True), default=str)
        out.append(f"| `{name}` | {_type_name(info.annotation if not info.metadata else typing.Annotated[(info.annotation, *info.metadata)])} "
                   f"| {'yes' if required else 'no'} | {default} | {_doc(cls, name)} |")
    return out


def generate() -> str:
    topo = Topology()
    out = [BEGIN, "", "## Reference (generated from common/messages.py and common/topology.py)", ""]
    out += ["### Queues", "", "| queue | bound to | routing keys | single active consumer | purpose |",
            "|---|---|---|---|---|"]
    for spec in [*topo.service_specs(), topo.sensor_spec("domain")]:
        name = spec.name.replace("epu.sensor.domain", "epu.sensor.DOMAIN")
        keys = [k.replace("sensor.domain", "sensor.DOMAIN") for k in spec.routing_keys]
        out.append(f"| `{name}` | `{spec.exchange}` | {', '.join(f'`{k}`' for k in keys)} "
                   f"| {'yes' if spec.single_active_consumer else 'no'} | {spec.purpose} |")
    out.append("")
    out += ["Durable queues are quorum queues with `x-dead-letter-exchange: epu.dlx` and "
            f"`x-delivery-limit: {DELIVERY_LIMIT}`; the latest-value snapshot queues instead have "
            "`x-max-length: 1` and `x-overflow: drop-head` (a replaced snapshot is not dead-lettered); the "
            f"status queues (`epu.status.DOMAIN`) keep `x-max-length: {STATUS_DEPTH}` with drop-head and no "
            "delivery limit: readers take the statuses with basic.get, keep the newest (highest `at`) and "
            "requeue them, leaving them for the next reader. More than one, because a quorum queue counts "
            "a status a reader holds against `x-max-length`: at one, a status published meanwhile would be "
            "the one dropped. The dead-letter queue `epu.dead` is filled by the broker alone (no user may publish "
            "to `epu.dlx`); `epu.dead.notes` (from `epu.notes`, routing key: the rejecting queue's name) holds the "
            "rejecting service's note of why (see Dead letters above).", ""]
    out += ["### Message types", "", "| type | exchange | routing key | from → to |", "|---|---|---|---|"]
    flows = {
        "sensor.snapshot": "sensor → decision engine, taps", "node.command": "decision engine → one sensor",
        "node.result": "sensor → decision engine, taps",
        "slurm.power": "epu slurm resume|suspend|resume-fail (as the sensor) → decision engine, taps",
        "instance.launch": "decision engine → provisioners",
        "instance.terminate": "decision engine, operators → provisioners",
        "instance.state": "provisioner → decision engine, context broker, taps",
        "instance.report": "provisioner → decision engine (anti-entropy), taps",
        "provisioner.alert": "provisioner → operators, taps",
        "decision.record": "decision engine → taps",
        "decision.status": "decision engine → epu status (latest-value queue), taps", "policy.change": "operators → decision engine",
        "policy.outcome": "decision engine → operators, taps", "context.member": "context broker → taps",
    }
    for type_name in sorted(m.REGISTRY):
        ex = "epu.commands" if type_name in COMMAND_TYPES else "epu.events"
        out.append(f"| [`{type_name}`](#{type_name.replace('.', '')}) | `{ex}` | `{EXAMPLES[type_name].routing_key()}` "
                   f"(example) | {flows.get(type_name, '')} |")
    out.append("")
    out += ["### Envelope", ""] + _fields_table(m.Envelope) + [""]
    nested: list[type[BaseModel]] = []
    for type_name, cls in sorted(m.REGISTRY.items()):
        out += [f"### {type_name}", "", (cls.__doc__ or "").strip().replace("\n    ", "\n"), ""]
        out += [f"Python class `common.messages.{cls.__name__}`; routing key `{EXAMPLES[type_name].routing_key()}` "
                "in the example below.", ""]
        out += _fields_table(cls) + [""]
        for info in cls.model_fields.values():
            for arg in typing.get_args(info.annotation) or (info.annotation,):
                if isinstance(arg, type) and issubclass(arg, BaseModel) and arg not in nested:
                    nested.append(arg)
        env = m.Envelope.wrap(EXAMPLES[type_name], source="example", timestamp=T0,
                              message_id="0123456789abcdef0123456789abcdef")
        out += ["Example envelope (shown as JSON; on the wire it is the same map in msgpack):", "", "```json",
                json.dumps(env.model_dump(mode="json"), indent=2), "```", ""]
    for cls in nested:
        out += [f"### {cls.__name__}", "", (cls.__doc__ or "").strip(), ""] + _fields_table(cls) + [""]
    out.append(END)
    return "\n".join(out)


def update(path: Path) -> bool:
    text = path.read_text()
    head, _, rest = text.partition(BEGIN)
    _, _, tail = rest.partition(END)
    new = head + generate() + tail
    changed = new != text
    path.write_text(new)
    return changed


if __name__ == "__main__":
    target = Path(sys.argv[1] if len(sys.argv) > 1 else "docs/messages.md")
    print(("updated " if update(target) else "unchanged ") + str(target))
