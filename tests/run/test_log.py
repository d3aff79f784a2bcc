"""spade_jax.run.log: the phase timer and package logging (stderr and run.log), stdlib logging unshadowed."""

from __future__ import annotations

import importlib
import logging
import time

import pytest

from spade_jax.run.log import PhaseTimer, setup_logging


def test_stdlib_logging_is_not_shadowed():
    # The package module is reachable only as a submodule; plain `import logging` is stdlib.
    assert logging.__name__ == "logging" and hasattr(logging, "getLogger")
    package_logging = importlib.import_module("spade_jax.run.log")
    assert package_logging is not logging
    assert package_logging.logging is logging



def test_phase_timer():
    timer = PhaseTimer()
    with timer.phase("designer"):
        time.sleep(0.01)
    with timer.phase("designer"):
        pass
    with pytest.raises(RuntimeError):
        with timer.phase("agent"):
            raise RuntimeError("boom")
    out = timer.pop()
    assert set(out) == {"time/designer", "time/agent"}
    assert out["time/designer"] >= 0.01
    assert timer.pop() == {}
    with pytest.raises(ValueError, match="phase name"):
        with timer.phase("a/b"):
            pass



def test_setup_logging_writes_run_log(tmp_path, capsys):
    logger = setup_logging(tmp_path)
    setup_logging(tmp_path)  # idempotent: no doubled lines
    logging.getLogger("spade_jax.selfplay").info("iteration %d done", 7)
    for handler in logger.handlers:
        handler.flush()
    text = (tmp_path / "run.log").read_text()
    assert text.count("iteration 7 done") == 1 and "INFO spade_jax.selfplay" in text
    assert capsys.readouterr().err.count("iteration 7 done") == 1
    setup_logging(None)  # detach the file handler before tmp_path goes away
