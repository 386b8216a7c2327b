"""The die's L2 cache (docs/machine.md 2.1: 192 MiB, 512 B lines), as an LRU over the blocks a tile
schedule reads (L1 chunks of A and B panels, KV blocks, ...).

A schedule names what each MTE2 transfer reads by an object id and a size; the same id read again
hits if the object is still in the cache, as an LRU over objects of their size (rounded up to
whole lines) decides. So reuse becomes hits when the working set between two uses fits, and
misses when it does not: hits and misses come from the schedule, not from a hit-rate parameter.
Outputs are written through the cache (write-allocate) and take space like anything else.

``lru_miss_byte`` is the same LRU for reads of an object's first bytes (a KV block read up to a
causal diagonal, then whole): a resident object read longer than it is misses only the bytes
beyond it, and grows.

Left out: set associativity and conflict misses, prefetch, and other ops or streams sharing the
cache at the same time.
``lru_run`` and ``lru_miss_byte`` are Numba kernels; their ``py_func`` the pure-Python references.
"""
from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True)
def lru_run(obj, nbytes, capacity, n_objects):
    """Hit flag of each access ``obj[i]`` (an object id < n_objects) of ``nbytes[i]`` bytes, in
    order, through an LRU of ``capacity`` bytes (objects larger than it never stay)."""
    n = obj.shape[0]
    prev = np.full(n_objects, -1, dtype=np.int64)
    nxt = np.full(n_objects, -1, dtype=np.int64)
    size = np.zeros(n_objects, dtype=np.int64)
    head = -1
    tail = -1
    used = 0
    hits = np.zeros(n, dtype=np.bool_)
    for i in range(n):
        o = obj[i]
        if size[o] > 0:
            hits[i] = True
            p = prev[o]
            q = nxt[o]
            if p >= 0:
                nxt[p] = q
            else:
                head = q
            if q >= 0:
                prev[q] = p
            else:
                tail = p
            used -= size[o]
        size[o] = nbytes[i]
        used += nbytes[i]
        prev[o] = -1
        nxt[o] = head
        if head >= 0:
            prev[head] = o
        head = o
        if tail < 0:
            tail = o
        while used > capacity and tail >= 0:
            t = tail
            p = prev[t]
            used -= size[t]
            size[t] = 0
            prev[t] = -1
            nxt[t] = -1
            tail = p
            if p >= 0:
                nxt[p] = -1
            else:
                head = -1
    return hits


@njit(cache=True)
def lru_miss_byte(obj, nbytes, capacity, n_objects):
    """Bytes of each access ``obj[i]`` (reading the object's first ``nbytes[i]`` bytes) not in an
    LRU of ``capacity`` bytes: all of them if the object is not resident, else those beyond its
    resident length, which grows to the longest read (objects larger than the cache never stay)."""
    n = obj.shape[0]
    prev = np.full(n_objects, -1, dtype=np.int64)
    nxt = np.full(n_objects, -1, dtype=np.int64)
    size = np.zeros(n_objects, dtype=np.int64)
    head = -1
    tail = -1
    used = 0
    miss = np.zeros(n, dtype=np.int64)
    for i in range(n):
        o = obj[i]
        b = nbytes[i]
        s = size[o]
        if s > 0:
            miss[i] = max(b - s, 0)
            p = prev[o]
            q = nxt[o]
            if p >= 0:
                nxt[p] = q
            else:
                head = q
            if q >= 0:
                prev[q] = p
            else:
                tail = p
            used -= s
        else:
            miss[i] = b
        size[o] = max(s, b)
        used += size[o]
        prev[o] = -1
        nxt[o] = head
        if head >= 0:
            prev[head] = o
        head = o
        if tail < 0:
            tail = o
        while used > capacity and tail >= 0:
            t = tail
            p = prev[t]
            used -= size[t]
            size[t] = 0
            prev[t] = -1
            nxt[t] = -1
            tail = p
            if p >= 0:
                nxt[p] = -1
            else:
                head = -1
    return miss


def simulate(objects, sizes, capacity_byte: int, n_objects: int | None = None, native: bool = True):
    """Hit flags of a sequence of object accesses."""
    obj = np.ascontiguousarray(objects, dtype=np.int64)
    nb = np.ascontiguousarray(sizes, dtype=np.int64)
    if n_objects is None:
        n_objects = int(obj.max()) + 1 if len(obj) else 1
    fn = lru_run if native else lru_run.py_func
    return fn(obj, nb, int(capacity_byte), int(n_objects))
