"""``epu tap``: the operator's window, as a real subprocess on the real broker."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from epu.common.broker import Broker
from epu.common.messages import InstanceEvent, PolicyOutcome, SensorSnapshot
from epu.common.runtime import Service, run_in_thread
from epu.common.testing import wait_for

pytestmark = pytest.mark.rabbitmq
ROOT = Path(__file__).resolve().parents[2]


def test_tap_prints_every_event_matching_the_pattern(broker: Broker, tmp_path: Path) -> None:
    config = tmp_path / "epu.toml"  # the file names the broker; the environment still overrides it
    config.write_text('[broker]\nurl = "amqp://nobody@127.0.0.1:1/"\n')
    env = {**os.environ, "PYTHONPATH": str(ROOT), "EPU_CONFIG": str(config), "EPU_BROKER__URL": broker.url,
           "EPU_BROKER__PREFIX": broker.topology.prefix}
    svc = Service("declarer", broker)  # make the exchanges exist
    t = run_in_thread(svc)
    assert svc.wait_ready(10)
    out = tmp_path / "tap.out"
    err = tmp_path / "tap.err"
    with out.open("w") as fo, err.open("w") as fe:
        tap = subprocess.Popen([sys.executable, "-m", "epu.cli", "tap", "instance.state.#", "--json",
                                "--count", "2", "--seconds", "60"], env=env, stdout=fo, stderr=fe)
        try:
            wait_for(lambda: "tapping" in err.read_text(), 20, message="tap bound")
            svc.publish(SensorSnapshot(domain="alpha", backend="simulated", taken_at=1.0))  # not matched
            svc.publish(InstanceEvent(instance_id="i1", domain="alpha", site="sim", state="pending", seq=1, at=1.0))
            svc.publish(PolicyOutcome(change_id="c", domain="alpha", applied=True))  # not matched
            svc.publish(InstanceEvent(instance_id="i1", domain="alpha", site="sim", state="started", seq=2, at=2.0))
            assert tap.wait(30) == 0
        finally:
            if tap.poll() is None:
                tap.kill()
            svc.stop()
            t.join(10)
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(x["routing_key"], x["body"]["state"]) for x in lines] == [
        ("instance.state.alpha.pending", "pending"), ("instance.state.alpha.started", "started")]
    assert all(x["type"] == "instance.state" and x["source"] == "declarer" for x in lines)


def test_tap_text_format_is_one_line_per_event() -> None:
    from epu.common.messages import Envelope

    from epu.cli_core import format_event

    msg = InstanceEvent(instance_id="i1", domain="alpha", site="sim", state="started", seq=2, at=2.0,
                        ip="10.0.0.5")
    line = format_event(Envelope.wrap(msg, "provisioner"), msg, msg.routing_key())
    assert "instance.state.alpha.started" in line and "provisioner" in line and "ip=10.0.0.5" in line
    assert "\n" not in line
