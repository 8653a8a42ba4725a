"""How far apart two float32 computations of the same thing may land, and why.

A float32 dot product of K terms carries a rounding error of up to about K·u times the sum of
the terms' magnitudes (u = eps/2, eps = 2**-23 ≈ 1.2e-7; Higham, *Accuracy and Stability of
Numerical Algorithms*, §3.1). Two computations that sum the same terms in another order (a row
in another batch, another thread count or BLAS kernel, another CPU, ONNX Runtime against our
GEMMs) may each land anywhere in that band, so they can differ by up to K·eps times that sum.
Comparing them more tightly tests the machine, not the code: a float32 GEMM over a different
batch composition moved a Silero probability by 3.6e-6 on one machine and not on another.

Exact equality is right only where the arithmetic is identical: the same inputs through the
same code path with the same shapes. The tests that rely on that say so where they compare.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

FLOAT32_EPS = float(np.finfo(np.float32).eps)

# Silero's widest product is its first convolution, K = 3 taps × 129 bins = 387 terms (the
# LSTM's is 256): 387 × eps = 4.6e-5 relative to the magnitudes summed, on each of the five
# layers. The sigmoid that makes a probability has a slope of at most 1/4, and the LSTM's
# forget gate (below 1) damps what the state carries from chunk to chunk. The bound is a
# worst case; rounding errors of either sign mostly cancel, and observed differences stay
# below 4e-6. 1e-4 is the agreement the README states between our GEMMs and ONNX Runtime; a
# real fault (a row's state given to another stream, a state not reset, a wrong chunk) moves
# probabilities by 1e-2 and more.
PROBABILITY_ATOL = 1e-4
# The LSTM's cell state has no squashing function: it sums gate products over the whole run
# and reaches a few units, so the same relative error is ten times larger in absolute terms.
STATE_ATOL = 1e-3


def assert_probabilities_close(got: npt.ArrayLike, want: npt.ArrayLike) -> None:
    """Silero speech probabilities from two runs that may group or order the arithmetic
    differently (batch composition, threads, implementation) agree as float32 allows."""
    np.testing.assert_allclose(_floats(got), _floats(want), rtol=0, atol=PROBABILITY_ATOL)


def assert_states_close(got: npt.ArrayLike, want: npt.ArrayLike) -> None:
    """Silero LSTM states (``h`` and ``c``) from two such runs agree as float32 allows."""
    np.testing.assert_allclose(_floats(got), _floats(want), rtol=0, atol=STATE_ATOL)


def assert_sums_close(
    got: npt.ArrayLike, want: npt.ArrayLike, *, terms: int, magnitude: npt.ArrayLike
) -> None:
    """Two float32 dot products of ``terms`` terms, summed in different orders, agree within
    their rounding bound: ``terms * eps * magnitude``, ``magnitude`` being the sum of the
    terms' absolute values (elementwise, e.g. ``abs(a) @ abs(b)`` in float64)."""
    bound = terms * FLOAT32_EPS * _floats(magnitude)
    difference = np.abs(_floats(got) - _floats(want))
    worst = np.max(difference - bound)
    assert worst <= 0, f"outside float32 rounding by up to {worst:.3g}"


def _floats(values: npt.ArrayLike) -> npt.NDArray[np.float64]:
    return np.asarray(values, dtype=np.float64)
