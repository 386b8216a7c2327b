"""The results built after the simulation, checked against the straightforward versions they
replaced: the HBM series spread per die (binning.bin_by_die), the clock tables, the COMP ops'
/tasks rows (die.intervals.op_rows)."""
import numpy as np
import pytest

import cmemu._core.binning as binning
from cmemu._core.binning import _progress, _progress_reference, _record_from, bin_by_die, bin_intervals, clock_tables
from cmemu.die.intervals import op_rows


# -- HBM series --------------------------------------------------------------------------------------
def _bin_by_die_straight(die, start, end, value, bin_ps, clock_of, clock, demand):
    """Every (interval, key) through bin_intervals with key die * keys + key, cells above 0, sorted
    by die, bin, key; per (die, bin) the sum of its cells (what the HBM series did before: cmemu.results.hbm)."""
    n, nk = value.shape
    keys = (die[:, None].astype(np.int64) * nk + np.arange(nk)[None, :]).ravel()
    k, b, v = bin_intervals(keys, np.repeat(start, nk), np.repeat(end, nk), value.ravel(), bin_ps,
                            clock_of=np.repeat(clock_of, nk), clock=clock, demand=np.repeat(demand, nk))
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
    sharers = rng.integers(0, 4, recs)
    clock = clock_tables({"die": cdie, "t_ps": t, "shared_byte_per_s": np.where(sharers > 0, rng.integers(1, 10, recs), 0),
                          "sharers": sharers, "capacity": np.full(dies, 10)}, dies)
    clock_of = np.where(rng.random(n) < 0.5, die, -1)
    demand = rng.integers(1, 10, n).astype(np.float64)
    ptr = np.zeros(dies + 1, dtype=np.int64)
    np.cumsum(np.bincount(die, minlength=dies), out=ptr[1:])
    return die, ptr, start, end, value, int(rng.integers(1, 10**4)), clock_of, clock, demand


def test_bin_by_die_is_bin_intervals_per_key(monkeypatch):
    rng = np.random.default_rng(1)
    for trial in range(60):
        die, ptr, start, end, value, bin_ps, clock_of, clock, demand = _random_case(rng)
        want = _bin_by_die_straight(die, start, end, value, bin_ps, clock_of, clock, demand)
        # Whole, a few dies at a time with the values made per group, and in windows of bins.
        for window, group_rows, by_group in ((None, 1 << 20, False), (None, 7, True), (1, 3, True), (17, 50, False)):
            if window is not None:
                monkeypatch.setattr(binning, "DENSE_CELLS", window * value.shape[1])
            got = bin_by_die(ptr, start, end, (lambda a, b: value[a:b]) if by_group else value, bin_ps,
                             clock_of=(lambda a, b: clock_of[a:b]) if by_group else clock_of, clock=clock,
                             group_rows=group_rows, demand=(lambda a, b: demand[a:b]) if by_group else demand)
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


def test_record_search_from_a_hint_finds_the_last_record_at_or_before():
    rng = np.random.default_rng(2)
    ct = np.sort(rng.integers(0, 1000, 200))  # repeated times too
    for lo, hi in ((0, 200), (10, 11), (50, 120), (5, 5)):
        for t in rng.integers(-10, 1100, 200):
            at_or_before = np.flatnonzero(ct[lo:hi] <= t)
            want = lo + int(at_or_before[-1]) if at_or_before.size else lo - 1
            for at in (lo, hi - 1, int(rng.integers(0, 200)), -1, 500):
                assert _record_from(t, lo, hi, ct, at) == want


def test_progress_walked_from_a_record_is_the_reference_s():
    # An op's progress over [x0, x1] from the record found for x0, in steps as the bins go
    # (each step from the record the last one ended at), against the walk from the die's first
    # record; and by hand: full speed before the first record and while the level is above the
    # demand.
    rng = np.random.default_rng(6)
    ct = np.sort(rng.integers(0, 1000, 50))
    cl = np.where(rng.random(50) < 0.3, np.inf, rng.integers(1, 10, 50).astype(np.float64))
    for lo, hi in ((0, 50), (20, 21), (5, 5)):
        for _ in range(100):
            x0, x1 = np.sort(rng.integers(-10, 1100, 2))
            q = float(rng.integers(1, 12))
            k = _record_from(x0, lo, hi, ct, lo)
            got, k1 = _progress(x0, x1, k, lo, hi, ct, cl, q)
            assert got == _progress_reference(x0, x1, lo, hi, ct, cl, q)
            assert k1 == _record_from(x1, lo, hi, ct, lo)
    ct, cl = np.array([10, 20]), np.array([2.0, np.inf])
    assert _progress(0, 30, -1, 0, 2, ct, cl, 4.0)[0] == 10 + 5 + 10
    assert _progress(0, 30, -1, 0, 2, ct, cl, 2.0)[0] == 30


def test_clock_tables_are_the_records_by_die():
    rng = np.random.default_rng(3)
    dies, n = 5, 400
    sharers = rng.integers(0, 5, n)
    clock = {"die": rng.integers(0, dies, n).astype(np.int32), "t_ps": np.sort(rng.integers(0, 10**9, n)),
             "shared_byte_per_s": np.where(sharers > 0, rng.integers(1, 10**6, n), 0), "sharers": sharers,
             "capacity": rng.integers(1, 10**6, dies)}
    ptr, t, level = clock_tables(clock, dies)
    # The straightforward version: a stable argsort by die.
    order = np.argsort(clock["die"], kind="stable")
    die = clock["die"][order]
    np.testing.assert_array_equal(ptr, np.concatenate([[0], np.cumsum(np.bincount(die, minlength=dies))]))
    np.testing.assert_array_equal(t, clock["t_ps"][order])
    shared, by = clock["shared_byte_per_s"][order].astype(np.float64), sharers[order]
    np.testing.assert_array_equal(level, np.where(by > 0, shared / np.maximum(by, 1), np.inf))
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
    from cmemu.results.overlap import _order_by_key_then_time

    rng = np.random.default_rng(9)
    for k, t in ((rng.integers(0, 50, 1000), rng.integers(0, 10**6, 1000)),  # ties too
                 (rng.integers(0, 50, 1000), rng.integers(0, 2**62, 1000)),  # too wide: np.lexsort
                 (rng.integers(-3, 5, 100), rng.integers(0, 9, 100)),
                 (np.zeros(0, np.int64), np.zeros(0, np.int64))):
        np.testing.assert_array_equal(_order_by_key_then_time(k, t), np.lexsort((t, k)))
