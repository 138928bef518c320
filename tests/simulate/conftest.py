from __future__ import annotations

from pathlib import Path

import pytest

from epu.simulate.scenarios import nasa_path


@pytest.fixture(scope="session")
def nasa() -> Path:
    """The shared NASA iPSC/860 trace (../shared/traces beside the checkout, or $EPU_TRACES)."""
    return nasa_path()
