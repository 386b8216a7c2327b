"""Replaying a trace (``run_trace``: what ``cmemu run`` calls and what Python users call).

Its modules, by job:

- ``pipeline``: spec -> topology -> checked trace -> lowering -> engine -> results -> timeline;
  ``prepare_run`` (what a run checks and builds before it simulates, for ``cmemu trace validate``
  too) and ``simulate`` (the engine run in slices of events).
- ``memory``: the memory budget (``estimate_memory``, ``MemoryLimitError``).
- ``diagnostics``: why a run cannot run or finish, and the invariants of a finished run.
- ``progress``: the progress line of a long run.

What a run produced (``RunResult``) and the post-run views are cmemu.results'. This package
re-exports the names users and tests call; the code imports them from their modules.
"""
from cmemu.results.moe import moe_pairs
from cmemu.results.packets import packet_rows
from cmemu.results.pipe_tasks import pipe_interval_tasks
from cmemu.results.result import RunResult
from cmemu.results.view import trace_result
from cmemu.run.diagnostics import check_clock_range, check_failed_dies, check_invariants, describe_blocked
from cmemu.run.memory import (
    BASELINE_BYTES,
    EVENT_BYTES,
    PACKET_RECORD_BYTES,
    PACKET_RECORD_LINKS,
    PARSE_BYTES_PER_FILE_BYTE,
    MemoryEstimate,
    MemoryLimitError,
    estimate_memory,
)
from cmemu.run.pipeline import (
    PreparedRun,
    check_link_bin_ns,
    prepare_run,
    resolve_system,
    run_trace,
    simulate,
    small_pages,
    trace_failures,
)
from cmemu.run.progress import Progress

__all__ = [
    "BASELINE_BYTES", "EVENT_BYTES", "PACKET_RECORD_BYTES", "PACKET_RECORD_LINKS", "PARSE_BYTES_PER_FILE_BYTE",
    "MemoryEstimate", "MemoryLimitError", "PreparedRun", "Progress", "RunResult", "check_clock_range",
    "check_failed_dies", "check_invariants", "check_link_bin_ns", "describe_blocked", "estimate_memory",
    "moe_pairs", "packet_rows", "pipe_interval_tasks", "prepare_run", "resolve_system", "run_trace", "simulate",
    "small_pages", "trace_failures", "trace_result",
]
