"""Replaying a trace: spec -> topology -> validated trace -> lowering -> engine -> timeline.

``run_trace`` is what ``cmemu run`` calls and what Python users call; ``prepare_run`` is every
check and build before the engine (``cmemu trace validate`` stops there). The engine runs in
slices of events (``simulate``) so that long runs can report progress without any Python call per
event. The memory budget, the diagnostics and the progress line are their own modules of
cmemu.run; the results and their views, cmemu.results'.
"""
from __future__ import annotations

import dataclasses
import math
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cmemu._core import make_engine
from cmemu.errors import CmemuError, DieFailedError, SimulationError, UnroutableError
from cmemu.fabric import FABRIC_MODELS, build_fabric
from cmemu.faults import parse_failures
from cmemu.lower import Lowered, lower
from cmemu.options import (
    DEFAULT_COMPRESSION,
    DEFAULT_DETAIL,
    DEFAULT_FABRIC,
    DEFAULT_LINK_BIN_NS,
    DEFAULT_PIPE_INTERVALS,
)
from cmemu.results.result import RunResult
from cmemu.results.view import trace_result_hbm_later, with_hbm_series
from cmemu.run.diagnostics import (
    CLOCK_LIMIT_PS,
    check_clock_range,
    check_failed_dies,
    check_invariants,
    describe_blocked,
    failed_die_error,
    unroutable_error,
)
from cmemu.run.memory import (
    EVENT_BYTES,
    LINK_SERIES_ROW_BYTES,
    REFERENCE_FACTOR,
    MemoryEstimate,
    MemoryLimitError,
    check_file_size,
    check_need,
    check_packet_records,
    check_series_rows,
    estimate_memory,
    series_advice,
    series_bytes,
    series_lower_bound,
)
from cmemu.run.progress import Progress
from cmemu.spec import DEFAULT_SYSTEM, SystemSpec, load_system
from cmemu.topology import Topology, build_topology
from cmemu.trace.read import TraceDocument
from cmemu.units import default_memory_limit, format_bytes, ns_to_ps


EVENTS_PER_SLICE = 1 << 20
# A bin is at least the clock's tick (1 ps) and at most the clock's range.
MIN_BIN_NS = 1e-3
MAX_BIN_NS = CLOCK_LIMIT_PS / 1000


def check_link_bin_ns(link_bin_ns) -> int:
    """--link-bin-ns (0: off) as the bin width in ps, or a CmemuError: a bin is at least the
    clock's tick (1 ps) and within its range."""
    try:
        value = float(link_bin_ns)
    except (TypeError, ValueError):
        value = math.nan
    if value == 0:
        return 0
    if not MIN_BIN_NS <= value <= MAX_BIN_NS:  # NaN fails
        raise CmemuError(f"--link-bin-ns must be 0 (no binned counters) or from {MIN_BIN_NS:g} ns (1 ps, the "
                         f"clock's tick) to {MAX_BIN_NS:.3g} ns (the clock's range), got {link_bin_ns!r}")
    return ns_to_ps(value)


def resolve_system(trace_system: str | None, system: str | None, overrides=()) -> SystemSpec:
    """The system named on the command line wins over the trace's header, then the default."""
    return load_system(system or trace_system or DEFAULT_SYSTEM, overrides)


def simulate(lowered: Lowered, fabric, native: bool = True, progress: Progress | None = None,
             queue_limit_bytes: int | None = None, bin_ps: int = 0, record_packets: bool = False,
             record_deliveries: int = -1, drop_engine_inputs: bool = False, failed_parts: str = "--fail"):
    """Run the engine to the end; raise SimulationError if ops stay blocked or time ran back.

    The engine runs in slices of EVENTS_PER_SLICE events. Between slices: progress, and the
    event queue's high-water mark and the binned link counters' rows (with ``bin_ps``) against
    ``queue_limit_bytes``, what the memory limit leaves them (MemoryLimitError above it).
    ``failed_parts`` says where the failed parts come from, for the error of a message left
    without a path.
    A KeyboardInterrupt lands between slices (the native loop holds no Python frame); the
    progress line is closed and the interrupt goes on to the caller.
    ``record_packets`` keeps every packet's transmission on every link (``engine.packet_records()``);
    ``record_deliveries``: keep the delivery times of the first that many messages (-1: all).
    ``drop_engine_inputs``: the lowering's columns the engine has its own copy of are cut as it is
    built (``make_engine(drop_inputs=True)``); only what the results are built from is left.
    """
    engine = make_engine(lowered, fabric, native=native, bin_ps=bin_ps, record_packets=record_packets,
                         record_deliveries=record_deliveries, drop_inputs=drop_engine_inputs)
    per_event = EVENT_BYTES * (1 if native else REFERENCE_FACTOR)
    max_rows = queue_limit_bytes // LINK_SERIES_ROW_BYTES if queue_limit_bytes is not None and bin_ps > 0 else -1
    try:
        while not _run_slice(engine, lowered, fabric, failed_parts, max_rows):
            if progress is not None:
                progress.update(engine)
            if queue_limit_bytes is None:
                continue
            # Storage grows by doubling, so it can hold twice the high-water mark.
            queue = 2 * engine.max_pending * per_event
            rows = engine.series_rows if bin_ps > 0 else 0
            if queue + rows * LINK_SERIES_ROW_BYTES <= queue_limit_bytes:
                # The engine stops a slice early should the link counters pass what is left.
                max_rows = (queue_limit_bytes - queue) // LINK_SERIES_ROW_BYTES if bin_ps > 0 else -1
                continue
            if rows * LINK_SERIES_ROW_BYTES > queue:
                raise MemoryLimitError(
                    f"the binned link counters grew to {rows:,} rows (about "
                    f"{format_bytes(rows * LINK_SERIES_ROW_BYTES)}) by {engine.now / 1e6:,.3f} us of simulated "
                    f"time, more than the {format_bytes(queue_limit_bytes)} the memory limit leaves them; "
                    + series_advice(bin_ps))
            raise MemoryLimitError(
                f"the event queue grew to {engine.max_pending:,} pending events "
                f"(about {format_bytes(queue)}), more than the "
                f"{format_bytes(queue_limit_bytes)} the memory limit leaves it; "
                "raise --max-memory or split the trace"
            )
    finally:
        if progress is not None:
            progress.close()
    if engine.past_event:
        raise SimulationError("internal invariant broken: an event was scheduled in the past")
    if engine.ops_done != lowered.num_ops:
        raise SimulationError(describe_blocked(lowered, engine))
    if engine.messages_delivered != lowered.num_messages:
        raise SimulationError(f"internal invariant broken: {lowered.num_messages - engine.messages_delivered:,} "
                              "messages were never delivered")
    if engine.packets_live != 0:
        raise SimulationError(f"internal invariant broken: {engine.packets_live} packets never reached their end")
    if not np.array_equal(engine.credit_bytes, np.repeat(fabric.link_credit_byte[:, None], 2, axis=1)):
        raise SimulationError("internal invariant broken: link credits did not all return")
    return engine


def _run_slice(engine, lowered, fabric, failed_parts: str = "--fail", max_series_rows: int = -1) -> bool:
    try:
        return engine.run(EVENTS_PER_SLICE, max_series_rows)
    except DieFailedError as exc:
        raise failed_die_error(lowered, fabric, exc.args[0]) from None
    except UnroutableError as exc:
        raise unroutable_error(engine, lowered, fabric, exc.args[0], failed_parts) from None


def run_trace(
    trace_path,
    system: str | None = None,
    overrides=(),
    output=None,
    native: bool = True,
    progress: bool | Progress = True,
    max_memory_bytes: int | None = None,
    compression: str = DEFAULT_COMPRESSION,
    detail: str = DEFAULT_DETAIL,
    link_bin_ns: float = DEFAULT_LINK_BIN_NS,
    spec: SystemSpec | None = None,
    fail=(),
    pipe_intervals: int = DEFAULT_PIPE_INTERVALS,
    fabric_model: str = DEFAULT_FABRIC,
    retime: bool = False,
) -> RunResult:
    """Replay a trace file, or a trace in memory (a cmemu.trace.TraceDocument, which the run takes
    over: the scenarios' generated steps need no file); write the HDF5 timeline to ``output``
    when it is given.

    ``spec`` (a resolved SystemSpec) replaces ``system`` and ``overrides`` when given.

    ``fabric_model`` is "packet" (every packet on every link) or "message" (small writes move as
    one unit: cmemu.fabric.FABRIC_MODELS).

    ``max_memory_bytes`` (default: ``default_memory_limit()``) bounds the run: a run whose
    estimate (``estimate_memory``) is above it fails with MemoryLimitError before it starts.

    ``retime``: COMP nodes with both a measured time and a shape are timed by the die model
    (cmemu.lower.retime); the result's ``retime`` reports how the two compare.

    While it runs, numpy's arrays have ordinary pages (``small_pages``).
    """
    with small_pages():
        return _run_trace(trace_path, system, overrides, output, native, progress, max_memory_bytes, compression,
                          detail, link_bin_ns, spec, fail, pipe_intervals, fabric_model, retime)


@contextmanager
def small_pages():
    """numpy asks the kernel for transparent huge pages for every array of 4 MiB and more. A run
    writes gigabytes of new arrays once each; on the development VM the first write to huge pages
    costs 2-4x what it does in 4 KiB pages (2 GB: 3.1-4.4 s against 1.0 s), and the engine reads
    its arrays no faster for them (the 61-layer decode step: about 5 s less end to end). Turned
    off for the block, then as it was; a numpy without the switch is left alone."""
    try:
        from numpy._core.multiarray import _set_madvise_hugepage
    except ImportError:  # numpy 1.x
        try:
            from numpy.core.multiarray import _set_madvise_hugepage
        except ImportError:
            _set_madvise_hugepage = None
    before = _set_madvise_hugepage(False) if _set_madvise_hugepage is not None else None
    try:
        yield
    finally:
        if _set_madvise_hugepage is not None:
            _set_madvise_hugepage(before)


@dataclass
class PreparedRun:
    """What a run builds and checks before it simulates (``prepare_run``)."""

    spec: SystemSpec
    topology: Topology
    trace: object
    lowered: Lowered
    fabric: object
    need: MemoryEstimate
    limit_bytes: int
    bin_ps: int
    failed_parts: str  # where the failed parts come from, for errors during the run
    retime: object = None  # cmemu.lower.retime.RetimeReport, with retime=True


def prepare_run(trace_path, system: str | None = None, overrides=(), native: bool = True,
                max_memory_bytes: int | None = None, detail: str = DEFAULT_DETAIL, link_bin_ns: float = DEFAULT_LINK_BIN_NS,
                spec: SystemSpec | None = None, fail=(), pipe_intervals: int = DEFAULT_PIPE_INTERVALS,
                fabric_model: str = DEFAULT_FABRIC, retime: bool = False) -> PreparedRun:
    """Everything ``run_trace`` checks and builds before simulating, for ``cmemu run`` and
    ``cmemu trace validate`` alike (``trace_path``: a file, or a TraceDocument, which it takes
    over and frees once checked): the options, the memory the file takes to read, the trace
    (with the system's checks of each node: cores, op sizes, MoE routing), the run's memory
    estimate, the lowering, the fault schedule against the topology, the clock's range, and the
    binned series' rows at the least. Raises the first problem as a CmemuError; a trace's own
    problems as its first TraceError, whose ``problems`` lists them all."""
    from cmemu.lower.checks import node_checker
    from cmemu.trace import load_trace, read_document

    if fabric_model not in FABRIC_MODELS:
        raise CmemuError(f"--fabric must be one of {', '.join(FABRIC_MODELS)}, got {fabric_model!r}")
    if int(pipe_intervals) < 1:
        raise CmemuError(f"--pipe-intervals must be at least 1, got {pipe_intervals}")
    bin_ps = check_link_bin_ns(link_bin_ns)
    limit = default_memory_limit() if max_memory_bytes is None else int(max_memory_bytes)
    if isinstance(trace_path, TraceDocument):
        source = trace_path
    else:
        check_file_size(Path(trace_path), limit)
        source = read_document(trace_path)
    trace_path = source.name  # what errors name
    read = source.take()
    header_system = read[0].get("system") if isinstance(read[0], dict) else None
    groups = read[0].get("groups") if isinstance(read[0], dict) else None
    if spec is None:
        spec = resolve_system(header_system if isinstance(header_system, str) else None, system, overrides)
    topo = build_topology(spec)
    trace = load_trace(trace_path, num_ranks=spec.dies, read=read, node_check=node_checker(spec, groups, limit))
    del read, groups  # the parsed document: the checked nodes hold all the run needs
    report = None
    if retime:
        from cmemu.lower.retime import retime_trace

        trace, report = retime_trace(trace, spec.die, str(trace_path))
    need = estimate_memory(trace, topo, native=native, pipe_intervals=pipe_intervals, detail=detail)
    check_packet_records(need, limit, trace_path)
    check_need(need, limit, trace_path)
    record = detail == "packets"
    # The native engine reads only the templates of the collectives' repeated messages and then
    # drops the columns (drop_engine_inputs): their copies need not be written.
    lowered = lower(trace, topo, fill_messages=not native or record)
    failures, schedule, origin, failed_parts = trace_failures(trace, topo, fail)
    check_failed_dies(lowered, failures, origin)
    if schedule and FABRIC_MODELS[fabric_model]:
        raise CmemuError("the message-level fabric (--fabric message) does not model failures during a run; "
                         "use --fabric packet")
    fabric = build_fabric(topo, failures, schedule, model=fabric_model)
    check_clock_range(lowered, fabric, str(trace_path), trace.nodes)
    link_rows, die_rows, stack_rows = series_lower_bound(lowered, fabric, bin_ps, spec.die)
    need = dataclasses.replace(need, series_rows=link_rows + die_rows + stack_rows,
                               series_bytes=series_bytes(link_rows, die_rows, stack_rows))
    check_need(need, limit, trace_path, bin_ps)
    return PreparedRun(spec, topo, trace, lowered, fabric, need, limit, bin_ps, failed_parts, report)


def _run_trace(trace_path, system, overrides, output, native, progress, max_memory_bytes, compression, detail,
               link_bin_ns, spec, fail, pipe_intervals, fabric_model, retime=False) -> RunResult:
    from cmemu.kernels import compile_seconds

    t0, compiling0 = time.perf_counter(), compile_seconds()
    if output is not None:
        from cmemu.output.atomic import check_output
        from cmemu.output.schema import check_compression, check_detail

        check_detail(detail)  # before the run: an unwritable detail level should not cost a run
        check_compression(compression)
        # and neither should a target that cannot be written: a missing or read-only folder, a
        # device file or link, or the trace itself.
        check_output(output, inputs=_input_files(trace_path))
        if isinstance(trace_path, TraceDocument):
            trace_path.sha256  # noqa: B018 (the timeline records it: worked out before the run frees the document)
    inputs = _input_files(trace_path)
    prep = prepare_run(trace_path, system, overrides, native, max_memory_bytes, detail, link_bin_ns, spec, fail,
                       pipe_intervals, fabric_model, retime)
    retime_report = prep.retime
    spec, topo, trace, lowered, fabric, need = prep.spec, prep.topology, prep.trace, prep.lowered, prep.fabric, prep.need
    limit, bin_ps, record, failed_parts = prep.limit_bytes, prep.bin_ps, detail == "packets", prep.failed_parts
    del prep
    prog = progress if isinstance(progress, Progress) else (Progress(lowered.num_ops) if progress else None)
    # What the limit leaves the event queue and the binned link counters (counted as they grow).
    static_bytes = need.total_bytes - need.event_queue_bytes - need.series_bytes
    queue_limit = limit - static_bytes
    # Delivery times are kept for the trace's own messages, what /messages holds.
    # The lowering's columns the engine copies go as it is built (the packet rows of --detail
    # packets name every message: then they stay).
    engine = simulate(lowered, fabric, native=native, progress=prog, queue_limit_bytes=queue_limit, bin_ps=bin_ps,
                      record_packets=record, record_deliveries=lowered.leading_trace_messages(),
                      drop_engine_inputs=not record, failed_parts=failed_parts)
    # Its run state: the rest of the results are built without it (the op times read first).
    hbm_shared_ops, hbm_shared_demand = engine.hbm_shared_ops, engine.hbm_shared_demand
    engine.release(keep_op_times=True)
    op_start, op_end = np.asarray(engine.op_start_ps), np.asarray(engine.op_end_ps)
    engine.release()
    full = RunResult(
        spec=spec,
        topology=topo,
        trace=trace,
        lowered=lowered,
        op_start_ps=op_start,
        op_end_ps=op_end,
        link_bytes=np.asarray(engine.link_bytes),
        link_busy_ps=np.asarray(engine.link_busy_ps),
        events=int(engine.events),
        max_pending_events=int(engine.max_pending),
        wall_time_s=0.0,
        native=native,
        link_series=engine.link_series() if bin_ps else None,
        msg_packets=engine.message_packets(len(engine.msg_delivered_ps)),
        fabric_packets=int(engine.packets_total),
        msg_delivered_ps=np.asarray(engine.msg_delivered_ps),
        packets_sent=int(engine.packets_sent),
        packets_lost=int(getattr(engine, "packets_lost", 0)),
        packets=engine.packet_records() if record else None,
        hbm_clock=engine.hbm_clock(),
        hbm_shared_ops=hbm_shared_ops,
        hbm_shared_demand=hbm_shared_demand,
        fabric_model=fabric_model,
        retime=retime_report,
    )
    del engine  # with record_packets, its copy of the records
    check_invariants(full)
    if bin_ps:
        check_series_rows(full, limit - static_bytes)
    result, hbm = trace_result_hbm_later(full, pipe_intervals)
    del full, lowered, fabric  # the whole lowering: the result keeps its view of the trace's ops
    if output is None:
        result = with_hbm_series(result, hbm.result())
        result.wall_time_s = time.perf_counter() - t0
        result.compile_s = compile_seconds() - compiling0
        return result
    from cmemu.output.hdf5 import write_timeline

    # The file's other groups are written while the HBM series are still being worked out; the
    # run's wall time is to when they were done (its results whole), the writing aside.
    built = time.perf_counter()
    result.wall_time_s = built - t0
    result.compile_s = compile_seconds() - compiling0
    whole = result

    def complete():
        nonlocal whole
        series = hbm.result()
        whole = with_hbm_series(result, series)
        whole.wall_time_s = max(built, series[2]) - t0
        whole.compile_s = compile_seconds() - compiling0
        return whole

    write_timeline(output, result, compression=compression, detail=detail, hbm_later=complete, inputs=inputs)
    return whole


def _input_files(trace) -> tuple:
    """The files a run reads (none for a trace in memory), which its output must not replace."""
    if isinstance(trace, TraceDocument):
        return () if trace.file is None else (trace.file,)
    return (trace,)


def trace_failures(trace, topo: Topology, fail=()):
    """The failed parts of a run: ``--fail`` (``fail``) and the trace header's ``cmemu.faults``
    ([{"fail": "l2:0.3", "at_ns": 5000}]: from the start when at_ns is 0, else during the run;
    the trace checker has checked their form), each part checked against the topology.
    Returns (Failures from the start, [(time in ps, Failures)] during the run, die -> what
    failed it from the start, a text naming every failed part and where it comes from)."""
    static, timed, origin, named = [], [], {}, []
    for part in fail:
        parse_failures([part], topo)
        named.append(f"--fail {part}")
        if str(part).startswith("die:"):
            origin.setdefault(int(str(part)[4:]), f"--fail {part}")
    for k, entry in enumerate(trace.header.get("cmemu.faults", [])):
        part, at = entry["fail"], entry.get("at_ns", 0)
        one = parse_failures([part], topo, label=f"{trace.path}: header cmemu.faults[{k}] {part!r}")
        if at == 0:
            static.append(part)
            named.append(f"the trace's cmemu.faults: {part} from the start")
            for die in one.dies:
                origin.setdefault(die, f"the trace's cmemu.faults[{k}], from the start")
        else:
            timed.append((ns_to_ps(at), one))
            named.append(f"the trace's cmemu.faults: {part} at {ns_to_ps(at) / 1e6:,.3f} us")
    failures = parse_failures(list(fail) + static, topo)
    shown = "; ".join(named[:4]) + (f"; and {len(named) - 4} more" if len(named) > 4 else "")
    return failures, timed, origin, shown or "--fail"
