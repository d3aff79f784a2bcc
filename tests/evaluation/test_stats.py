"""spade_jax.evaluation.stats: Wilson intervals against the quadratic's roots and a textbook value;
the macro interval."""

from __future__ import annotations

import numpy as np
import pytest

from spade_jax import evaluation as ev


def test_wilson_interval_against_quadratic_roots():
    # The Wilson bounds are the roots in p of (phat - p)^2 = z^2 p (1 - p) / n.
    z = 1.959963984540054
    for k, n in [(3, 10), (0, 7), (7, 7), (41, 50), (1, 1)]:
        phat = k / n
        a = 1 + z * z / n
        roots = np.roots([a, -(2 * phat + z * z / n), phat * phat])
        low, high = sorted(float(np.real(r)) for r in roots)
        assert ev.wilson_interval(k, n) == pytest.approx((max(low, 0.0), min(high, 1.0)), abs=1e-9)
    # Textbook value (Newcombe 1998, 95%): 3 of 10 gives [0.1078, 0.6032].
    assert ev.wilson_interval(3, 10) == pytest.approx((0.1078, 0.6032), abs=1e-4)
    with pytest.raises(ValueError):
        ev.wilson_interval(11, 10)



def test_macro_interval_covers_mean():
    mean, low, high = ev.macro_interval([(10, 10), (0, 10), (5, 10)])
    assert mean == pytest.approx(0.5)
    assert 0 <= low < 0.5 < high <= 1
