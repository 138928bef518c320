"""docs/sensor-states.md is generated from the tables and must be current."""

from pathlib import Path

from services.sensor.statesdoc import render


def test_states_doc_is_current() -> None:
    doc = Path(__file__).resolve().parents[2] / "docs" / "sensor-states.md"
    assert doc.read_text() == render(), "regenerate: python -m services.sensor.statesdoc > docs/sensor-states.md"
