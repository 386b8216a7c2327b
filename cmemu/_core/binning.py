"""Binning interval counters in time (Numba kernel, with its pure-Python reference).

``bin_intervals`` spreads each interval's value evenly over [start, end) and sums it per (key,
bin): the HBM bytes an op moves, spread over its duration, per die and time bin. An interval's
value is split in proportion to its overlap with each bin (rounded down, in double precision: no
64-bit product can overflow), the remainder going to its last bin, so the bins of every key add
up exactly to its total.

With a die's HBM share records (``cmemu._core.Engine.hbm_clock``: from each record on, the die's
level, the bytes/s each op above it gets), an interval on that die with a demand is spread in
proportion to its own progress instead of real time: it runs at min(1, level / demand) of its
speed, so an op that shares its die's HBM moves its bytes at the rate the sharing gives it
(faster while it runs alone or below the level), and the bins of a die never show more than its
capacity.
"""
from __future__ import annotations

import numpy as np
from cmemu.kernels import njit


@njit(cache=True, nogil=True)
def _record_from(t, lo, hi, ct, at):
    """The last of one die's records ct[lo:hi] (in time order) at or before t, lo - 1 if none:
    searched outward from record ``at`` (the last one found), so in a few steps when the times
    asked come in about increasing order."""
    if hi <= lo or t < ct[lo]:
        return lo - 1
    if at < lo or at >= hi:
        at = lo
    step = 1
    if ct[at] <= t:  # ahead: the answer is in [a, min(a + step, hi) - 1]
        a = at
        while a + step < hi and ct[a + step] <= t:
            a += step
            step *= 2
        b = min(a + step, hi) - 1
    else:  # behind: ct[b] > t, and ct[lo] <= t
        b = at
        while b - step > lo and ct[b - step] > t:
            b -= step
            step *= 2
        a = max(b - step, lo)
        b -= 1
    while a < b:
        m = (a + b + 1) // 2
        if ct[m] <= t:
            a = m
        else:
            b = m - 1
    return a


@njit(cache=True, nogil=True)
def _progress(x0, x1, k, lo, hi, ct, cl, q):
    """How far an op of demand q progresses from x0 to x1 (x0 <= x1), in ps of its alone time,
    and the last record at or before x1; k is the last at or before x0 (lo - 1: none). After
    record j it runs at min(1, cl[j] / q) of its speed; before the die's first, at full speed."""
    p = 0.0
    x = x0
    while True:
        speed = 1.0 if k < lo or q <= cl[k] else cl[k] / q
        if k + 1 < hi and ct[k + 1] <= x1:
            p += (ct[k + 1] - x) * speed
            x = ct[k + 1]
            k += 1
        else:
            return p + (x1 - x) * speed, k


@njit(cache=True, nogil=True)
def _spread(keys, start, end, value, bin_ps, clock_of, demand, cptr, ct, cl, grid):
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
    at = 0
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
        whole = 0.0
        if c >= 0:
            lo, hi = cptr[c], cptr[c + 1]
            at = _record_from(s, lo, hi, ct, at)
            whole, _ = _progress(s, e, at, lo, hi, ct, cl, demand[i])
            if whole <= 0.0:
                c = -1
        x0, r = s, at
        while b <= last:
            x1 = min(e, (b + 1) * bin_ps)
            if c >= 0:
                part, r = _progress(x0, x1, r, cptr[c], cptr[c + 1], ct, cl, demand[i])
                frac = part / whole
            else:
                frac = (x1 - max(s, b * bin_ps)) / (e - s)
            x0 = x1
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


@njit(cache=True, nogil=True)
def _spread_window(lo_i, hi_i, start, end, value, bin_ps, w0, w1, clock_of, demand, cptr, ct, cl, grid, given):
    # Intervals lo_i:hi_i (one die's) summed into grid[bin - w0, key] for the bins w0 .. w1 - 1;
    # returns the range of bins touched. The same arithmetic as ``_spread``, an interval's part
    # of a bin computed once for all its keys.
    nk = value.shape[1]
    bmin, bmax = w1, w0 - 1
    at = 0  # the record found last
    for i in range(lo_i, hi_i):
        s, e = start[i], end[i]
        if e <= s:  # all its value in its bin
            b = s // bin_ps
            if b < w0 or b >= w1:
                continue
            for q in range(nk):
                if value[i, q] > 0:
                    grid[b - w0, q] += value[i, q]
            bmin, bmax = min(bmin, b), max(bmax, b)
            continue
        b0 = s // bin_ps
        last = (e - 1) // bin_ps
        if last < w0 or b0 >= w1:
            continue
        c = clock_of[i]
        whole = 0.0
        if c >= 0:
            at = _record_from(s, cptr[c], cptr[c + 1], ct, at)
            whole, _ = _progress(s, e, at, cptr[c], cptr[c + 1], ct, cl, demand[i])
            if whole <= 0.0:
                c = -1
        for q in range(nk):
            given[q] = 0
        lo, hi = max(b0, w0), min(last, w1 - 1)
        # Bin b's part: of the time, or of the op's progress from b's start (the interval's
        # start, then the previous bin's end) to its end.
        x0 = s
        r = at
        for b in range(b0, hi + 1):
            x1 = min(e, (b + 1) * bin_ps)
            if b == last:
                f = 0.0  # the last bin takes the rest
            elif c >= 0:
                part, r = _progress(x0, x1, r, cptr[c], cptr[c + 1], ct, cl, demand[i])
                f = part / whole
            else:
                f = (x1 - max(s, b * bin_ps)) / (e - s)
            x0 = x1
            for q in range(nk):
                v = value[i, q]
                if v <= 0:
                    continue
                share = v - given[q] if b == last else np.int64(v * f)
                given[q] += share
                if b >= lo:
                    grid[b - w0, q] += share
        bmin, bmax = min(bmin, lo), max(bmax, hi)
    return bmin, bmax


@njit(cache=True, nogil=True)
def _emit(grid, w0, bmin, bmax, die, k_die, k_key, k_bin, k_val, nkc, d_die, d_bin, d_val, ndc):
    # The grid's cells above 0 in bins bmin .. bmax, per key and summed per bin; the grid cleared.
    nk = grid.shape[1]
    for b in range(bmin, bmax + 1):
        total = 0
        hit = False
        for q in range(nk):
            x = grid[b - w0, q]
            grid[b - w0, q] = 0
            if x <= 0:
                continue
            k_die[nkc] = die
            k_key[nkc] = q
            k_bin[nkc] = b
            k_val[nkc] = x
            nkc += 1
            total += x
            hit = True
        if hit:
            d_die[ndc] = die
            d_bin[ndc] = b
            d_val[ndc] = total
            ndc += 1
    return nkc, ndc


@njit(cache=True, nogil=True)
def _spread_dies(ptr, first_die, start, end, value, bin_ps, n_bins, window, clock_of, demand, cptr, ct, cl,
                 k_die, k_key, k_bin, k_val, nkc, d_die, d_bin, d_val, ndc):
    # Die first_die + d's intervals are rows ptr[d]:ptr[d + 1]; value[i, q] is interval i's value
    # on key q. A die at a time, its bins a window at a time: sum into a grid of (bin, key), then
    # append its cells to the outputs from nkc and ndc on (sized by the caller).
    nk = value.shape[1]
    grid = np.zeros((max(1, min(window, n_bins)), nk), np.int64)
    given = np.zeros(nk, np.int64)
    for d in range(ptr.shape[0] - 1):
        for w0 in range(0, n_bins, window):
            w1 = min(n_bins, w0 + window)
            bmin, bmax = _spread_window(ptr[d], ptr[d + 1], start, end, value, bin_ps, w0, w1, clock_of,
                                        demand, cptr, ct, cl, grid, given)
            nkc, ndc = _emit(grid, w0, bmin, bmax, first_die + d, k_die, k_key, k_bin, k_val, nkc,
                             d_die, d_bin, d_val, ndc)
    return nkc, ndc


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


@njit(cache=True, nogil=True)
def _clock_csr(die, t, shared, sharers, dies):
    # A counting sort of the records by die (stable: time order within a die), with each
    # record's level: shared / sharers bytes/s, infinite with no sharers (every op at full speed).
    ptr = np.zeros(dies + 1, np.int64)
    for i in range(die.shape[0]):
        ptr[die[i] + 1] += 1
    for d in range(dies):
        ptr[d + 1] += ptr[d]
    pos = ptr[:-1].copy()
    ct = np.empty(die.shape[0], np.int64)
    cl = np.empty(die.shape[0], np.float64)
    for i in range(die.shape[0]):
        d = die[i]
        j = pos[d]
        pos[d] += 1
        ct[j] = t[i]
        cl[j] = float(shared[i]) / float(sharers[i]) if sharers[i] > 0 else np.inf
    return ptr, ct, cl


def clock_tables(clock, dies: int):
    """A run's HBM share records (``Engine.hbm_clock()``) as per-die CSR tables for the kernel:
    (ptr int64[dies + 1], time int64, level float64 bytes/s, inf where every op ran at full
    speed), time order within a die."""
    die = np.asarray(clock["die"])
    if die.size and (die.min() < 0 or die.max() >= dies):
        raise ValueError(f"clock_tables: a record's die is outside 0..{dies - 1}")
    cols = [np.asarray(clock[k]) for k in ("t_ps", "shared_byte_per_s", "sharers")]
    return _clock_csr(die if die.size else die.astype(np.int64), *(c if c.size else c.astype(np.int64) for c in cols),
                      np.int64(dies))


def bin_intervals(keys, start, end, value, bin_ps: int, native: bool = True, clock_of=None, clock=None, demand=None):
    """(key, bin, value) COO arrays: each interval's value spread over its time, summed per bin.

    ``clock_of`` (per interval, a die or -1), ``clock`` (``clock_tables``) and ``demand`` (per
    interval, bytes/s): an interval on a die with share records is spread by its progress at
    the share its demand got instead of real time."""
    args = [np.ascontiguousarray(a, dtype=np.int64) for a in (keys, start, end, value)]
    n = args[0].shape[0]
    if clock is None or clock_of is None:
        clock_of, demand, clock = _no_clock(n)
    clock_of = np.ascontiguousarray(clock_of, dtype=np.int64)
    demand = np.ascontiguousarray(demand, dtype=np.float64)
    if native:
        keys, start, end, value = args
        has = value > 0
        n_keys = int(keys[has].max()) + 1 if has.any() else 0
        n_bins = int(np.maximum(end[has] - 1, start[has]).max()) // int(bin_ps) + 1 if has.any() else 0
        if 0 < n_keys * n_bins <= DENSE_CELLS:
            # Few enough cells: sum into a grid (memory by cells, not by interval x bin pairs).
            grid = np.zeros((n_keys, n_bins), dtype=np.int64)
            _spread(*args, np.int64(bin_ps), clock_of, demand, *clock, grid)
            k, b = np.nonzero(grid)  # by key, then bin
            return k.astype(np.int32), b.astype(np.int32), grid[k, b]
        k, b, v = _spread(*args, np.int64(bin_ps), clock_of, demand, *clock, np.zeros((0, 0), dtype=np.int64))
    else:
        k, b, v = _spread_reference(*args, bin_ps, clock_of, demand, clock)
    return _combine(k, b, v)


def _no_clock(n: int):
    return (np.full(n, -1, dtype=np.int64), np.zeros(n),
            (np.zeros(1, dtype=np.int64), np.zeros(0, dtype=np.int64), np.zeros(0)))


def bin_by_die(ptr, start, end, value, bin_ps: int, clock_of=None, clock=None, group_rows: int = 1 << 20,
               demand=None):
    """``bin_intervals`` for intervals grouped by die, each with a value per key of its die (an
    HBM stack): die d's intervals are rows ``ptr[d]:ptr[d + 1]``; ``value`` is int64
    ``[intervals, keys]`` (at most 127 keys), or a function ``(a, b)`` giving its rows a:b, which
    is called a group of dies at a time (at most about ``group_rows`` rows, so that a big run's
    values are never all in memory); ``clock_of`` and ``demand`` (as for ``bin_intervals``) may be
    such functions too. The same sums, cell
    for cell, as ``bin_intervals`` of every (interval, key) with key ``die * keys + key``, but an
    interval's part of each bin is computed once for all its keys, and a die's cells are summed
    in a grid of its bins (at most DENSE_CELLS cells at once).

    Returns (per key: die int32, key int8, bin int32, value int64, sorted by die, bin, key;
    per die: die int32, bin int32, value int64, sorted by die, bin): the cells above 0, and per
    (die, bin) with one of them, their sum. The columns are views of arrays sized for the most
    cells the dies' bins could hold, of which only the rows written take memory."""
    ptr = np.ascontiguousarray(ptr, dtype=np.int64)
    start, end = (np.ascontiguousarray(a, dtype=np.int64) for a in (start, end))
    n, dies, bin_ps = start.shape[0], ptr.shape[0] - 1, int(bin_ps)
    if clock is None or clock_of is None:
        clock_of, demand, clock = _no_clock(n)
    values = value if callable(value) else (lambda a, b: value[a:b])
    clocks = clock_of if callable(clock_of) else (lambda a, b: clock_of[a:b])
    demands = demand if callable(demand) else (lambda a, b: demand[a:b])
    # A die's cells per key: at most its range of bins, and at most the bins its intervals touch.
    first_bin = start // bin_ps
    last_bin = np.maximum(end - 1, start) // bin_ps
    busy = ptr[:-1][ptr[1:] > ptr[:-1]]
    cells = int(np.minimum(np.maximum.reduceat(last_bin, busy) - np.minimum.reduceat(first_bin, busy) + 1,
                           np.add.reduceat(last_bin - first_bin + 1, busy)).sum()) if n else 0
    n_bins = int(last_bin.max()) + 1 if n else 0
    del first_bin, last_bin
    bounds = [0]
    for d in range(dies):  # groups of whole dies of at most about group_rows rows
        if ptr[d + 1] - ptr[bounds[-1]] > group_rows and d > bounds[-1]:
            bounds.append(d)
    bounds.append(dies)
    out = None
    nkc = ndc = 0
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        a, b = int(ptr[lo]), int(ptr[hi])
        v = np.ascontiguousarray(values(a, b), dtype=np.int64)
        nk = v.shape[1]
        if nk > 127:
            raise ValueError(f"bin_by_die: at most 127 keys per die, got {nk}")
        if out is None:
            out = (np.empty(cells * nk, np.int32), np.empty(cells * nk, np.int8), np.empty(cells * nk, np.int32),
                   np.empty(cells * nk, np.int64), np.empty(cells, np.int32), np.empty(cells, np.int32),
                   np.empty(cells, np.int64))
            window = max(1, DENSE_CELLS // max(nk, 1))
        nkc, ndc = _spread_dies(ptr[lo:hi + 1] - a, np.int64(lo), start[a:b], end[a:b], v, np.int64(bin_ps),
                                np.int64(n_bins), np.int64(window), np.ascontiguousarray(clocks(a, b), dtype=np.int64),
                                np.ascontiguousarray(demands(a, b), dtype=np.float64), *clock, *out[:4],
                                np.int64(nkc), *out[4:], np.int64(ndc))
        del v
    if out is None:
        return (np.zeros(0, np.int32), np.zeros(0, np.int8), np.zeros(0, np.int32), np.zeros(0, np.int64),
                np.zeros(0, np.int32), np.zeros(0, np.int32), np.zeros(0, np.int64))
    return tuple(c[:nkc] for c in out[:4]) + tuple(c[:ndc] for c in out[4:])


def _progress_reference(x0, x1, lo, hi, ct, cl, q):
    """An op's progress from x0 to x1, record by record (the last at or before a time, from
    the die's first)."""
    p, x = 0.0, x0
    k = lo - 1
    while k + 1 < hi and ct[k + 1] <= x0:
        k += 1
    while True:
        speed = 1.0 if k < lo or q <= cl[k] else cl[k] / q
        if k + 1 < hi and ct[k + 1] <= x1:
            p += (ct[k + 1] - x) * speed
            x = ct[k + 1]
            k += 1
        else:
            return p + (x1 - x) * speed


def _spread_reference(keys, start, end, value, bin_ps, clock_of, demand, clock):
    cptr, ct, cl = (a.tolist() for a in clock)
    ok, ob, ov = [], [], []
    for key, s, e, v, c, q in zip(keys.tolist(), start.tolist(), end.tolist(), value.tolist(), clock_of.tolist(),
                                  demand.tolist()):
        if v <= 0:
            continue
        if e <= s:
            ok.append(key), ob.append(s // bin_ps), ov.append(v)
            continue
        given = 0
        last = (e - 1) // bin_ps
        if c >= 0:
            def progress(x0, x1, c=c, q=q):
                return _progress_reference(x0, x1, cptr[c], cptr[c + 1], ct, cl, q)
            whole = progress(s, e)
            if whole <= 0:
                c = -1
        x0 = s
        for b in range(s // bin_ps, last + 1):
            x1 = min(e, (b + 1) * bin_ps)
            frac = progress(x0, x1) / whole if c >= 0 else (x1 - max(s, b * bin_ps)) / (e - s)
            x0 = x1
            share = v - given if b == last else int(v * frac)
            ok.append(key), ob.append(b), ov.append(share)
            given += share
    return (np.asarray(ok, dtype=np.int64), np.asarray(ob, dtype=np.int64), np.asarray(ov, dtype=np.int64))
