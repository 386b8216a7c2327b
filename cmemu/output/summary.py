"""Per-die figures derived from the op intervals: busy time per op type, exposed communication.

Both the writer (``/dies`` of a v2 timeline) and the reader (for v1 files, which have no
``/dies``) call these, so a figure is computed one way only. Everything is vectorised numpy on
integer picoseconds: a sweep over sorted interval ends, never a Python loop over ops.
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
    The rule behind both measures of exposed communication (``exposed_comm_ps`` here, and the
    decode and prefill scenarios' ``step_exposed_comm_ps``)."""
    wait, work = np.asarray(wait, dtype=bool), np.asarray(work, dtype=bool)
    sel = wait | work
    k, t, (waiting, working) = _sweep(np.asarray(key)[sel], np.asarray(start)[sel], np.asarray(end)[sel], nkeys,
                                      work[sel])
    return _per_key(k, t, (waiting > 0) & (working == 0), nkeys)


def exposed_comm_ps(rank, op_type, start, end, ranks: int, op_types=NODE_TYPES) -> np.ndarray:
    """Per rank: time during which a COMM_RECV or COMM_COLL is in progress and no COMP or MEM op
    of that rank runs (the timeline's /dies/exposed_comm_ps). ``op_types`` names the codes of
    ``op_type`` (the file's enum)."""
    op_type = np.asarray(op_type)
    wait, work = _codes(WAIT_TYPES, op_types), _codes(WORK_TYPES, op_types)
    return uncovered_ps(rank, start, end, ranks, np.isin(op_type, wait), np.isin(op_type, work))


def die_summary(ops: dict, messages: dict, spec: dict, op_types=NODE_TYPES) -> dict:
    """The ``/dies`` columns, from ``/ops`` and ``/messages`` columns and the resolved spec (a dict).

    ``ops`` needs rank, type, start_ps, end_ps, bytes; ``messages`` needs send_op, recv_op, bytes;
    ``op_types`` names the type codes (``busy_ps`` has one column per name).
    """
    dies_per_npu = int(spec["dies_per_npu"])
    dies_per_node = int(spec["npus_per_node"]) * dies_per_npu
    dies = int(spec["nodes"]) * dies_per_node
    ntypes = len(op_types)
    rank = np.asarray(ops["rank"], dtype=np.int64)
    typ = np.asarray(ops["type"], dtype=np.int64)
    start = np.asarray(ops["start_ps"], dtype=np.int64)
    end = np.asarray(ops["end_ps"], dtype=np.int64)
    nbytes = np.asarray(ops["bytes"], dtype=np.int64)
    die = np.arange(dies, dtype=np.int64)

    def total(index, values):
        out = np.zeros(dies, dtype=np.int64)
        np.add.at(out, index, values)
        return out

    send, recv = np.asarray(messages["send_op"]), np.asarray(messages["recv_op"])
    mbytes = np.asarray(messages["bytes"], dtype=np.int64)
    load, store = typ == op_types.index("MEM_LOAD"), typ == op_types.index("MEM_STORE")
    return {
        "node": (die // dies_per_node).astype(np.int32),
        "npu": (die // dies_per_npu).astype(np.int32),
        "die_in_npu": (die % dies_per_npu).astype(np.int32),
        "busy_ps": busy_union_ps(rank * ntypes + typ, start, end, dies * ntypes).reshape(dies, ntypes),
        "any_busy_ps": busy_union_ps(rank, start, end, dies),
        "exposed_comm_ps": exposed_comm_ps(rank, typ, start, end, dies, op_types),
        "bytes_sent": total(rank[send], mbytes),
        "bytes_received": total(rank[recv], mbytes),
        "hbm_read_bytes": total(rank[load], nbytes[load]),
        "hbm_write_bytes": total(rank[store], nbytes[store]),
    }


# What the HBM utilisation of ``cmemu report`` is measured against (Timeline.summary()["hbm"]).
HBM_CAPACITY_ACHIEVED = ("the die model's achieved sequential read rate (cmemu.lower.hbm_capacity_byte_per_s: "
                         "bursts, row misses, refresh), the capacity the engine shares among a die's running ops")
HBM_CAPACITY_NOMINAL = "the die's nominal HBM bandwidth (die.hbm_bandwidth_gbyte_per_s)"


def hbm_capacity(spec: dict) -> tuple[float, str]:
    """(bytes/s, what it is) a die's HBM can deliver, from a timeline's resolved spec: the rate the
    engine shares (``cmemu.lower.hbm_capacity_byte_per_s``), or the nominal bandwidth when the
    spec cannot be rebuilt (a file of an older cmemu whose die fields differ)."""
    import dataclasses

    from cmemu.errors import CmemuError
    from cmemu.lower import hbm_capacity_byte_per_s
    from cmemu.spec.die import DieSpec

    die = dict(spec["die"])
    names = {f.name for f in dataclasses.fields(DieSpec)}
    try:
        if set(die) != names:
            raise TypeError(f"die fields differ: {sorted(set(die) ^ names)}")
        return float(hbm_capacity_byte_per_s(DieSpec(**die))), HBM_CAPACITY_ACHIEVED
    except (TypeError, ValueError, KeyError, ZeroDivisionError, CmemuError):
        return float(die["hbm_bandwidth_gbyte_per_s"]) * 1e9, HBM_CAPACITY_NOMINAL


def hbm_figures(die_bytes, end_ps: int, capacity_byte_per_s: float, active, stacks=None, bins=None) -> dict:
    """HBM utilisation per die: its bytes / (makespan x capacity), mean over ``active`` dies and max.

    ``stacks`` = (die, stack, bytes, stacks per die) rows (summed here over bins) gives the busiest
    stack, its bytes over the makespan x its share of the capacity (capacity / stacks, as the
    address interleave spreads a die's traffic evenly over them); ``bins`` = (die, bin, bytes,
    bin_ps) gives the busiest bin of any die, its bytes over bin_ps x capacity.
    """
    die_bytes = np.asarray(die_bytes, dtype=np.int64)
    active = np.asarray(active, dtype=bool)
    span = capacity_byte_per_s * end_ps / 1e12  # bytes a die could move in the makespan
    util = die_bytes / span if span > 0 else np.zeros(die_bytes.shape)
    out = {
        "capacity_gbyte_per_s": capacity_byte_per_s / 1e9,
        "bytes": int(die_bytes.sum()),
        "utilisation_per_die_mean_percent": 100.0 * float(util[active].mean()) if active.any() else 0.0,
        "utilisation_per_die_max_percent": 100.0 * float(util.max()) if util.size else 0.0,
        "die_max": int(util.argmax()) if util.size and die_bytes.any() else -1,
        "busiest_stack": None,
        "busiest_bin": None,
    }
    if stacks is not None:
        die, stack, nbytes, nstacks = stacks
        nstacks = int(nstacks)
        key = np.asarray(die, dtype=np.int64) * nstacks + np.asarray(stack, dtype=np.int64)
        per = np.bincount(key, weights=np.asarray(nbytes, dtype=np.float64), minlength=die_bytes.size * nstacks)
        if per.size and per.max() > 0:
            k = int(per.argmax())
            share = span / nstacks
            out["busiest_stack"] = {
                "die": k // nstacks, "stack": k % nstacks, "stacks_per_die": nstacks, "bytes": int(per[k]),
                "utilisation_percent": 100.0 * float(per[k]) / share if share > 0 else 0.0,
                # Of the die's bytes: 100 / stacks when the interleave spread them evenly.
                "share_of_die_bytes_percent": 100.0 * float(per[k]) / max(int(die_bytes[k // nstacks]), 1),
            }
    if bins is not None:
        die, b, nbytes, bin_ps = bins
        nbytes = np.asarray(nbytes, dtype=np.int64)
        if nbytes.size and nbytes.max() > 0:
            i = int(nbytes.argmax())
            cap = capacity_byte_per_s * int(bin_ps) / 1e12
            out["busiest_bin"] = {"die": int(die[i]), "start_us": int(b[i]) * int(bin_ps) / 1e6,
                                  "bin_us": int(bin_ps) / 1e6, "gbyte_per_s": float(nbytes[i]) / (int(bin_ps) / 1e12) / 1e9,
                                  "utilisation_percent": 100.0 * float(nbytes[i]) / cap if cap > 0 else 0.0}
    return out
