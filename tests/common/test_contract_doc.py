"""docs/messages.md is the contract outside clients follow: it must match the code."""

from __future__ import annotations

from pathlib import Path

from epu.common.contract_doc import BEGIN, END, EXAMPLES, generate
from epu.common.messages import REGISTRY

DOC = Path(__file__).resolve().parents[2] / "docs" / "messages.md"


def test_generated_reference_is_current() -> None:
    text = DOC.read_text()
    block = BEGIN + text.split(BEGIN, 1)[1].split(END, 1)[0] + END
    assert block == generate(), "docs/messages.md is stale: run .venv/bin/python -m epu.common.contract_doc"


def test_every_message_type_has_an_example_and_a_section() -> None:
    text = DOC.read_text()
    for type_name in REGISTRY:
        assert type_name in EXAMPLES
        assert f"### {type_name}" in text
        # the example is valid against the model
        assert REGISTRY[type_name].model_validate(EXAMPLES[type_name].model_dump()) == EXAMPLES[type_name]
