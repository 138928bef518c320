"""docs/sensor-states.md is generated from the tables and must be current."""

from pathlib import Path

from epu.services.sensor.statesdoc import render


def test_states_doc_is_current() -> None:
    doc = Path(__file__).resolve().parents[2] / "docs" / "sensor-states.md"
    assert doc.read_text() == render(), "regenerate: python -m epu.services.sensor.statesdoc > docs/sensor-states.md"


def test_pending_reasons_doc_is_current() -> None:
    from epu.services.sensor.reasonsdoc import render as render_reasons

    doc = Path(__file__).resolve().parents[2] / "docs" / "pending-reasons.md"
    assert doc.read_text() == render_reasons(), \
        "regenerate: python -m epu.services.sensor.reasonsdoc > docs/pending-reasons.md"
