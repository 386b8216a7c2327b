"""Column helpers of the post-run views and the timeline writer (Numba kernels): a stable order
by small integer keys, exact integer sums by index, and checks for repeated keys (in an order, or
in rows already sorted by them).

``lexsort_order`` gives ``np.lexsort``'s order (stable, the last key primary) by a counting sort
per key, O(rows + key range) each, where ``np.lexsort`` compares; a key already in order costs a
check and no pass. ``sum_by`` is ``np.add.at`` into zeros for int64 values: exact (no float
weights, as ``np.bincount`` would use), without ``ufunc.at``'s per-element overhead.
"""
from __future__ import annotations

import numpy as np
from cmemu.kernels import njit


@njit(cache=True, nogil=True)
def _stable_by(key, lo, n_keys, perm):
    # The rows of perm stably sorted by key[row] - lo (a counting sort); perm None: all rows, in
    # their order (no permutation to read them through).
    n = key.shape[0] if perm is None else perm.shape[0]
    counts = np.zeros(n_keys + 1, np.int64)
    for i in range(n):
        row = i
        if perm is not None:
            row = perm[i]
        counts[key[row] - lo + 1] += 1
    for k in range(n_keys):
        counts[k + 1] += counts[k]
    out = np.empty(n, np.int64)
    for i in range(n):
        row = i
        if perm is not None:
            row = perm[i]
        k = key[row] - lo
        out[counts[k]] = row
        counts[k] += 1
    return out


@njit(cache=True, nogil=True)
def _increasing(a, b):
    # Whether the rows are in strictly increasing order of the pair (a, b).
    for i in range(1, a.shape[0]):
        if a[i] < a[i - 1] or (a[i] == a[i - 1] and b[i] <= b[i - 1]):
            return False
    return True


@njit(cache=True, nogil=True)
def _repeats(order, a, b):
    # Whether two rows next to each other in this order have the same (a, b).
    for i in range(1, order.shape[0]):
        if a[order[i]] == a[order[i - 1]] and b[order[i]] == b[order[i - 1]]:
            return True
    return False


@njit(cache=True, nogil=True)
def _sum_by(index, value, n):
    out = np.zeros(n, np.int64)
    for i in range(index.shape[0]):
        out[index[i]] += value[i]
    return out


def lexsort_order(keys) -> np.ndarray:
    """``np.lexsort(keys)`` (int64 row order, stable, sorted by the last key first) for keys of
    integers; by counting sorts when each key's range is at most a few times the rows, by
    ``np.lexsort`` otherwise."""
    keys = [np.asarray(k) for k in keys]
    n = keys[0].shape[0] if keys else 0
    if n == 0 or any(not np.issubdtype(k.dtype, np.integer) or k.shape != (n,) for k in keys):
        return np.lexsort(keys)
    spans = [(int(k.min()), int(k.max())) for k in keys]
    if any(hi - lo > max(4 * n, 1 << 16) for lo, hi in spans):
        return np.lexsort(keys)
    perm = None
    for k, (lo, hi) in zip(keys, spans):
        if perm is None and (n < 2 or bool(np.all(k[1:] >= k[:-1]))):
            continue  # in order already: a stable sort by it leaves the rows as they are
        perm = _stable_by(k, lo, hi - lo + 1, perm)
    return np.arange(n, dtype=np.int64) if perm is None else perm


def has_repeats(order, a, b) -> bool:
    """Whether rows ``order`` (sorted by the pair (a, b)) hold some pair twice, without gathering
    the columns in that order."""
    return bool(_repeats(np.asarray(order, dtype=np.int64), np.asarray(a), np.asarray(b)))


def increasing(a, b) -> bool:
    """Whether the rows are in strictly increasing order of the pair (``a``, ``b``): sorted by
    it, and no pair twice."""
    return bool(_increasing(np.asarray(a), np.asarray(b)))


def sum_by(index, value, n: int) -> np.ndarray:
    """int64 ``[n]``: the sum of ``value`` per ``index`` (each in 0 .. n - 1), exactly."""
    index = np.asarray(index)
    if index.size and (index.min() < 0 or index.max() >= n):
        raise IndexError(f"sum_by: an index outside 0..{n - 1}")
    return _sum_by(index, np.asarray(value, dtype=np.int64), np.int64(n))
