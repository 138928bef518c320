"""The pure state machine and error classes: fast, no I/O."""

from __future__ import annotations

from epu.common.messages import INSTANCE_STATE_ORDER
from epu.services.provisioner.errors import classify, is_throttled
from epu.services.provisioner.states import check_transition, map_node_state
from hypothesis import given
from hypothesis import strategies as st
from libcloud.common.exceptions import BaseHTTPError
from libcloud.common.types import InvalidCredsError, LibcloudError
from libcloud.compute.types import NodeState

STATES = list(INSTANCE_STATE_ORDER)


def test_forward_moves_allowed_and_may_skip() -> None:
    assert check_transition("requested", "pending").allowed
    assert check_transition("requested", "started").allowed
    assert check_transition("started", "terminating").allowed
    assert check_transition("pending", "failed").allowed


def test_backwards_same_and_terminal_refused() -> None:
    assert not check_transition("started", "pending").allowed
    assert check_transition("started", "started").why == "no change"
    assert not check_transition("terminated", "started").allowed
    assert not check_transition("failed", "terminated").allowed
    assert not check_transition("terminated", "failed").allowed
    assert not check_transition("requested", "bogus").allowed


@given(st.lists(st.sampled_from(STATES), max_size=30))
def test_any_sequence_of_proposals_only_moves_forward(proposals: list[str]) -> None:
    state = "requested"
    for p in proposals:
        if check_transition(state, p).allowed:
            assert INSTANCE_STATE_ORDER[p] > INSTANCE_STATE_ORDER[state]
            state = p
    assert state in STATES


def test_libcloud_states_map() -> None:
    assert map_node_state(NodeState.PENDING) == "pending"
    assert map_node_state(NodeState.RUNNING) == "started"
    assert map_node_state(NodeState.TERMINATED) == "terminated"
    assert map_node_state(NodeState.ERROR) == "failed"
    assert map_node_state(NodeState.STOPPED) is None
    assert map_node_state("running") == "started"


def test_error_classes() -> None:
    assert classify(BaseHTTPError(503, "ServiceUnavailable")) == "transient"
    assert classify(BaseHTTPError(429, "slow down")) == "transient"
    assert classify(TimeoutError("read timed out")) == "transient"
    assert classify(Exception("RequestLimitExceeded: Request limit exceeded.")) == "transient"
    assert classify(LibcloudError("InsufficientInstanceCapacity: none left")) == "capacity"
    assert classify(Exception("InstanceLimitExceeded: Your quota allows for 0 more")) == "capacity"
    assert classify(InvalidCredsError("AuthFailure")) == "permanent"
    assert classify(Exception("InvalidAMIID.NotFound: The image id 'ami-1' does not exist")) == "permanent"
    assert classify(ValueError("something odd")) == "permanent"


def test_a_throttled_call_was_not_processed_a_timeout_or_5xx_may_have_been() -> None:
    """Without client tokens, only a throttled create may be repeated at once (the provisioner)."""
    assert is_throttled(BaseHTTPError(429, "slow down"))
    assert is_throttled(Exception("RequestLimitExceeded: Request limit exceeded."))
    assert not is_throttled(BaseHTTPError(503, "ServiceUnavailable"))
    assert not is_throttled(BaseHTTPError(504, "GatewayTimeout"))
    assert not is_throttled(TimeoutError("read timed out"))


def test_states_are_one_enum_and_strings_on_the_wire() -> None:
    """``InstanceState`` is a ``StrEnum``: the order's keys, the provisioner's states and the
    libcloud mapping are its members; a message reads the wire's string into a member and writes
    it back as that string (msgpack), and a state that is none of them is refused naming the key."""
    import pytest
    from epu.common.codec import packb, unpackb
    from epu.common.messages import InstanceEvent, InstanceState
    from epu.services.provisioner.states import PROVISIONER_STATES
    from pydantic import ValidationError

    assert list(INSTANCE_STATE_ORDER) == list(InstanceState)
    assert all(isinstance(s, InstanceState) for s in PROVISIONER_STATES)
    assert map_node_state(NodeState.RUNNING) is InstanceState.STARTED
    evt = InstanceEvent.from_wire({"instance_id": "i-1", "domain": "alpha", "site": "s", "state": "started",
                                   "previous": "pending", "at": 1.0})
    assert evt.state is InstanceState.STARTED and evt.previous is InstanceState.PENDING and evt.state == "started"
    wire = unpackb(packb(evt.to_wire()))
    assert wire["state"] == "started" and type(wire["state"]) is str
    assert InstanceEvent.from_wire(wire) == evt
    with pytest.raises(ValidationError, match="state"):
        InstanceEvent.from_wire({**wire, "state": "bogus"})
    with pytest.raises(ValidationError, match="state"):
        InstanceEvent.from_wire({**wire, "state": 2})  # not coerced from another type
