"""The userdata renderer quotes each value with ``json``'s string encoder directly: for any
string — control characters, quotes, backslashes, non-ASCII, surrogates — it is what
``json.dumps`` returns."""

from __future__ import annotations

import json
import random

import pytest
from epu.services.provisioner import userdata


@pytest.mark.parametrize("seed", range(4))
def test_quoting_is_json_dumps(seed: int) -> None:
    rng = random.Random(seed)
    alphabet = [chr(c) for c in (*range(0, 128), 0xE9, 0x2028, 0xD800, 0xFFFF, 0x1F600)]
    for _ in range(2000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 12)))
        assert userdata._quote(text) == json.dumps(text)


def _substituted(renderer: userdata.UserdataRenderer, values: dict[str, object]) -> str:
    """``render`` as it was: ``string.Template.substitute`` over every quoted value."""
    import string

    ctx = {k: "" for k in userdata.CONTEXT_KEYS}
    worker = renderer.workers.get(str(values.get("domain", "")))
    if worker is not None:
        ctx.update(worker.values(str(values.get("node_name", "")), str(values.get("instance_id", ""))))
    ctx.update({k: v for k, v in values.items() if v is not None})
    quoted = {k: userdata._quote(str(v)) for k, v in ctx.items()}
    try:
        doc = string.Template(renderer.template_text).substitute(quoted)
    except (KeyError, ValueError) as exc:
        raise userdata.UserdataError(f"userdata template: unknown or malformed placeholder {exc}") from None
    if len(doc.encode()) > renderer.max_bytes:
        raise userdata.UserdataError(f"userdata is {len(doc.encode())} bytes, over the provider limit of "
                                     f"{renderer.max_bytes}")
    return doc


@pytest.mark.parametrize("seed", range(6))
def test_rendering_from_the_split_template_is_substitute(seed: int) -> None:
    """The template split once (``_pieces``) renders what ``string.Template.substitute`` renders —
    ``$$``, ``$name``, ``${name}``, text around and between them, values with ``$`` and quotes — and
    fails with the same error for an unknown placeholder, a malformed one (``$``, ``$1``, ``${x``) or
    a document over the limit."""
    rng = random.Random(seed)
    names = [*userdata.CONTEXT_KEYS, "extra", "unknown_key"]
    bits = ["$$", "$", "$1", "${", "${broken", "}", "{", "a", "é", "\n", " x ", "$$x", '"', "\\"]
    failures = 0
    for _ in range(1500):
        parts = []
        for _ in range(rng.randint(0, 10)):
            op = rng.random()
            name = rng.choice(names if rng.random() < 0.1 else names[:-1])
            if op < 0.3:
                parts.append(f"${name}")
            elif op < 0.55:
                parts.append(f"${{{name}}}")
            elif op < 0.6 and rng.random() < 0.3:
                parts.append(rng.choice(bits[1:5]))  # malformed, now and then
            else:
                parts.append(rng.choice((bits[0], *bits[5:])) + rng.choice(("", "tail", "${x}y")))
        renderer = userdata.UserdataRenderer("".join(parts), max_bytes=rng.choice((16 * 1024, 120)))
        values: dict[str, object] = {"instance_id": "i-$1", "node_name": rng.choice(("w", '"q"', "$x")),
                                     "domain": "d", "cores": rng.randint(0, 64), "site": None}
        if rng.random() < 0.5:
            values["extra"] = "${extra}"
        try:
            want: str | Exception = _substituted(renderer, values)
        except userdata.UserdataError as exc:
            want = exc
            failures += 1
        try:
            got: str | Exception = renderer.render(values)
        except userdata.UserdataError as exc:
            got = exc
        if isinstance(want, Exception):
            assert isinstance(got, userdata.UserdataError) and str(got) == str(want)
        else:
            assert got == want
    assert 100 < failures < 1400
