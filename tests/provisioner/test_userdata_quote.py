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
