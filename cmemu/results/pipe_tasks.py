"""The die model's pipe busy intervals of a run's COMP ops, as /tasks rows
(docs/timeline-format.md), bounded per op and pipe and in all.
"""
from __future__ import annotations

import numpy as np

from cmemu.results.limits import DEFAULT_PIPE_INTERVALS, MAX_PIPE_TASK_ROWS
from cmemu.results.result import RunResult

PIPE_TASKS_CUT = "the pipe intervals of"  # how the warning that /tasks keeps fewer of them begins


def pipe_interval_tasks(full: RunResult, max_intervals: int | None = None,
                        max_rows: int | None = None, lead: int = 0) -> tuple[dict, int]:
    """The die model's pipe busy intervals of every COMP op it timed, as /tasks rows (pipe codes
    of ``cmemu.vocab.PIPE_CODE``, times in ps, bytes 0), and the intervals per op and pipe
    they were merged to (``cmemu.die.intervals.op_pipe_intervals``). The first ``lead`` rows are
    left for the caller to fill (bytes 0, the other columns unset).

    At most ``max_intervals`` per op and pipe (``DEFAULT_PIPE_INTERVALS``); if the run would
    then hold more than ``max_rows`` rows (``MAX_PIPE_TASK_ROWS``), the limit is halved until it
    fits or is 1, so that a big run's /tasks stays bounded (a warning says so)."""
    import warnings

    from cmemu.die.intervals import op_pipe_intervals, op_rows
    from cmemu.die.ops import node_cost
    from cmemu.vocab import PIPE_CODE

    n_max = DEFAULT_PIPE_INTERVALS if max_intervals is None else int(max_intervals)
    if n_max < 1:
        raise ValueError(f"pipe intervals per op and pipe must be at least 1, got {n_max}")
    cap = MAX_PIPE_TASK_ROWS if max_rows is None else int(max_rows)
    L = full.lowered
    die = full.spec.die
    op_of = L.pipe_task_op
    if op_of.size and np.all(op_of[1:] >= op_of[:-1]):  # in op order, as the lowering makes them
        ops = op_of[np.flatnonzero(np.concatenate([[True], op_of[1:] != op_of[:-1]]))]
    else:
        ops = np.unique(op_of)
    nodes = full.trace.nodes
    # Ops of one shape share one (memoised) cost: work per distinct cost, then repeat. Nodes with
    # equal attributes share one attrs dict (the loader's), so a cost is looked up once per dict.
    costs, cost_of = [], np.empty(ops.size, dtype=np.int64)
    index, of_attrs = {}, {}
    for k, op in enumerate(ops.tolist()):
        attrs = nodes[op].attrs
        u = of_attrs.get(id(attrs))
        if u is None:
            c = node_cost(die, attrs)
            u = index.get(id(c))
            if u is None:
                u = index[id(c)] = len(costs)
                costs.append(c)
            of_attrs[id(attrs)] = u
        cost_of[k] = u
    del of_attrs
    uses = np.bincount(cost_of, minlength=len(costs))
    cycle_ps = 1e6 / die.ai_core_clock_mhz

    def table(n):
        rows = []
        for c in costs:
            iv = op_pipe_intervals(c, n)
            names = [p for p in iv if p in PIPE_CODE]
            pipe = np.concatenate([np.full(iv[p][0].size, PIPE_CODE[p], dtype=np.uint8) for p in names]) if names \
                else np.zeros(0, np.uint8)
            s = np.concatenate([iv[p][0] for p in names]) if names else np.zeros(0)
            e = np.concatenate([iv[p][1] for p in names]) if names else np.zeros(0)
            # Offsets from the op's start in ps, as every op of this cost shifts them.
            rows.append((pipe, np.round(s * cycle_ps).astype(np.int64), np.round(e * cycle_ps).astype(np.int64)))
        return rows

    rows = table(n_max)
    n = n_max
    while n > 1 and int(sum(len(r[0]) * k for r, k in zip(rows, uses))) > cap:
        n //= 2
        rows = table(n)
    if n < n_max:
        warnings.warn(f"{PIPE_TASKS_CUT} {ops.size:,} COMP ops would pass {cap:,} rows at {n_max} per op "
                      f"and pipe; /tasks keeps at most {n} per op and pipe", stacklevel=2)
    return op_rows(ops, cost_of, rows, full.op_start_ps, full.op_end_ps, L.op_rank, lead=lead), n
