"""Time per die from its op intervals: busy time (overlaps counted once) and exposed
communication, the time a die waits on communication with no work to hide it. Exposed
communication has two measures, each under its own name, both of one rule (``uncovered_ps``):

- ``exposed_comm_by_type_ps``: by node type, any receive or collective against any COMP or memory
  op; the timeline's ``/dies/exposed_comm_ps`` (docs/timeline-format.md).
- ``exposed_comm_by_class_ps``: by op class, as the decode and prefill scenarios classify a step's
  ops (a MoE dispatch or combine, the attention's collectives, against the step's compute); their
  ``exposed_comm_us``.

Everything is vectorised numpy on integer picoseconds: a sweep over sorted interval ends, never a
Python loop over ops.
"""
from __future__ import annotations

import numpy as np

from cmemu.vocab import NODE_TYPES

# Ops during which a die waits for other dies: a receive, a collective (its exit op spans it).
WAIT_TYPES = ("COMM_RECV", "COMM_COLL")
# Ops that keep a die doing useful work while it waits. A COMM_SEND running at the same time is
# communication too, so it does not hide the wait.
WORK_TYPES = ("COMP", "MEM_LOAD", "MEM_STORE")


def _codes(names, op_types) -> list[int]:
    return [op_types.index(t) for t in names if t in op_types]


def _order_by_key_then_time(k, t):
    """``np.lexsort((t, k))``: by one stable argsort of k * (tmax + 1) + t where that fits in
    int64 (keys and times >= 0), a third of the time of sorting on two keys."""
    if k.size and k.min() >= 0 and t.min() >= 0 and (int(k.max()) + 1) * (int(t.max()) + 1) < 2**63:
        return np.argsort(k * (int(t.max()) + 1) + t, kind="stable")
    return np.lexsort((t, k))


def _sweep(key, start, end, nkeys, cls=None):
    """Sort the interval ends of each key; return (key, time, active count per class) per event.

    ``cls`` (0 or 1 per interval) splits intervals into two classes counted separately.
    Each key's +1/-1 sum to zero, so one running sum over all keys restarts at every key.
    """
    key = np.asarray(key, dtype=np.int64)
    n = key.size
    k = np.concatenate([key, key])
    t = np.concatenate([np.asarray(start, dtype=np.int64), np.asarray(end, dtype=np.int64)])
    d = np.concatenate([np.ones(n, dtype=np.int64), -np.ones(n, dtype=np.int64)])
    order = _order_by_key_then_time(k, t)
    k, t, d = k[order], t[order], d[order]
    if cls is None:
        return k, t, (np.cumsum(d),)
    c = np.concatenate([cls, cls])[order].astype(bool)
    return k, t, (np.cumsum(np.where(c, 0, d)), np.cumsum(np.where(c, d, 0)))


def _per_key(k, t, active, nkeys):
    """Sum of the time between consecutive events of one key during which ``active`` holds."""
    dt = np.zeros(k.size, dtype=np.int64)
    if k.size > 1:
        same = k[1:] == k[:-1]
        dt[:-1] = np.where(same & active[:-1], t[1:] - t[:-1], 0)
    bounds = np.searchsorted(k, np.arange(nkeys + 1))
    cs = np.concatenate([[0], np.cumsum(dt)])
    return (cs[bounds[1:]] - cs[bounds[:-1]]).astype(np.int64)


def busy_union_ps(key, start, end, nkeys: int) -> np.ndarray:
    """For each key, the time during which at least one of its intervals runs (overlaps count once)."""
    k, t, (count,) = _sweep(key, start, end, nkeys)
    return _per_key(k, t, count > 0, nkeys)


def uncovered_ps(key, start, end, nkeys: int, wait, work) -> np.ndarray:
    """Per key: the time during which one of its ``wait`` intervals is in progress and none of its
    ``work`` intervals runs (boolean masks over the intervals; an interval in neither is left out).
    The rule behind both measures of exposed communication (``exposed_comm_by_type_ps`` and
    ``exposed_comm_by_class_ps``)."""
    wait, work = np.asarray(wait, dtype=bool), np.asarray(work, dtype=bool)
    sel = wait | work
    k, t, (waiting, working) = _sweep(np.asarray(key)[sel], np.asarray(start)[sel], np.asarray(end)[sel], nkeys,
                                      work[sel])
    return _per_key(k, t, (waiting > 0) & (working == 0), nkeys)


def exposed_comm_by_type_ps(rank, op_type, start, end, ranks: int, op_types=NODE_TYPES) -> np.ndarray:
    """Per rank: time during which a COMM_RECV or COMM_COLL is in progress and no COMP or MEM op
    of that rank runs (the timeline's /dies/exposed_comm_ps). ``op_types`` names the codes of
    ``op_type`` (the file's enum)."""
    op_type = np.asarray(op_type)
    wait, work = _codes(WAIT_TYPES, op_types), _codes(WORK_TYPES, op_types)
    return uncovered_ps(rank, start, end, ranks, np.isin(op_type, wait), np.isin(op_type, work))


def exposed_comm_by_class_ps(rank, is_comm, is_compute, start, end, ranks: int) -> np.ndarray:
    """Per die, the step scenarios' exposed communication: the time one of its collectives (by op
    class: MoE dispatch or combine, the attention's collectives; ``is_comm``) is in progress while
    none of its compute ops (``is_compute``) runs. Not the timeline's /dies/exposed_comm_ps
    (``exposed_comm_by_type_ps``), which goes by op type."""
    return uncovered_ps(rank, start, end, ranks, is_comm, is_compute)
