"""The pipes' busy intervals of one op, from its tile schedule, for the timeline's /tasks.

A die-model cost (``OpCost``) keeps, per pipe of its cores ("AIC.CUBE", "AIV.MTE2", ...), when
that pipe was busy on at least one of the op's cores, merged to at most
``pipeline.MAX_INTERVALS_PER_PIPE`` intervals (``pipeline.merge_intervals``: the smallest gaps
are closed first). ``op_pipe_intervals`` turns that into what one op shows on the timeline:

- an op of several phases run back to back (MLA decode: prologue GEMMs and vector ops,
  attention, W_uv) lays its phases' intervals end to end, each phase from where the previous one
  ended;
- when the op lasts longer than its schedule (the HBM or L2 bound of ``model.finish_cost``),
  its intervals are stretched in proportion, so that they span the op as its duration does
  (an approximation: the model does not say how the pipes spread over the longer time);
- AIC and AIV pipes of one name (the MTE2 of both) are one pipe of the timeline;
- each pipe's intervals are merged again down to ``max_intervals``.

A cost without intervals (one built by hand) falls back to one summary interval per pipe, from
the op's start for the pipe's busy time per core (the timeline layout v3 behaviour).

Times are in cycles of the AI-core clock from the op's start (floats: stretched phases need not
fall on cycles).
"""
from __future__ import annotations

import numpy as np
from cmemu.kernels import njit

from cmemu.die.pipeline import MAX_INTERVALS_PER_PIPE, merge_intervals


def _own(cost) -> dict:
    """{pipe name (no unit): [(start, end) float arrays]} of one cost without phases, in its
    duration's cycles."""
    out: dict = {}
    if cost.pipe_intervals:
        stretch = cost.duration_cycles / cost.schedule_cycles if cost.schedule_cycles > 0 else 1.0
        stretch = max(stretch, 1.0)
        for key, (s, e) in cost.pipe_intervals.items():
            out.setdefault(key.split(".")[-1], []).append((np.asarray(s) * stretch, np.asarray(e) * stretch))
        return out
    for key, cycles in cost.pipe_busy_cycles.items():
        unit, pipe = key.split(".")
        cores = cost.aic_cores if unit == "AIC" else cost.aiv_cores
        if cycles > 0 and cores > 0:
            length = min(cycles / cores, cost.duration_cycles)
            out.setdefault(pipe, []).append((np.array([0.0]), np.array([float(length)])))
    return out


def op_pipe_intervals(cost, max_intervals: int = MAX_INTERVALS_PER_PIPE) -> dict:
    """{pipe name ("CUBE", "MTE2", ...): (start, end) float64 arrays} in cycles from the op's
    start, at most ``max_intervals`` per pipe, within [0, cost.duration_cycles]."""
    parts: dict = {}
    if cost.phases:
        offset = 0
        for ph in cost.phases:
            for name, spans in _own(ph).items():
                parts.setdefault(name, []).extend((s + offset, e + offset) for s, e in spans)
            offset += ph.duration_cycles
    else:
        parts = _own(cost)
    out = {}
    # Merge in integer units of 1/1024 cycle (exact enough for ps, and merge_intervals is integer).
    scale = 1024.0
    for name, spans in parts.items():
        s = np.concatenate([a for a, _ in spans])
        e = np.concatenate([b for _, b in spans])
        ms, me = merge_intervals(np.round(s * scale).astype(np.int64), np.round(e * scale).astype(np.int64),
                                 max_intervals)
        if ms.size:
            end = float(cost.duration_cycles)
            out[name] = (np.minimum(ms / scale, end), np.minimum(me / scale, end))
    return out


@njit(cache=True)
def _fill_rows(ops, table_of, first, code, off_start, off_end, op_start, op_end, op_rank, out_die, out_pipe,
               out_op, out_start, out_end):
    r = 0
    for k in range(ops.shape[0]):
        op = ops[k]
        t = table_of[k]
        begin, stop, die = op_start[op], op_end[op], op_rank[op]
        for j in range(first[t], first[t + 1]):
            out_die[r] = die
            out_pipe[r] = code[j]
            out_op[r] = op
            out_start[r] = min(begin + off_start[j], stop)
            out_end[r] = min(begin + off_end[j], stop)
            r += 1


def op_rows(ops, table_of, tables, op_start_ps, op_end_ps, op_rank, lead: int = 0) -> dict:
    """/tasks rows of many ops whose intervals repeat a few tables: op ``ops[k]`` has the rows of
    ``tables[table_of[k]]`` (pipe codes uint8, start and end offsets in ps from the op's start,
    int64), shifted to its start and cut at its end; ops in the order given, each op's rows in
    its table's order. Columns of ``output.schema.TASK_FIELDS`` (bytes 0), after ``lead`` rows
    left for the caller to fill (bytes 0, the other columns unset)."""
    ops = np.ascontiguousarray(ops, dtype=np.int64)
    table_of = np.ascontiguousarray(table_of, dtype=np.int64)
    sizes = np.array([len(t[0]) for t in tables], dtype=np.int64)
    first = np.zeros(len(tables) + 1, dtype=np.int64)
    np.cumsum(sizes, out=first[1:])
    code, off_start, off_end = (np.concatenate([t[i] for t in tables]) if tables else np.zeros(0, dt)
                                for i, dt in ((0, np.uint8), (1, np.int64), (2, np.int64)))
    m = int(lead)
    n = m + (int(sizes[table_of].sum()) if ops.size else 0)
    out = {"die": np.empty(n, np.int32), "pipe": np.empty(n, np.uint8), "op": np.empty(n, np.int32),
           "start_ps": np.empty(n, np.int64), "end_ps": np.empty(n, np.int64), "bytes": np.zeros(n, np.int64)}
    _fill_rows(ops, table_of, first, code.astype(np.uint8), off_start.astype(np.int64), off_end.astype(np.int64),
               np.ascontiguousarray(op_start_ps, dtype=np.int64), np.ascontiguousarray(op_end_ps, dtype=np.int64),
               np.ascontiguousarray(op_rank, dtype=np.int32), out["die"][m:], out["pipe"][m:], out["op"][m:],
               out["start_ps"][m:], out["end_ps"][m:])
    return out
