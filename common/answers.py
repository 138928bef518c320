"""Send an operator's request and wait for the service's answer to it.

Why: a command that prints "requested" and exits 0 while the engine answers "no such
instance" tells the operator a lie (the refusal was visible only in ``epu tap``). Every
operator command that a service answers binds an exclusive tap queue to where the answer will
come *before* it publishes (so the answer cannot be missed), waits for it with a timeout, and
hands it back for the command to print and turn into an exit status.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from epu.common.broker import Broker, Publisher
from epu.common.messages import Message


def request(broker: Broker, message: Message, answers: str | Sequence[str], is_answer: Callable[[Any], bool],
            *, timeout: float, source: str) -> Any:
    """Publish ``message`` once a tap on ``answers`` (topic patterns) is bound; return the first
    event ``is_answer`` accepts, or None when none came within ``timeout`` seconds. A publish
    the broker refuses raises (``PublishRefused``): the request was never delivered."""
    from epu.common.tap import follow

    found: list[Any] = []

    def on_event(_rk: str, _env: Any, msg: Any, _err: Any) -> None:
        if msg is not None and not found and is_answer(msg):
            found.append(msg)

    def send() -> None:
        pub = Publisher(broker, source=source)
        try:
            pub.publish(message)
        finally:
            pub.close()

    follow(broker, answers, on_event, stop=lambda: bool(found), seconds=max(timeout, 0.01), on_bound=send)
    return found[0] if found else None
