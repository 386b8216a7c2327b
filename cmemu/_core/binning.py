"""Binning interval counters in time (Numba kernel, with its pure-Python reference).

``bin_intervals`` spreads each interval's value evenly over [start, end) and sums it per (key,
bin): the HBM bytes an op moves, spread over its duration, per die and time bin. An interval's
value is split in proportion to its overlap with each bin (rounded down, in double precision: no
64-bit product can overflow), the remainder going to its last bin, so the bins of every key add
up exactly to its total.
"""
from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True)
def _spread(keys, start, end, value, bin_ps, n_keys):
    # First pass: how many (key, bin) pairs each interval touches, to size the output.
    total = 0
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
            out_key[k] = keys[i]
            out_bin[k] = s // bin_ps
            out_val[k] = v
            k += 1
            continue
        b = s // bin_ps
        last = (e - 1) // bin_ps
        given = 0
        while b <= last:
            lo = max(s, b * bin_ps)
            hi = min(e, (b + 1) * bin_ps)
            share = v - given if b == last else np.int64(v * ((hi - lo) / (e - s)))
            out_key[k] = keys[i]
            out_bin[k] = b
            out_val[k] = share
            given += share
            k += 1
            b += 1
    return out_key, out_bin, out_val


def _combine(key, bin_, val):
    """Sum duplicate (key, bin) pairs; sorted by key then bin."""
    if key.size == 0:
        return key.astype(np.int32), bin_.astype(np.int32), val
    order = np.lexsort((bin_, key))
    key, bin_, val = key[order], bin_[order], val[order]
    first = np.ones(key.size, dtype=bool)
    first[1:] = (key[1:] != key[:-1]) | (bin_[1:] != bin_[:-1])
    starts = np.flatnonzero(first)
    return key[starts].astype(np.int32), bin_[starts].astype(np.int32), np.add.reduceat(val, starts)


def bin_intervals(keys, start, end, value, bin_ps: int, native: bool = True):
    """(key, bin, value) COO arrays: each interval's value spread over its time, summed per bin."""
    args = [np.ascontiguousarray(a, dtype=np.int64) for a in (keys, start, end, value)]
    if native:
        k, b, v = _spread(*args, np.int64(bin_ps), np.int64(0))
    else:
        k, b, v = _spread_reference(*args, bin_ps)
    return _combine(k, b, v)


def _spread_reference(keys, start, end, value, bin_ps):
    ok, ob, ov = [], [], []
    for key, s, e, v in zip(keys.tolist(), start.tolist(), end.tolist(), value.tolist()):
        if v <= 0:
            continue
        if e <= s:
            ok.append(key), ob.append(s // bin_ps), ov.append(v)
            continue
        given = 0
        last = (e - 1) // bin_ps
        for b in range(s // bin_ps, last + 1):
            lo, hi = max(s, b * bin_ps), min(e, (b + 1) * bin_ps)
            share = v - given if b == last else int(v * ((hi - lo) / (e - s)))
            ok.append(key), ob.append(b), ov.append(share)
            given += share
    return (np.asarray(ok, dtype=np.int64), np.asarray(ob, dtype=np.int64), np.asarray(ov, dtype=np.int64))
