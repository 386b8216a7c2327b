"""Replaying a trace: spec -> topology -> validated trace -> lowering -> engine -> timeline.

``run_trace`` is what ``cmemu run`` calls and what Python users call. The engine runs in slices
of events so that long runs can report progress without any Python call per event.
"""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cmemu._core import make_engine
from cmemu.errors import SimulationError
from cmemu.lower import OP_KIND_RECV, OP_KIND_SEND, OP_TYPES, Lowered, lower
from cmemu.spec import SystemSpec, load_system
from cmemu.topology import Topology, build_topology

DEFAULT_SYSTEM = "cloudmatrix384"
EVENTS_PER_SLICE = 1 << 20
PROGRESS_AFTER_S = 2.0


@dataclass
class RunResult:
    """What one replay produced. Times are integer picoseconds."""

    spec: SystemSpec
    topology: Topology
    trace: object
    lowered: Lowered
    op_start_ps: np.ndarray
    op_end_ps: np.ndarray
    link_bytes: np.ndarray
    link_busy_ps: np.ndarray
    events: int
    max_pending_events: int
    wall_time_s: float
    native: bool
    # Optional records, None until a model produces them (docs/timeline-format.md, v2):
    # tasks: per pipe/engine task columns (cmemu.output.schema.TASK_FIELDS), written to /tasks;
    # link_series: binned link counters, sparse COO {"bin_ps", "link", "bin", "bytes", "busy_ps"}
    # (schema.LINK_SERIES_FIELDS), written to /links/binned.
    tasks: dict | None = None
    link_series: dict | None = None

    @property
    def sim_end_ps(self) -> int:
        return int(self.op_end_ps.max()) if self.op_end_ps.size else 0


class Progress:
    """A one-line progress report on stderr, shown only once a run has taken a while."""

    def __init__(self, total_ops: int, stream=None, after_s: float = PROGRESS_AFTER_S):
        self.total = total_ops
        self.stream = stream if stream is not None else sys.stderr
        self.after_s = after_s
        self.t0 = time.perf_counter()
        self.shown = False

    def update(self, engine) -> None:
        elapsed = time.perf_counter() - self.t0
        if elapsed < self.after_s:
            return
        self.shown = True
        pct = 100.0 * engine.ops_done / self.total if self.total else 100.0
        rate = engine.events / elapsed / 1e6
        self.stream.write(
            f"\r  simulated {engine.now / 1e6:,.3f} us | ops {engine.ops_done:,}/{self.total:,} "
            f"({pct:.0f}%) | {engine.events:,} events | {rate:.2f} M events/s | {elapsed:.1f} s wall"
        )
        self.stream.flush()

    def close(self) -> None:
        if self.shown:
            self.stream.write("\n")
            self.stream.flush()


def resolve_system(trace_system: str | None, system: str | None, overrides=()) -> SystemSpec:
    """The system named on the command line wins over the trace's header, then the default."""
    return load_system(system or trace_system or DEFAULT_SYSTEM, overrides)


def simulate(lowered: Lowered, native: bool = True, progress: Progress | None = None):
    """Run the engine to the end; raise SimulationError if ops stay blocked or time ran back."""
    engine = make_engine(lowered, native=native)
    while not engine.run(EVENTS_PER_SLICE):
        if progress is not None:
            progress.update(engine)
    if progress is not None:
        progress.close()
    if engine.past_event:
        raise SimulationError("internal invariant broken: an event was scheduled in the past")
    if engine.ops_done != lowered.num_ops:
        raise SimulationError(describe_blocked(lowered, engine))
    return engine


def describe_blocked(lowered: Lowered, engine, limit: int = 8) -> str:
    """Name the ops that can never finish and why (a receive whose send never ran, ...)."""
    start = np.asarray(engine.op_start_ps)
    end = np.asarray(engine.op_end_ps)
    delivered = np.asarray(engine.msg_delivered_ps)
    blocked = np.flatnonzero(end < 0)
    lines = []

    def label(i):
        return (
            f"node {lowered.op_node_id[i]} '{lowered.op_name[i]}' "
            f"({OP_TYPES[lowered.op_type[i]]}, rank {lowered.op_rank[i]}, stream {lowered.op_stream[i]})"
        )

    # Ops that started but cannot end: receives waiting for a message first, they are the roots.
    for i in blocked:
        if start[i] >= 0 and lowered.op_kind[i] == OP_KIND_RECV:
            m = lowered.op_msg[i]
            s = lowered.msg_send_op[m]
            state = "never started" if start[s] < 0 else "has not delivered it"
            if delivered[m] < 0:
                lines.append(f"{label(i)} waits for its message from {label(s)}, which {state}")
    for i in blocked:
        if start[i] < 0 and len(lines) < limit:
            why = "waits for its dependencies"
            if lowered.op_kind[i] == OP_KIND_SEND:
                why = "never started: it waits for its dependencies or the previous op of its stream"
            lines.append(f"{label(i)} {why}")
    shown = lines[:limit]
    more = len(blocked) - len(shown)
    text = f"the run cannot finish: {len(blocked)} of {lowered.num_ops} ops are blocked: " + "; ".join(shown)
    if more > 0:
        text += f"; and {more} more"
    return text


def run_trace(
    trace_path,
    system: str | None = None,
    overrides=(),
    output=None,
    native: bool = True,
    progress: bool | Progress = True,
    compression: str = "gzip",
    detail: str = "tasks",
) -> RunResult:
    """Replay a trace file; write the HDF5 timeline to ``output`` when it is given."""
    from cmemu.trace import load_trace, read_trace

    t0 = time.perf_counter()
    if output is not None:
        from cmemu.output.schema import check_compression, check_detail

        check_detail(detail)  # before the run: an unwritable detail level should not cost a run
        check_compression(compression)
    trace_path = Path(trace_path)
    read = read_trace(trace_path)
    header_system = read[0].get("system") if isinstance(read[0], dict) else None
    spec = resolve_system(header_system if isinstance(header_system, str) else None, system, overrides)
    topo = build_topology(spec)
    trace = load_trace(trace_path, num_ranks=spec.dies, read=read)
    lowered = lower(trace, topo)
    prog = progress if isinstance(progress, Progress) else (Progress(lowered.num_ops) if progress else None)
    engine = simulate(lowered, native=native, progress=prog)
    result = RunResult(
        spec=spec,
        topology=topo,
        trace=trace,
        lowered=lowered,
        op_start_ps=np.asarray(engine.op_start_ps),
        op_end_ps=np.asarray(engine.op_end_ps),
        link_bytes=np.asarray(engine.link_bytes),
        link_busy_ps=np.asarray(engine.link_busy_ps),
        events=int(engine.events),
        max_pending_events=int(engine.max_pending),
        wall_time_s=0.0,
        native=native,
    )
    check_invariants(result)
    result.wall_time_s = time.perf_counter() - t0
    if output is not None:
        from cmemu.output.hdf5 import write_timeline

        write_timeline(output, result, compression=compression, detail=detail)
    return result


def check_invariants(result: RunResult) -> None:
    """DESIGN.md's invariants that hold after a run: dependencies respected, bytes conserved."""
    L = result.lowered
    start, end = result.op_start_ps, result.op_end_ps
    if np.any(end < start):
        raise SimulationError("internal invariant broken: an op ended before it started")
    src = np.repeat(np.arange(L.num_ops), np.diff(L.succ_ptr))
    bad = np.flatnonzero(start[L.succ_idx] < end[src])
    if bad.size:
        i, j = src[bad[0]], L.succ_idx[bad[0]]
        raise SimulationError(
            f"internal invariant broken: node {L.op_node_id[j]} started before its dependency "
            f"node {L.op_node_id[i]} ended"
        )
    sent = np.bincount(L.chunk_msg, weights=L.chunk_bytes, minlength=L.num_messages)
    if L.num_messages and not np.array_equal(sent.astype(np.int64), L.msg_bytes):
        raise SimulationError("internal invariant broken: packet bytes differ from message bytes")
