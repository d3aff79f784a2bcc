import signal
import sys

import pytest

from spade_jax.run.interrupt import raise_if_interrupted, remember_interrupts


class _DropsItsErrors:
    """Python ignores an exception raised in __del__, as it does one raised in a gc callback (JAX's)."""

    def __del__(self):
        signal.raise_signal(signal.SIGINT)


def test_a_ctrl_c_dropped_in_a_callback_is_raised_at_the_next_safe_point(monkeypatch, usual_sigint):
    dropped = []
    monkeypatch.setattr(sys, "unraisablehook", dropped.append)
    with remember_interrupts():
        _DropsItsErrors()  # collected at once: its KeyboardInterrupt goes to sys.unraisablehook
        assert [type(d.exc_value) for d in dropped] == [KeyboardInterrupt]
        with pytest.raises(KeyboardInterrupt):
            raise_if_interrupted()
    raise_if_interrupted()  # forgotten when the block ends
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_ctrl_c_that_arrives_raises_at_once_as_usual(usual_sigint):
    with remember_interrupts():
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)


def test_an_ignored_sigint_stays_ignored():
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with remember_interrupts():
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
            signal.raise_signal(signal.SIGINT)
            raise_if_interrupted()
    finally:
        signal.signal(signal.SIGINT, previous)
