"""Ctrl-C that cannot be lost.

Python runs a signal handler at the next bytecode of the main thread, and that may be inside a
garbage-collector callback (JAX registers one); an exception raised there is printed as "Exception
ignored in: <function _xla_gc_callback ...>" and dropped, so the run would go on as if Ctrl-C had never
been pressed (seen in CI, 2026-12-05). `remember_interrupts()` keeps the usual KeyboardInterrupt and
records each SIGINT as well; `raise_if_interrupted()`, called where stopping is safe (the start of a run's
iteration and of a play's turn), raises the one that was dropped.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading

log = logging.getLogger("spade_jax.run")

_pending = threading.Event()


def _on_sigint(signum, frame):
    _pending.set()
    raise KeyboardInterrupt


@contextlib.contextmanager
def remember_interrupts():
    """Within: SIGINT raises KeyboardInterrupt and is remembered until the block ends. Does nothing
    outside the main thread or where SIGINT is ignored (a background job's) or handled by someone else."""
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler):
        yield
        return
    _pending.clear()
    signal.signal(signal.SIGINT, _on_sigint)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        _pending.clear()


def raise_if_interrupted() -> None:
    """Raises KeyboardInterrupt for a Ctrl-C whose exception was dropped on its way."""
    if _pending.is_set():
        log.info("a Ctrl-C was dropped inside a callback; stopping now")
        raise KeyboardInterrupt
