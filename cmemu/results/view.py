"""What a user sees of a run (``trace_result``): the trace's own ops (a collective's node spans
from its entry to its exit) and the messages between them, the ops a lowering added as tasks,
with the post-run views (HBM series, pipe tasks, packet rows, MoE pairs) made from the engine's
whole result. The HBM series can be made on another thread while the rest is written
(``trace_result_hbm_later``).
"""
from __future__ import annotations

import dataclasses
import time

import numpy as np

from cmemu.results.hbm import hbm_series
from cmemu.results.moe import moe_pairs
from cmemu.results.packets import packet_rows
from cmemu.results.pipe_tasks import pipe_interval_tasks
from cmemu.results.result import RunResult


def trace_result(full: RunResult, pipe_intervals: int | None = None) -> RunResult:
    """What a user sees of a run: the trace's own ops (a collective's node spans from its entry
    to its exit) and the messages between them; the ops a lowering added become tasks.

    The COMP ops' pipe intervals are ``full.pipe_tasks`` when given, else made here
    (``pipe_interval_tasks``, at most ``pipe_intervals`` per op and pipe) after the collectives'
    internal steps, in the same arrays."""
    result, hbm = trace_result_hbm_later(full, pipe_intervals)
    return with_hbm_series(result, hbm.result())


def trace_result_hbm_later(full: RunResult, pipe_intervals: int | None = None):
    """trace_result, with the HBM series still being worked out on another thread: (the result
    without them, a Future of (hbm_series, hbm_stack_series, time.perf_counter() when they were
    done)); ``with_hbm_series`` completes it.
    The series take 1.5 s of the 61-layer decode step, most of it in kernels that let go of the
    GIL: the rest of the results, and the timeline's other groups, are made meanwhile."""
    from concurrent.futures import ThreadPoolExecutor

    def series():
        return (*hbm_series(full), time.perf_counter())

    pool = ThreadPoolExecutor(1, thread_name_prefix="cmemu-hbm-series")
    try:
        hbm = pool.submit(series)
    finally:
        pool.shutdown(wait=False)  # its thread ends with the job
    rest = _trace_result_rest(full, pipe_intervals)
    return dataclasses.replace(full, hbm_series=None, hbm_stack_series=None, **rest), hbm


def with_hbm_series(result: RunResult, series: tuple) -> RunResult:
    """The result with its HBM series (trace_result_hbm_later's Future's result)."""
    return dataclasses.replace(result, hbm_series=series[0], hbm_stack_series=series[1])


def _trace_result_rest(full: RunResult, pipe_intervals: int | None) -> dict:
    """trace_result's fields but the HBM series."""
    L = full.lowered
    nt = L.num_trace_ops
    start = full.op_start_ps[:nt].copy()
    spans = np.flatnonzero(L.op_report_start[:nt] >= 0)
    start[spans] = full.op_start_ps[L.op_report_start[spans]]
    view, keep = L.trace_view()
    tasks, n_pipe = full.tasks, full.pipe_intervals
    # The internal steps of collectives (on SDMA / AIV-Direct / VECTOR), then the die model's pipe
    # busy intervals of each COMP op, in one set of arrays.
    inner = np.flatnonzero(L.op_lane[nt:] >= 0) + nt
    cols = {"die": (L.op_rank, np.int32), "pipe": (L.op_lane, np.uint8), "op": (L.op_parent, np.int32),
            "start_ps": (full.op_start_ps, None), "end_ps": (full.op_end_ps, None), "bytes": (L.op_bytes, None)}
    if L.pipe_task_op.size and full.pipe_tasks is None:
        tasks, n_pipe = pipe_interval_tasks(full, pipe_intervals, lead=inner.size)
        for k, (col, _) in cols.items():  # a column at a time
            tasks[k][:inner.size] = col[inner]
    elif L.pipe_task_op.size or inner.size:  # the pipe intervals given (full.pipe_tasks), or none
        parts = [{k: col[inner] if dtype is None else col[inner].astype(dtype) for k, (col, dtype) in cols.items()}]
        if L.pipe_task_op.size:
            parts.append(full.pipe_tasks)
        tasks = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    del inner, cols
    packets = packet_rows(full, keep) if full.packets is not None else None
    return dict(
        lowered=view, op_start_ps=start, op_end_ps=full.op_end_ps[:nt].copy(), tasks=tasks,
        # The kept messages come first, and only they have packet counts and delivery times.
        msg_packets=full.msg_packets[keep[:full.msg_packets.size]],
        msg_delivered_ps=full.msg_delivered_ps[keep[:full.msg_delivered_ps.size]],
        moe_pairs=moe_pairs(full.trace), packets=packets,
        fabric_messages=L.num_messages, fabric_packets=full.fabric_packets,
        fabric_bytes=L.message_bytes, pipe_intervals=n_pipe,
    )
