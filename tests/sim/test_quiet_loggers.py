"""A simulation silences the cores' logs while it runs and only then: a warning logged in the
same process afterwards (a sensor's, a test's caplog) still reaches the handlers."""

from __future__ import annotations

import logging

import pytest

from epu.sim.scenarios import get_scenario
from epu.sim.simulation import Simulation, quiet_loggers


def test_the_level_is_put_back_even_when_the_run_fails() -> None:
    logger = logging.getLogger("epu")
    before = logger.level
    with pytest.raises(RuntimeError), quiet_loggers():
        assert not logger.isEnabledFor(logging.ERROR)
        raise RuntimeError("boom")
    assert logger.level == before


def test_a_warning_after_a_run_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    Simulation(get_scenario("baseline"), 1).run()
    with caplog.at_level(logging.WARNING):
        logging.getLogger("epu.services.sensor.core").warning("after the run")
    assert "after the run" in caplog.text
