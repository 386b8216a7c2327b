"""Binning interval counters in time (Numba kernel, with its pure-Python reference).

``bin_intervals`` spreads each interval's value evenly over [start, end) and sums it per (key,
bin): the HBM bytes an op moves, spread over its duration, per die and time bin. An interval's
value is split in proportion to its overlap with each bin (rounded down, in double precision: no
64-bit product can overflow), the remainder going to its last bin, so the bins of every key add
up exactly to its total.

With a clock (``cmemu._core.Engine.hbm_clock``: a die's HBM clock, piecewise linear in time), an
interval on that die is spread in proportion to the clock's advance over each bin instead of
real time: an op that shares its die's HBM moves its bytes at the rate the sharing gives it
(faster while it runs alone), so the bins of a die never show more than its capacity.
"""
from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True)
def _clock_at(t, lo, hi, ct, cv, cs):
    """The clock of one die (its records ct/cv/cs[lo:hi], in time order) at time t."""
    if hi <= lo or t < ct[lo]:
        return float(t)
    a, b = lo, hi - 1
    while a < b:  # the last record at or before t
        m = (a + b + 1) // 2
        if ct[m] <= t:
            a = m
        else:
            b = m - 1
    return cv[a] + (t - ct[a]) * cs[a]


@njit(cache=True)
def _spread(keys, start, end, value, bin_ps, clock_of, cptr, ct, cv, cs, grid):
    # With a grid (keys x bins, not empty): sum into it, and return nothing else. Without one:
    # first, how many (key, bin) pairs each interval touches, to size the output.
    dense = grid.shape[0] > 0
    total = 0
    if not dense:
        for i in range(keys.shape[0]):
            if value[i] > 0:
                last = (end[i] - 1) // bin_ps if end[i] > start[i] else start[i] // bin_ps
                total += last - start[i] // bin_ps + 1
    out_key = np.empty(total, np.int64)
    out_bin = np.empty(total, np.int64)
    out_val = np.empty(total, np.int64)
    k = 0
    for i in range(keys.shape[0]):
        v = value[i]
        if v <= 0:
            continue
        s, e = start[i], end[i]
        if e <= s:
            if dense:
                grid[keys[i], s // bin_ps] += v
                continue
            out_key[k] = keys[i]
            out_bin[k] = s // bin_ps
            out_val[k] = v
            k += 1
            continue
        b = s // bin_ps
        last = (e - 1) // bin_ps
        given = 0
        c = clock_of[i]
        vs, ve = 0.0, 0.0
        if c >= 0:
            vs = _clock_at(s, cptr[c], cptr[c + 1], ct, cv, cs)
            ve = _clock_at(e, cptr[c], cptr[c + 1], ct, cv, cs)
            if ve <= vs:
                c = -1
        while b <= last:
            lo = max(s, b * bin_ps)
            hi = min(e, (b + 1) * bin_ps)
            if c >= 0:
                frac = (_clock_at(hi, cptr[c], cptr[c + 1], ct, cv, cs)
                        - _clock_at(lo, cptr[c], cptr[c + 1], ct, cv, cs)) / (ve - vs)
            else:
                frac = (hi - lo) / (e - s)
            share = v - given if b == last else np.int64(v * frac)
            given += share
            if dense:
                grid[keys[i], b] += share
            else:
                out_key[k] = keys[i]
                out_bin[k] = b
                out_val[k] = share
                k += 1
            b += 1
    return out_key, out_bin, out_val


def _combine(key, bin_, val):
    """Sum duplicate (key, bin) pairs; sorted by key then bin; pairs summing to 0 left out."""
    if key.size == 0:
        return key.astype(np.int32), bin_.astype(np.int32), val
    order = np.lexsort((bin_, key))
    key, bin_, val = key[order], bin_[order], val[order]
    first = np.ones(key.size, dtype=bool)
    first[1:] = (key[1:] != key[:-1]) | (bin_[1:] != bin_[:-1])
    starts = np.flatnonzero(first)
    key, bin_, val = key[starts], bin_[starts], np.add.reduceat(val, starts)
    keep = val != 0
    return key[keep].astype(np.int32), bin_[keep].astype(np.int32), val[keep]


# Above this many (key, bin) cells, bin_intervals sums sparse pairs instead of a dense grid.
DENSE_CELLS = 1 << 24


def clock_tables(clock, dies: int):
    """A run's HBM clock records (``Engine.hbm_clock()``) as per-die CSR tables for the kernel:
    (ptr int64[dies + 1], time int64, clock float64, speed float64), time order within a die."""
    die = np.asarray(clock["die"], dtype=np.int64)
    order = np.argsort(die, kind="stable")  # records come in time order: keep it per die
    ptr = np.zeros(dies + 1, dtype=np.int64)
    np.cumsum(np.bincount(die, minlength=dies)[:dies], out=ptr[1:])
    cap = np.asarray(clock["capacity"], dtype=np.float64)
    demand = np.asarray(clock["demand"], dtype=np.float64)[order]
    speed = np.ones(order.size)
    over = demand > cap[die[order]]
    speed[over] = cap[die[order]][over] / demand[over]
    return (ptr, np.asarray(clock["t_ps"], dtype=np.int64)[order],
            np.asarray(clock["clock_ps"], dtype=np.float64)[order], speed)


def bin_intervals(keys, start, end, value, bin_ps: int, native: bool = True, clock_of=None, clock=None):
    """(key, bin, value) COO arrays: each interval's value spread over its time, summed per bin.

    ``clock_of`` (per interval, a die or -1) and ``clock`` (``clock_tables``): intervals on a die
    with a clock are spread by that clock's advance instead of real time."""
    args = [np.ascontiguousarray(a, dtype=np.int64) for a in (keys, start, end, value)]
    n = args[0].shape[0]
    if clock is None or clock_of is None:
        clock_of = np.full(n, -1, dtype=np.int64)
        clock = (np.zeros(1, dtype=np.int64), np.zeros(0, dtype=np.int64), np.zeros(0), np.zeros(0))
    clock_of = np.ascontiguousarray(clock_of, dtype=np.int64)
    if native:
        keys, start, end, value = args
        has = value > 0
        n_keys = int(keys[has].max()) + 1 if has.any() else 0
        n_bins = int(np.maximum(end[has] - 1, start[has]).max()) // int(bin_ps) + 1 if has.any() else 0
        if 0 < n_keys * n_bins <= DENSE_CELLS:
            # Few enough cells: sum into a grid (memory by cells, not by interval x bin pairs).
            grid = np.zeros((n_keys, n_bins), dtype=np.int64)
            _spread(*args, np.int64(bin_ps), clock_of, *clock, grid)
            k, b = np.nonzero(grid)  # by key, then bin
            return k.astype(np.int32), b.astype(np.int32), grid[k, b]
        k, b, v = _spread(*args, np.int64(bin_ps), clock_of, *clock, np.zeros((0, 0), dtype=np.int64))
    else:
        k, b, v = _spread_reference(*args, bin_ps, clock_of, clock)
    return _combine(k, b, v)


def _clock_at_reference(t, lo, hi, ct, cv, cs):
    if hi <= lo or t < ct[lo]:
        return float(t)
    a = lo
    for k in range(lo, hi):  # the last record at or before t
        if ct[k] <= t:
            a = k
        else:
            break
    return cv[a] + (t - ct[a]) * cs[a]


def _spread_reference(keys, start, end, value, bin_ps, clock_of, clock):
    cptr, ct, cv, cs = (a.tolist() for a in clock)
    ok, ob, ov = [], [], []
    for key, s, e, v, c in zip(keys.tolist(), start.tolist(), end.tolist(), value.tolist(), clock_of.tolist()):
        if v <= 0:
            continue
        if e <= s:
            ok.append(key), ob.append(s // bin_ps), ov.append(v)
            continue
        given = 0
        last = (e - 1) // bin_ps
        if c >= 0:
            def at(t, c=c):
                return _clock_at_reference(t, cptr[c], cptr[c + 1], ct, cv, cs)
            vs, ve = at(s), at(e)
            if ve <= vs:
                c = -1
        for b in range(s // bin_ps, last + 1):
            lo, hi = max(s, b * bin_ps), min(e, (b + 1) * bin_ps)
            frac = (at(hi) - at(lo)) / (ve - vs) if c >= 0 else (hi - lo) / (e - s)
            share = v - given if b == last else int(v * frac)
            ok.append(key), ob.append(b), ov.append(share)
            given += share
    return (np.asarray(ok, dtype=np.int64), np.asarray(ob, dtype=np.int64), np.asarray(ov, dtype=np.int64))
