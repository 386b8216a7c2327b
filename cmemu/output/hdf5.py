"""The HDF5 timeline writer, layout version 5 (documented in docs/timeline-format.md).

Every dataset is one-dimensional (``/dies/busy_ps`` is two), chunked, and compressed as asked
(gzip level 1 with the shuffle filter by default, lzf, or none). Data goes to the file a chunk at
a time (gzip: up to PENDING_CHUNKS compressed at once, in threads), rows put in order a chunk at a
time too, so writing needs memory for a few chunks beyond the arrays the run already holds; the
op names (a Python list in ``Lowered``) are encoded chunk by chunk too.

Written to a temporary file beside the target and renamed at the end (``cmemu.output.atomic``),
so an interrupted run never leaves a half-written file under the target name. The reader is ``cmemu.output.reader``.
"""
from __future__ import annotations

import json
import os
from collections import deque
from pathlib import Path

import h5py
import numpy as np

try:
    # ISA-L's deflate (python-isal): zlib streams like zlib's, which any HDF5 reader inflates, at
    # about 7x the speed of zlib's level 1 for 5-10% larger chunks; compressing was most of the
    # time of writing a big run's timeline. zlib itself where it is not installed.
    from isal import isal_zlib as _deflate

    DEFLATE = "isal"
except ImportError:  # pragma: no cover - isal is a dependency; a platform without its wheel
    import zlib as _deflate

    DEFLATE = "zlib"

import cmemu
from cmemu.output.schema import (
    LINK_SERIES_FIELDS,
    HBM_SERIES_FIELDS,
    HBM_STACK_SERIES_FIELDS,
    MOE_PAIR_FIELDS,
    PACKET_FIELDS,
    TASK_FIELDS,
    TIMELINE_FORMAT,
    TIMELINE_VERSION,
    check_compression,
    check_detail,
)
from cmemu.output.atomic import atomic_path
from cmemu.output.summary import die_summary
from cmemu.results.columns import has_repeats, increasing, lexsort_order, sum_by
from cmemu.topology import LINK_KIND_NAMES
from cmemu.vocab import NODE_TYPES, PACKET_TYPE_NAMES, PIPE_NAMES

OP_TYPE_ENUM = h5py.enum_dtype({name: i for i, name in enumerate(NODE_TYPES)}, basetype="u1")
LINK_KIND_ENUM = h5py.enum_dtype({name: i for i, name in enumerate(LINK_KIND_NAMES)}, basetype="u1")
PIPE_ENUM = h5py.enum_dtype({name: i for i, name in enumerate(PIPE_NAMES)}, basetype="u1")
PACKET_TYPE_ENUM = h5py.enum_dtype({name: i for i, name in enumerate(PACKET_TYPE_NAMES)}, basetype="u1")
CHUNK_ROWS = 1 << 16
# Level 1, of ISA-L's 0-3 (or zlib's 0-9): the fastest but one; its files are about 5% larger
# than at level 2 or 3, and about 15% smaller than at 0.
GZIP_LEVEL = 1
# Threads that compress chunks: the cores this process may use, at most four; and the chunks
# (of at most 0.5 MiB each before compression) they may have in the works at once.
WRITER_THREADS = max(1, min(4, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                            else os.cpu_count() or 1))
PENDING_CHUNKS = 32

TASKS_RECORDED = "recorded"
TASKS_NOT_RECORDED = "not recorded: this engine has no pipe/engine model yet (RunResult.tasks is None)"
TASKS_OMITTED = "omitted: written with --detail ops"


def _pack(rows, chunks, dtype, level: int) -> bytes:
    """One chunk as HDF5 stores it with the shuffle and deflate filters: the rows padded to the
    whole chunk, byte k of every element together for each k, then deflated (DEFLATE) at ``level``."""
    rows = np.ascontiguousarray(rows, dtype=dtype)
    if rows.shape[0] < chunks[0]:  # the last chunk: HDF5 stores it whole
        whole = np.zeros(chunks, dtype=dtype)
        whole[:rows.shape[0]] = rows
        rows = whole
    raw = rows.reshape(-1).view(np.uint8)
    if dtype.itemsize > 1:
        raw = np.ascontiguousarray(raw.reshape(-1, dtype.itemsize).T)
    return _deflate.compress(raw.data, level)


class _Writer:
    """Creates chunked, compressed datasets and fills them a chunk at a time.

    With gzip, chunks are shuffled and compressed in worker threads (ISA-L and zlib let go of the GIL)
    and written as they are (``write_direct_chunk``): the same filters and the same data read
    back, on every core. Up to PENDING_CHUNKS chunks are in the works at once, across datasets,
    so that the writer's own work (checks, orders) goes on while they are compressed; ``flush``
    writes them all. lzf and no compression go through h5py's own filters.
    """

    def __init__(self, compression: str):
        check_compression(compression)
        self.level = None
        if compression == "gzip":
            self.level = GZIP_LEVEL
            self.filters = dict(compression="gzip", compression_opts=GZIP_LEVEL, shuffle=True)
        elif compression == "lzf":
            self.filters = dict(compression="lzf", shuffle=True)
        else:
            self.filters = {}
        self.pool = None
        self.pending = deque()  # (dataset, chunk offset, future of its bytes), in submission order

    def flush(self, keep: int = 0) -> None:
        """Write the compressed chunks, oldest first, until at most ``keep`` are pending."""
        while len(self.pending) > keep:
            ds, offset, done = self.pending.popleft()
            ds.id.write_direct_chunk(offset, done.result())

    def close(self) -> None:
        """Stop the workers; chunks not flushed are dropped (after an error)."""
        if self.pool is not None:
            self.pool.shutdown(cancel_futures=True)
            self.pool = None
        self.pending.clear()

    def dataset(self, group, name, data, dtype=None, unit=None, doc=None, order=None):
        """Write ``data`` (an array, or a list of str) under ``group/name``; with ``order`` (row
        indices), the rows ``data[order]``, gathered a chunk at a time."""
        is_list = isinstance(data, list)
        if not is_list:
            data = np.asarray(data)
        n = len(data) if order is None else len(order)
        if dtype is None:
            dtype = h5py.string_dtype() if is_list else data.dtype
        shape = (n,) + (() if is_list else data.shape[1:])
        chunks = (max(1, min(n, CHUNK_ROWS)),) + shape[1:]
        ds = group.create_dataset(name, shape=shape, maxshape=(None,) + shape[1:], dtype=dtype,
                                  chunks=chunks, **self.filters)
        direct = self.level is not None and not is_list
        if direct and self.pool is None:
            from concurrent.futures import ThreadPoolExecutor

            self.pool = ThreadPoolExecutor(WRITER_THREADS)
        stored = np.dtype(ds.dtype)
        for lo in range(0, n, CHUNK_ROWS):
            rows = data[lo:lo + CHUNK_ROWS] if order is None else data[order[lo:lo + CHUNK_ROWS]]
            if direct:
                self.pending.append((ds, (lo,) + (0,) * (len(shape) - 1),
                                     self.pool.submit(_pack, rows, chunks, stored, self.level)))
                self.flush(PENDING_CHUNKS)
            else:
                ds[lo:lo + len(rows)] = np.array(rows, dtype=object) if is_list else rows
        if unit:
            ds.attrs["unit"] = unit
        if doc:
            ds.attrs["doc"] = doc
        return ds


def write_timeline(path, result, compression: str = "gzip", detail: str = "tasks", hbm_later=None,
                   inputs=()) -> Path:
    """Write a RunResult to ``path`` (``cmemu.output.atomic``: a temporary file created
    exclusively, renamed at the end; refused over any of ``inputs``, the trace for a run).

    ``hbm_later``: a function giving the whole result, ``result`` lacking its HBM series (and
    wall time) until then (``cmemu.results.view.trace_result_hbm_later``): called once the rest is written."""
    check_detail(detail)
    w = _Writer(compression)
    path = Path(path)
    try:
        with atomic_path(path, inputs) as tmp:
            with h5py.File(tmp, "x") as f:  # "x": O_EXCL, never opens what is at the name
                _write(f, result, w, detail, hbm=hbm_later is None)
                if hbm_later is not None:
                    result = hbm_later()
                    f.attrs["wall_time_s"] = float(result.wall_time_s)
                    _write_hbm(f["dies"], result, w)
                w.flush()
    finally:
        w.close()
    return path


def _write(f: h5py.File, r, w: _Writer, detail: str, hbm: bool = True) -> None:
    L, topo, trace = r.lowered, r.topology, r.trace
    spec = r.spec.to_dict()
    f.attrs["format"] = TIMELINE_FORMAT
    f.attrs["version"] = TIMELINE_VERSION
    f.attrs["cmemu_version"] = cmemu.__version__
    f.attrs["preset"] = r.spec.name
    f.attrs["spec_json"] = json.dumps(spec, sort_keys=True)
    f.attrs["trace_path"] = str(trace.path)
    f.attrs["trace_sha256"] = trace.sha256
    f.attrs["sim_end_ps"] = np.int64(r.sim_end_ps)
    f.attrs["wall_time_s"] = float(r.wall_time_s)
    f.attrs["events"] = np.int64(r.events)
    f.attrs["max_pending_events"] = np.int64(r.max_pending_events)
    f.attrs["engine"] = "native" if r.native else "reference"
    f.attrs["detail"] = detail
    f.attrs["fabric_model"] = r.fabric_model
    seed = getattr(r, "seed", None)
    if seed is not None:  # only runs that draw random numbers have one
        f.attrs["seed"] = np.int64(seed)

    ops = f.create_group("ops")
    ops.attrs["doc"] = "one row per trace node, in trace file order"
    w.dataset(ops, "node_id", L.op_node_id, doc="the node's id in the trace")
    w.dataset(ops, "rank", L.op_rank, doc="die index in the system")
    w.dataset(ops, "stream", L.op_stream)
    w.dataset(ops, "type", L.op_type.astype(np.uint8), dtype=OP_TYPE_ENUM)
    w.dataset(ops, "name", L.op_name)
    w.dataset(ops, "start_ps", r.op_start_ps, unit="ps", doc="when all its dependencies had ended")
    w.dataset(ops, "end_ps", r.op_end_ps, unit="ps")
    w.dataset(ops, "bytes", L.op_bytes, unit="B", doc="comm_size or tensor_size")

    msgs = f.create_group("messages")
    msgs.attrs["doc"] = "one row per matched COMM_SEND/COMM_RECV pair"
    packets = r.msg_packets
    w.dataset(msgs, "send_op", L.msg_send_op, doc="row in /ops")
    w.dataset(msgs, "recv_op", L.msg_recv_op, doc="row in /ops")
    w.dataset(msgs, "bytes", L.msg_bytes, unit="B")
    w.dataset(msgs, "packets", packets)

    links = f.create_group("links")
    links.attrs["doc"] = "one row per directed link; totals over the whole run"
    w.dataset(links, "src_vertex", topo.link_src)
    w.dataset(links, "dst_vertex", topo.link_dst)
    w.dataset(links, "kind", topo.link_kind, dtype=LINK_KIND_ENUM)
    w.dataset(links, "rate_byte_per_s", topo.link_rate_byte_per_s, unit="B/s")
    w.dataset(links, "latency_ps", topo.link_latency_ps, unit="ps")
    w.dataset(links, "bytes", r.link_bytes, unit="B")
    w.dataset(links, "busy_ps", r.link_busy_ps, unit="ps")
    series = getattr(r, "link_series", None)
    if series is not None:
        _write_link_series(links, series, r, w)

    _write_dies(f, r, spec, w, hbm)
    _write_tasks(f, r, w, detail)
    _write_moe_pairs(f, r, w)
    if detail == "packets":
        _write_packets(f, r, w)


def _write_packets(f, r, w: _Writer) -> None:
    """/packets (v4, --detail packets only): every packet's transmission on every link."""
    packets = getattr(r, "packets", None)
    if packets is None:
        raise ValueError("detail 'packets' needs RunResult.packets: run with detail='packets' "
                         "(the engine's record_packets)")
    cols = _columns("RunResult.packets", packets, PACKET_FIELDS)
    nlinks, nmsgs, nops = r.topology.num_links, r.lowered.num_messages, r.lowered.num_ops
    link, msg, op = cols["link"], cols["msg"], cols["op"]
    if link.size:
        if link.min() < 0 or link.max() >= nlinks:
            raise ValueError(f"RunResult.packets: link outside 0..{nlinks - 1}")
        if msg.min() < -1 or msg.max() >= nmsgs or op.min() < -1 or op.max() >= nops:
            raise ValueError(f"RunResult.packets: msg outside -1..{nmsgs - 1} or op outside -1..{nops - 1}")
        if np.any(cols["end_ps"] < cols["start_ps"]) or cols["wire_bytes"].min() <= 0:
            raise ValueError("RunResult.packets: a packet ends before it starts, or has no bytes")
        if cols["type"].max() >= len(PACKET_TYPE_NAMES):
            raise ValueError(f"RunResult.packets: type code above {len(PACKET_TYPE_NAMES) - 1}")
    # Every transmission is recorded, so per link they add up to the run's totals.
    for name, col, totals in (("wire_bytes", cols["wire_bytes"], r.link_bytes),
                              ("busy time", cols["end_ps"] - cols["start_ps"], r.link_busy_ps)):
        summed = np.bincount(link, weights=col, minlength=nlinks).astype(np.int64) if link.size \
            else np.zeros(nlinks, dtype=np.int64)
        bad = np.flatnonzero(summed != np.asarray(totals, dtype=np.int64))
        if bad.size:
            i = int(bad[0])
            raise ValueError(f"RunResult.packets: the {name} of link {i}'s packets sum to {summed[i]}, "
                             f"but the run's total is {int(totals[i])}")
    start = cols["start_ps"]
    # The engine's start order, kept if sorted.
    order = None if start.size < 2 or np.all(start[1:] >= start[:-1]) else np.argsort(start, kind="stable")
    g = f.create_group("packets")
    g.attrs["doc"] = ("one row per transmission of a packet on a link (--detail packets), in the order they "
                      "started; per link the rows sum to /links bytes and busy_ps")
    w.dataset(g, "start_ps", start, unit="ps", doc="when its head started serialising onto the link", order=order)
    w.dataset(g, "end_ps", cols["end_ps"], unit="ps", doc="when its tail left the sender", order=order)
    w.dataset(g, "link", link, doc="row in /links", order=order)
    w.dataset(g, "msg", msg, doc="row in /messages; -1 for a message a collective made inside itself", order=order)
    w.dataset(g, "op", op, doc="row in /ops of the op that moved it: a write's send, a read's receive, "
                               "or the collective", order=order)
    w.dataset(g, "seq", cols["seq"], doc="packet number within its message, from 0", order=order)
    w.dataset(g, "wire_bytes", cols["wire_bytes"], unit="B", doc="bytes on the wire, headers included", order=order)
    w.dataset(g, "type", cols["type"], dtype=PACKET_TYPE_ENUM, order=order)


def _write_dies(f, r, spec, w: _Writer, hbm: bool = True) -> None:
    L = r.lowered
    ops = {"rank": L.op_rank, "type": L.op_type, "start_ps": r.op_start_ps, "end_ps": r.op_end_ps,
           "bytes": L.op_bytes}
    msgs = {"send_op": L.msg_send_op, "recv_op": L.msg_recv_op, "bytes": L.msg_bytes}
    s = die_summary(ops, msgs, spec)
    g = f.create_group("dies")
    g.attrs["doc"] = "one row per die (row = die index); figures over the whole run, derived from /ops and /messages"
    w.dataset(g, "node", s["node"])
    w.dataset(g, "npu", s["npu"], doc="NPU index in the system; an NPU holds dies 2 npu and 2 npu + 1")
    w.dataset(g, "die_in_npu", s["die_in_npu"])
    ds = w.dataset(g, "busy_ps", s["busy_ps"], unit="ps",
                   doc="[die, op type]: time during which at least one op of that type ran on the die")
    ds.attrs["columns"] = ",".join(NODE_TYPES)
    w.dataset(g, "any_busy_ps", s["any_busy_ps"], unit="ps", doc="time during which any op ran on the die")
    w.dataset(g, "exposed_comm_ps", s["exposed_comm_ps"], unit="ps",
              doc="time during which a COMM_RECV or COMM_COLL was in progress and no COMP, MEM_LOAD or "
                  "MEM_STORE ran on the die")
    w.dataset(g, "bytes_sent", s["bytes_sent"], unit="B", doc="payload of messages the die sent")
    w.dataset(g, "bytes_received", s["bytes_received"], unit="B", doc="payload of messages the die received")
    w.dataset(g, "hbm_read_bytes", s["hbm_read_bytes"], unit="B", doc="bytes of MEM_LOAD ops (COMP operands not included)")
    w.dataset(g, "hbm_write_bytes", s["hbm_write_bytes"], unit="B", doc="bytes of MEM_STORE ops (COMP results not included)")
    if hbm:
        _write_hbm(g, r, w)


def _write_hbm(dies, r, w: _Writer) -> None:
    series = getattr(r, "hbm_series", None)
    if series is not None:
        _write_hbm_series(dies, series, r, w)
        stacks = getattr(r, "hbm_stack_series", None)
        if stacks is not None:
            _write_hbm_stack_series(dies, stacks, series, r, w)


def _write_hbm_series(dies, series, r, w: _Writer) -> None:
    cols = _columns("RunResult.hbm_series", series, HBM_SERIES_FIELDS)
    bin_ps = int(series["bin_ps"])
    if bin_ps <= 0:
        raise ValueError(f"RunResult.hbm_series['bin_ps'] must be a positive bin width in ps, got {bin_ps}")
    die, b = cols["die"], cols["bin"]
    if die.size and (die.min() < 0 or die.max() >= r.spec.dies or b.min() < 0 or cols["bytes"].min() < 0):
        raise ValueError("RunResult.hbm_series: die outside the system, negative bin or negative bytes")
    order = lexsort_order((die, b))
    g = dies.create_group("hbm_binned")
    g.attrs["doc"] = ("HBM bytes per (die, time bin), only nonzero pairs, sorted by bin then die: each op's HBM "
                      "traffic (the die model's reads and writes; MEM_LOAD/MEM_STORE bytes; a collective's loads, "
                      "DMA reads and copies) over the op's run, at the rate its HBM share gave it")
    g.attrs["bin_ps"] = np.int64(bin_ps)
    g.attrs["bins"] = np.int64(-(-max(r.sim_end_ps, 1) // bin_ps))
    w.dataset(g, "die", die, doc="row in /dies", order=order)
    w.dataset(g, "bin", b, doc="time bin: covers [bin * bin_ps, (bin + 1) * bin_ps)", order=order)
    w.dataset(g, "bytes", cols["bytes"], unit="B", doc="HBM bytes read and written in the bin", order=order)


def _write_hbm_stack_series(dies, series, per_die, r, w: _Writer) -> None:
    cols = _columns("RunResult.hbm_stack_series", series, HBM_STACK_SERIES_FIELDS)
    bin_ps, stacks = int(series.get("bin_ps", 0)), int(series.get("stacks", 0))
    if bin_ps != int(per_die["bin_ps"]) or stacks <= 0:
        raise ValueError(f"RunResult.hbm_stack_series: bin_ps ({bin_ps}) must be hbm_series' "
                         f"({int(per_die['bin_ps'])}) and stacks ({stacks}) positive")
    die, stack, b = cols["die"], cols["stack"], cols["bin"]
    if die.size and (die.min() < 0 or die.max() >= r.spec.dies or stack.min() < 0 or stack.max() >= stacks
                     or b.min() < 0 or cols["bytes"].min() < 0):
        raise ValueError("RunResult.hbm_stack_series: die or stack outside the system, negative bin or bytes")
    # The stacks of each (die, bin) must add up to the per-die series.
    nb = int(max(b.max() if b.size else 0, np.max(per_die["bin"]) if len(per_die["bin"]) else 0)) + 1
    stack_key = die.astype(np.int64) * nb + b
    die_key = np.asarray(per_die["die"], dtype=np.int64) * nb + np.asarray(per_die["bin"], dtype=np.int64)
    if r.spec.dies * nb <= max(4 * (stack_key.size + die_key.size), 1 << 20):
        summed = sum_by(stack_key, cols["bytes"], r.spec.dies * nb)
        want = sum_by(die_key, per_die["bytes"], r.spec.dies * nb)
        bad = np.flatnonzero(summed != want)
        first = (int(bad[0]), int(summed[bad[0]]), int(want[bad[0]])) if bad.size else None
    else:  # many bins, few of them used: sums by the (die, bin) pairs used, not by every pair
        first = _first_difference(stack_key, cols["bytes"], die_key, per_die["bytes"])
    if first is not None:
        d, k = divmod(first[0], nb)
        raise ValueError(f"RunResult.hbm_stack_series: the stacks of die {d} in bin {k} sum to {first[1]} B, "
                         f"the per-die series has {first[2]} B")
    # The run's rows are in (die, bin, stack) order: those of a bin are then in (die, stack) order
    # already, and a stable sort by bin alone finishes (one pass of three).
    by_die = die.size and increasing(die, b.astype(np.int64) * stacks + stack)
    order = lexsort_order((b,) if by_die else (stack, die, b))
    g = dies.create_group("hbm_stack_binned")
    g.attrs["doc"] = ("HBM bytes per (die, stack, time bin), only nonzero triples, sorted by bin, die, stack: "
                      "each op's HBM bytes split over the stacks by the address interleave (a contiguous "
                      "region, a die's ops one after the other), over the op's run as its HBM share allowed; sums to /dies/hbm_binned")
    g.attrs["bin_ps"] = np.int64(bin_ps)
    g.attrs["bins"] = np.int64(-(-max(r.sim_end_ps, 1) // bin_ps))
    g.attrs["stacks"] = np.int64(stacks)
    w.dataset(g, "die", die, doc="row in /dies", order=order)
    w.dataset(g, "stack", stack, doc="HBM stack of the die, 0 .. stacks - 1", order=order)
    w.dataset(g, "bin", b, doc="time bin: covers [bin * bin_ps, (bin + 1) * bin_ps)", order=order)
    w.dataset(g, "bytes", cols["bytes"], unit="B", doc="HBM bytes read and written on the stack in the bin",
              order=order)


def _first_difference(key_a, value_a, key_b, value_b):
    """(key, sum of a, sum of b) at the smallest key where the sums of ``value_a`` by ``key_a``
    and of ``value_b`` by ``key_b`` differ (a key absent from one sums to 0 there), else None:
    what comparing two dense sum_by arrays gives, in memory by the keys used."""
    def sums(key, value):
        uniq, inv = np.unique(key, return_inverse=True)
        total = sum_by(inv.reshape(-1), value, uniq.size)
        return uniq[total != 0], total[total != 0]

    ka, va = sums(key_a, value_a)
    kb, vb = sums(key_b, value_b)
    if ka.size == kb.size and np.array_equal(ka, kb) and np.array_equal(va, vb):
        return None
    keys = np.union1d(ka, kb)
    at_a = np.zeros(keys.size, dtype=np.int64)
    at_b = np.zeros(keys.size, dtype=np.int64)
    at_a[np.searchsorted(keys, ka)] = va
    at_b[np.searchsorted(keys, kb)] = vb
    k = int(np.flatnonzero(at_a != at_b)[0])
    return int(keys[k]), int(at_a[k]), int(at_b[k])


def _write_moe_pairs(f, r, w: _Writer) -> None:
    pairs = getattr(r, "moe_pairs", None)
    if pairs is None:
        cols = {name: np.zeros(0, dtype=dtype) for name, dtype in MOE_PAIR_FIELDS}
    else:
        cols = _columns("RunResult.moe_pairs", pairs, MOE_PAIR_FIELDS)
    n_ops = r.lowered.num_ops
    for name, c in cols.items():
        if c.size and (c.min() < 0 or c.max() >= n_ops):
            raise ValueError(f"RunResult.moe_pairs: {name} outside 0..{n_ops - 1}")
    if cols["dispatch_op"].size:
        rank = r.lowered.op_rank
        if np.any(rank[cols["dispatch_op"]] != rank[cols["combine_op"]]):
            raise ValueError("RunResult.moe_pairs: a dispatch and its combine on different ranks")
    g = f.create_group("moe_pairs")
    g.attrs["doc"] = ("one row per rank and MoE exchange: the MOE_COMBINE that brings back the tokens the "
                      "MOE_DISPATCH sent (same rank and group, nearest through the combine's dependencies)")
    w.dataset(g, "dispatch_op", cols["dispatch_op"], doc="row in /ops of the MOE_DISPATCH")
    w.dataset(g, "combine_op", cols["combine_op"], doc="row in /ops of the MOE_COMBINE")


def _columns(what: str, table, fields) -> dict:
    """Check a dict of equal-length arrays against the fields it must have; cast the dtypes."""
    if not isinstance(table, dict):
        raise ValueError(f"{what} must be a dict of numpy arrays, got {type(table).__name__}")
    missing = [name for name, _ in fields if name not in table]
    if missing:
        raise ValueError(f"{what} lacks {', '.join(missing)} (needs {', '.join(n for n, _ in fields)})")
    cols = {name: np.asarray(table[name]) for name, _ in fields}
    lengths = {name: c.shape for name, c in cols.items()}
    if len(set(lengths.values())) != 1 or any(len(s) != 1 for s in lengths.values()):
        raise ValueError(f"{what}: columns must be one-dimensional and of one length, got {lengths}")
    for name, dtype in fields:
        c = cols[name]
        if c.size and not np.issubdtype(c.dtype, np.integer):
            raise ValueError(f"{what}['{name}'] must hold integers, got {c.dtype}")
        cols[name] = c.astype(dtype, copy=False)
    return cols


def _write_link_series(links, series, r, w: _Writer) -> None:
    cols = _columns("RunResult.link_series", series, LINK_SERIES_FIELDS)
    bin_ps = int(series.get("bin_ps", 0))
    if bin_ps <= 0:
        raise ValueError(f"RunResult.link_series['bin_ps'] must be a positive bin width in ps, got {bin_ps}")
    link, b = cols["link"], cols["bin"]
    nlinks = r.topology.num_links
    if link.size and (link.min() < 0 or link.max() >= nlinks or b.min() < 0):
        raise ValueError(f"RunResult.link_series: link outside 0..{nlinks - 1} or negative bin")
    if link.size and (cols["busy_ps"].max() > bin_ps or cols["busy_ps"].min() < 0 or cols["bytes"].min() < 0):
        raise ValueError(f"RunResult.link_series: busy_ps outside 0..bin_ps ({bin_ps}) or negative bytes")
    order = lexsort_order((link, b))
    # The engine's rows are in (link, bin) order, which has no pair twice; in any other order
    # the check goes through the file's order (random reads: 0.3 s on 31 M rows).
    if not increasing(link, b) and has_repeats(order, b, link):
        raise ValueError("RunResult.link_series: a (link, bin) pair appears twice")
    # The bins must add up to the run's totals, or one of the two is wrong.
    for name, totals in (("bytes", r.link_bytes), ("busy_ps", r.link_busy_ps)):
        summed = sum_by(link, cols[name], nlinks)
        bad = np.flatnonzero(summed != np.asarray(totals, dtype=np.int64))
        if bad.size:
            i = int(bad[0])
            raise ValueError(f"RunResult.link_series: {name} of link {i} sum to {summed[i]} over the bins, "
                             f"but the run's total is {int(totals[i])}")
    g = links.create_group("binned")
    g.attrs["doc"] = "per (link, time bin) counters, only nonzero pairs, sorted by bin then link"
    g.attrs["bin_ps"] = np.int64(bin_ps)
    g.attrs["bins"] = np.int64(-(-max(r.sim_end_ps, 1) // bin_ps))
    w.dataset(g, "link", link, doc="row in /links", order=order)
    # In the file's order the bins are the rows' bins sorted: from their counts rather than
    # gathered (a random read per row) when their range is not much wider than the rows.
    lo_bin = int(b.min()) if b.size else 0
    if b.size and int(b.max()) - lo_bin <= max(4 * b.size, 1 << 16):
        counts = np.bincount(b - lo_bin)
        w.dataset(g, "bin", np.repeat(np.arange(lo_bin, lo_bin + counts.size, dtype=b.dtype), counts),
                  doc="time bin: covers [bin * bin_ps, (bin + 1) * bin_ps)")
        del counts
    else:
        w.dataset(g, "bin", b, doc="time bin: covers [bin * bin_ps, (bin + 1) * bin_ps)", order=order)
    w.dataset(g, "bytes", cols["bytes"], unit="B", doc="bytes of the packets that started serialising in the bin",
              order=order)
    w.dataset(g, "busy_ps", cols["busy_ps"], unit="ps", doc="time the link spent serialising in the bin", order=order)


def _write_tasks(f, r, w: _Writer, detail: str) -> None:
    tasks = getattr(r, "tasks", None)
    g = f.create_group("tasks")
    g.attrs["doc"] = "one row per pipe or engine task (a tile on CUBE, a DMA on MTE2, a transfer on SDMA, ...)"
    if detail == "ops":
        status, tasks = TASKS_OMITTED, None
    elif tasks is None:
        status = TASKS_NOT_RECORDED
    else:
        status = TASKS_RECORDED
    g.attrs["status"] = status
    n = getattr(r, "pipe_intervals", None)
    if status == TASKS_RECORDED and n is not None:
        g.attrs["max_intervals_per_pipe"] = np.int64(n)
    if tasks is None:
        cols = {name: np.zeros(0, dtype=dtype) for name, dtype in TASK_FIELDS}
    else:
        cols = _columns("RunResult.tasks", tasks, TASK_FIELDS)
        n_ops, dies = r.lowered.num_ops, r.spec.dies
        if cols["die"].size:
            if cols["pipe"].max() >= len(PIPE_NAMES):
                raise ValueError(f"RunResult.tasks: pipe code above {len(PIPE_NAMES) - 1} ({', '.join(PIPE_NAMES)})")
            if cols["die"].min() < 0 or cols["die"].max() >= dies:
                raise ValueError(f"RunResult.tasks: die outside 0..{dies - 1}")
            if cols["op"].min() < -1 or cols["op"].max() >= n_ops:
                raise ValueError(f"RunResult.tasks: op outside -1..{n_ops - 1}")
            if np.any(cols["end_ps"] < cols["start_ps"]):
                raise ValueError("RunResult.tasks: a task ends before it starts")
    w.dataset(g, "die", cols["die"])
    w.dataset(g, "pipe", cols["pipe"], dtype=PIPE_ENUM)
    w.dataset(g, "op", cols["op"], doc="row in /ops of the op the task belongs to, -1 for none")
    w.dataset(g, "start_ps", cols["start_ps"], unit="ps")
    w.dataset(g, "end_ps", cols["end_ps"], unit="ps")
    w.dataset(g, "bytes", cols["bytes"], unit="B", doc="bytes the task moved (0 for pure compute)")
