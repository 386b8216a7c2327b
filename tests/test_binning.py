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


def test_a_share_spreads_by_the_ops_progress_native_and_reference():
    from cmemu._core.binning import clock_tables

    # Die 0's share: from t=0 every op at full speed; from t=10 a level of 1 B/s (3 B/s among 3
    # ops); from t=30 full speed again. An interval [0, 40) of 100 B of demand 4 runs at a
    # quarter of its speed while the level is 1: it progresses 10 + 5 + 10 = 25, so bins of 10
    # get 40, 10, 10, 40 B. One of demand 1 (at the level: its whole demand) is not slowed.
    clock = {"die": [0, 0, 0], "t_ps": [0, 10, 30], "shared_byte_per_s": [0, 3, 0], "sharers": [0, 3, 0],
             "capacity": [5]}
    tables = clock_tables(clock, 1)
    for native in (True, False):
        k, b, v = bin_intervals([0], [0], [40], [100], 10, native=native, clock_of=[0], clock=tables, demand=[4.0])
        assert b.tolist() == [0, 1, 2, 3] and v.tolist() == [40, 10, 10, 40]
        _, _, v = bin_intervals([0], [0], [40], [100], 10, native=native, clock_of=[0], clock=tables, demand=[1.0])
        assert v.tolist() == [25, 25, 25, 25]
    # Without a die (-1): evenly in time.
    _, _, v = bin_intervals([0], [0], [40], [100], 10, clock_of=[-1], clock=tables, demand=[4.0])
    assert v.tolist() == [25, 25, 25, 25]


def test_native_matches_reference_with_shares():
    from cmemu._core.binning import clock_tables

    rng = np.random.default_rng(5)
    dies, recs = 3, 60
    die = np.sort(rng.integers(0, dies, recs))
    t = np.concatenate([np.sort(rng.integers(0, 10**9, (die == d).sum())) for d in range(dies)])
    sharers = rng.integers(0, 4, recs)
    clock = {"die": die, "t_ps": t, "shared_byte_per_s": np.where(sharers > 0, rng.integers(1, 10, recs), 0),
             "sharers": sharers, "capacity": np.full(dies, 10)}
    n = 400
    start = rng.integers(0, 10**9, n)
    args = (rng.integers(0, 8, n), start, start + rng.integers(0, 10**8, n), rng.integers(0, 10**9, n), 10**7)
    of = rng.integers(-1, dies, n)
    demand = rng.integers(1, 10, n).astype(np.float64)
    a = bin_intervals(*args, clock_of=of, clock=clock_tables(clock, dies), demand=demand)
    b = bin_intervals(*args, native=False, clock_of=of, clock=clock_tables(clock, dies), demand=demand)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)


def test_hbm_bins_of_shared_dies_stay_under_capacity():
    from cmemu.lower import hbm_capacity_byte_per_s

    r = run_trace(TRACES / "deepseek_r1_decode_mini_2layers.json", progress=False, link_bin_ns=10_000)
    s = r.hbm_series
    cap = hbm_capacity_byte_per_s(r.spec.die)
    # Every byte comes from ops that share the die's HBM, so no 10 us bin holds more than the HBM
    # can deliver in it (1 B of rounding per op in a bin).
    per_bin = s["bytes"] / (s["bin_ps"] * 1e-12)
    assert per_bin.max() <= cap * 1.001, per_bin.max() / cap


def test_small_ops_fill_the_stacks_in_turn():
    # A die's ops take their regions one after the other (the trace gives no addresses): the
    # dispatch's 7.5 KB token loads do not all land on stack 0, and over the run the four stacks
    # carry the same bytes to within a part period per die.
    r = run_trace(TRACES / "deepseek_r1_decode_mini_2layers.json", progress=False)
    s = r.hbm_stack_series
    per_stack = np.bincount(s["stack"], weights=s["bytes"], minlength=s["stacks"])
    assert per_stack.min() / per_stack.max() > 0.999


def test_dense_and_sparse_sums_agree(monkeypatch):
    import cmemu._core.binning as binning

    rng = np.random.default_rng(9)
    n = 3000
    start = rng.integers(0, 10**11, n)
    args = (rng.integers(0, 6, n), start, start + rng.integers(0, 10**9, n), rng.integers(0, 10**10, n), 10**7)
    dense = bin_intervals(*args)
    monkeypatch.setattr(binning, "DENSE_CELLS", 0)  # every call sums sparse pairs
    sparse = bin_intervals(*args)
    for x, y in zip(dense, sparse):
        np.testing.assert_array_equal(x, y)
