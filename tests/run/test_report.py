"""spade_jax.run.report: summary.md's failure section and best-value direction."""

from __future__ import annotations

from spade_jax.run.metrics import RunLogger


def test_summary_shows_env_errors_by_kind_and_skipped_updates(tmp_path):
    errors = [(0, 0, 0), (3, 1, 0), (0, 0, 0), (2, 0, 1)]  # (exception, timeout, sandbox_died) per iteration
    with RunLogger(tmp_path, {}, tensorboard=False, progress=False, plot_every=100) as run:
        for i, (raised, timed_out, died) in enumerate(errors):
            run.log(i, {"loss": 1.0, "agent/env_errors": raised + timed_out + died,
                        "agent/env_errors/exception": raised, "agent/env_errors/timeout": timed_out,
                        "agent/env_errors/sandbox_died": died, "train/skipped": int(i == 2)})
    summary = (tmp_path / "summary.md").read_text()
    assert "## Failures" in summary
    assert "| plays whose environment failed | 7 | 2 iterations, last 3 |" in summary
    assert "| ... the program raised | 5 | 2 iterations, last 3 |" in summary
    assert "| ... a call timed out | 1 | 1 iterations, last 1 |" in summary
    assert "| ... the sandbox worker died | 1 | 1 iterations, last 3 |" in summary
    assert "| updates skipped as non-finite | 1 | 1 iterations, last 2 |" in summary
    assert "| agent/env_errors | 3 | 0 | 0 |" in summary  # fewer failures is better



def test_summary_has_no_failures_section_without_failure_metrics(tmp_path):
    with RunLogger(tmp_path, {}, tensorboard=False, progress=False, plot_every=100) as run:
        run.log(0, {"loss": 1.0})
    assert "## Failures" not in (tmp_path / "summary.md").read_text()
