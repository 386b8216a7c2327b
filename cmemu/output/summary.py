"""Per-die figures of a timeline: the ``/dies`` columns (busy time per op type, exposed
communication, bytes; their rules in cmemu.results.overlap) and the HBM utilisation the report
shows.

Both the writer (``/dies`` of a v2 timeline) and the reader (for v1 files, which have no
``/dies``) call these, so a figure is computed one way only.
"""
from __future__ import annotations

import numpy as np

from cmemu.results.overlap import busy_union_ps, exposed_comm_by_type_ps
from cmemu.vocab import NODE_TYPES


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
        "exposed_comm_ps": exposed_comm_by_type_ps(rank, typ, start, end, dies, op_types),
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
