"""The results built after the simulation, checked against the straightforward versions they
replaced: the HBM series spread per die (binning.bin_by_die), the clock tables, the COMP ops'
/tasks rows (die.intervals.op_rows)."""
import numpy as np
import pytest

import cmemu._core.binning as binning
from cmemu._core.binning import _clock_at, _clock_from, bin_by_die, bin_intervals, clock_tables
from cmemu.die.intervals import op_rows


# -- HBM series --------------------------------------------------------------------------------------
def _bin_by_die_straight(die, start, end, value, bin_ps, clock_of, clock):
    """Every (interval, key) through bin_intervals with key die * keys + key, cells above 0, sorted
    by die, bin, key; per (die, bin) the sum of its cells (what run._hbm_series did before)."""
    n, nk = value.shape
    keys = (die[:, None].astype(np.int64) * nk + np.arange(nk)[None, :]).ravel()
    k, b, v = bin_intervals(keys, np.repeat(start, nk), np.repeat(end, nk), value.ravel(), bin_ps,
                            clock_of=np.repeat(clock_of, nk), clock=clock)
    keep = v > 0
    k, b, v = k[keep].astype(np.int64), b[keep], v[keep]
    d, q = k // nk, k % nk
    o = np.lexsort((q, b, d))
    d, q, b, v = d[o], q[o], b[o], v[o]
    first = np.ones(d.size, dtype=bool)
    first[1:] = (d[1:] != d[:-1]) | (b[1:] != b[:-1])
    at = np.flatnonzero(first)
    return (d.astype(np.int32), q.astype(np.int8), b, v, d[at].astype(np.int32), b[at],
            np.add.reduceat(v, at) if at.size else v[:0])


def _random_case(rng):
    dies, n, nk = int(rng.integers(1, 6)), int(rng.integers(0, 300)), int(rng.integers(1, 5))
    die = np.sort(rng.integers(0, dies, n))
    start = rng.integers(0, 10**6, n)
    end = start + rng.integers(-10, 10**5, n) * (rng.random(n) < 0.9)  # some empty or reversed
    value = rng.integers(-5, 10**9, (n, nk))
    value[rng.random((n, nk)) < 0.2] = 0
    recs = 40
    cdie = np.sort(rng.integers(0, dies, recs))
    t = np.concatenate([np.sort(rng.integers(0, 10**6, (cdie == d).sum())) for d in range(dies)])
    clock = clock_tables({"die": cdie, "t_ps": t, "clock_ps": np.cumsum(rng.integers(0, 10**4, recs)),
                          "demand": rng.integers(1, 10, recs), "capacity": np.full(dies, 4)}, dies)
    clock_of = np.where(rng.random(n) < 0.5, die, -1)
    ptr = np.zeros(dies + 1, dtype=np.int64)
    np.cumsum(np.bincount(die, minlength=dies), out=ptr[1:])
    return die, ptr, start, end, value, int(rng.integers(1, 10**4)), clock_of, clock


def test_bin_by_die_is_bin_intervals_per_key(monkeypatch):
    rng = np.random.default_rng(1)
    for trial in range(60):
        die, ptr, start, end, value, bin_ps, clock_of, clock = _random_case(rng)
        want = _bin_by_die_straight(die, start, end, value, bin_ps, clock_of, clock)
        # Whole, a few dies at a time with the values made per group, and in windows of bins.
        for window, group_rows, by_group in ((None, 1 << 20, False), (None, 7, True), (1, 3, True), (17, 50, False)):
            if window is not None:
                monkeypatch.setattr(binning, "DENSE_CELLS", window * value.shape[1])
            got = bin_by_die(ptr, start, end, (lambda a, b: value[a:b]) if by_group else value, bin_ps,
                             clock_of=(lambda a, b: clock_of[a:b]) if by_group else clock_of, clock=clock,
                             group_rows=group_rows)
            monkeypatch.undo()
            for x, y in zip(got, want):
                assert x.dtype == y.dtype
                np.testing.assert_array_equal(x, y)


def test_bin_by_die_empty_and_no_clock():
    got = bin_by_die(np.zeros(4, dtype=np.int64), np.zeros(0), np.zeros(0), np.zeros((0, 4)), 10)
    assert [len(c) for c in got] == [0] * 7
    # 100 B on key 1 over [5, 25) in bins of 10: 25, 50, 25.
    d, q, b, v, dd, db, dv = bin_by_die([0, 0, 1], [5], [25], [[0, 100]], 10)
    assert d.tolist() == [1] * 3 and q.tolist() == [1] * 3 and b.tolist() == [0, 1, 2] and v.tolist() == [25, 50, 25]
    assert dd.tolist() == [1] * 3 and db.tolist() == [0, 1, 2] and dv.tolist() == [25, 50, 25]


def test_clock_search_from_a_hint_finds_the_binary_search_record():
    rng = np.random.default_rng(2)
    ct = np.sort(rng.integers(0, 1000, 200))  # repeated times too
    cv = np.cumsum(rng.random(200))
    cs = rng.random(200)
    for lo, hi in ((0, 200), (10, 11), (50, 120), (5, 5)):
        for t in rng.integers(-10, 1100, 200):
            want = _clock_at(t, lo, hi, ct, cv, cs)
            for at in (lo, hi - 1, int(rng.integers(0, 200)), -1, 500):
                got, _ = _clock_from(t, lo, hi, ct, cv, cs, at)
                assert got == want


def test_clock_tables_are_the_records_by_die():
    rng = np.random.default_rng(3)
    dies, n = 5, 400
    clock = {"die": rng.integers(0, dies, n).astype(np.int32), "t_ps": np.sort(rng.integers(0, 10**9, n)),
             "clock_ps": np.sort(rng.integers(0, 10**9, n)), "demand": rng.integers(1, 10**6, n),
             "capacity": rng.integers(1, 10**6, dies)}
    ptr, t, v, s = clock_tables(clock, dies)
    # The straightforward version: a stable argsort by die.
    order = np.argsort(clock["die"], kind="stable")
    die = clock["die"][order]
    cap = clock["capacity"].astype(np.float64)[die]
    demand = clock["demand"].astype(np.float64)[order]
    np.testing.assert_array_equal(ptr, np.concatenate([[0], np.cumsum(np.bincount(die, minlength=dies))]))
    np.testing.assert_array_equal(t, clock["t_ps"][order])
    np.testing.assert_array_equal(v, clock["clock_ps"][order].astype(np.float64))
    np.testing.assert_array_equal(s, np.where(demand > cap, cap / demand, 1.0))
    with pytest.raises(ValueError):
        clock_tables(clock, dies - 1)


# -- /tasks rows of COMP ops --------------------------------------------------------------------------
def test_op_rows_repeat_the_tables_op_by_op():
    rng = np.random.default_rng(4)
    tables = []
    for _ in range(5):
        m = int(rng.integers(0, 8))
        s = rng.integers(0, 10**6, m)
        tables.append((rng.integers(0, 6, m).astype(np.uint8), s, s + rng.integers(0, 10**6, m)))
    n_ops = 300
    op_start = rng.integers(0, 10**9, n_ops)
    op_end = op_start + rng.integers(0, 2 * 10**6, n_ops)  # some ops shorter than their tables
    rank = rng.integers(0, 16, n_ops).astype(np.int32)
    ops = np.sort(rng.choice(n_ops, 200, replace=False)).astype(np.int32)
    table_of = rng.integers(0, len(tables), ops.size)
    got = op_rows(ops, table_of, tables, op_start, op_end, rank, lead=2)
    assert got["bytes"][:2].tolist() == [0, 0]  # two rows left for the caller
    got = {k: v[2:] for k, v in got.items()}
    # The straightforward version: op by op.
    want = {k: [] for k in got}
    for op, t in zip(ops.tolist(), table_of.tolist()):
        code, s, e = tables[t]
        for j in range(code.size):
            want["die"].append(rank[op])
            want["pipe"].append(code[j])
            want["op"].append(op)
            want["start_ps"].append(min(op_start[op] + s[j], op_end[op]))
            want["end_ps"].append(min(op_start[op] + e[j], op_end[op]))
            want["bytes"].append(0)
    for k, dtype in (("die", np.int32), ("pipe", np.uint8), ("op", np.int32), ("start_ps", np.int64),
                     ("end_ps", np.int64), ("bytes", np.int64)):
        assert got[k].dtype == dtype
        assert got[k].tolist() == [int(x) for x in want[k]], k
    empty = op_rows(np.zeros(0, np.int32), np.zeros(0, np.int64), [], op_start, op_end, rank)
    assert all(v.size == 0 for v in empty.values())


# -- the checks after a run ---------------------------------------------------------------------------
def test_check_invariants_names_the_first_late_edge():
    from types import SimpleNamespace

    from cmemu.errors import SimulationError
    from cmemu.run import check_invariants

    rng = np.random.default_rng(8)
    for trial in range(200):
        n = int(rng.integers(1, 30))
        count = rng.integers(0, 4, n)
        ptr = np.concatenate([[0], np.cumsum(count)])
        idx = rng.integers(0, n, int(ptr[-1])).astype(np.int32)
        start = rng.integers(0, 100, n)
        end = start + rng.integers(0, 10, n)
        end = np.where(rng.random(n) < 0.9, np.minimum(end, start.min()), end)  # mostly respected
        L = SimpleNamespace(succ_ptr=ptr, succ_idx=idx, op_node_id=np.arange(n) + 1000, num_messages=0, num_trace_ops=n)
        r = SimpleNamespace(lowered=L, op_start_ps=start, op_end_ps=np.maximum(end, start))
        # The straightforward version: every edge, the first late one in CSR order.
        src = np.repeat(np.arange(n), np.diff(ptr))
        bad = np.flatnonzero(start[idx] < r.op_end_ps[src])
        if bad.size:
            with pytest.raises(SimulationError, match=f"node {1000 + idx[bad[0]]} started before its dependency "
                                                      f"node {1000 + src[bad[0]]} ended"):
                check_invariants(r)
        else:
            check_invariants(r)


def test_sweep_order_is_lexsort():
    from cmemu.output.summary import _order_by_key_then_time

    rng = np.random.default_rng(9)
    for k, t in ((rng.integers(0, 50, 1000), rng.integers(0, 10**6, 1000)),  # ties too
                 (rng.integers(0, 50, 1000), rng.integers(0, 2**62, 1000)),  # too wide: np.lexsort
                 (rng.integers(-3, 5, 100), rng.integers(0, 9, 100)),
                 (np.zeros(0, np.int64), np.zeros(0, np.int64))):
        np.testing.assert_array_equal(_order_by_key_then_time(k, t), np.lexsort((t, k)))
