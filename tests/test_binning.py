"""Binning interval counters in time (the Numba kernel and its reference), and the HBM series."""
import numpy as np

from cmemu._core.binning import bin_intervals
from cmemu.run import run_trace
from conftest import TRACES


def test_by_hand():
    # 100 B over [5, 25) in bins of 10: 25 B in bin 0, 50 B in bin 1, the rest (25 B) in bin 2.
    k, b, v = bin_intervals([3], [5], [25], [100], 10)
    assert k.tolist() == [3, 3, 3] and b.tolist() == [0, 1, 2] and v.tolist() == [25, 50, 25]
    # A zero-length interval puts all its value in its bin; zero values are dropped.
    k, b, v = bin_intervals([1, 2], [7, 0], [7, 10], [9, 0], 10)
    assert (k.tolist(), b.tolist(), v.tolist()) == ([1], [0], [9])


def test_native_matches_reference_and_conserves():
    rng = np.random.default_rng(3)
    n = 5000
    keys = rng.integers(0, 8, n)
    start = rng.integers(0, 10**12, n)
    end = start + rng.integers(0, 10**10, n)
    value = rng.integers(0, 10**11, n)
    a = bin_intervals(keys, start, end, value, 10**8)
    b = bin_intervals(keys, start, end, value, 10**8, native=False)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)
    k, _, v = a
    np.testing.assert_array_equal(np.bincount(k, weights=v, minlength=8), np.bincount(keys, weights=value, minlength=8))
    assert np.all(v >= 0)


def test_hbm_series_adds_up_to_the_ops_hbm_bytes():
    r = run_trace(TRACES / "deepseek_r1_decode_mini_2layers.json", progress=False, link_bin_ns=50_000)
    s = r.hbm_series
    assert s["bin_ps"] == 50_000_000
    per_die = np.bincount(s["die"], weights=s["bytes"], minlength=32)
    assert per_die.min() > 0
    # Every die does the same work in this trace; their HBM bytes agree within 5%.
    assert per_die.max() < 1.05 * per_die.min()
