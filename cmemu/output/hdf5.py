"""The HDF5 timeline, schema v1 (documented in docs/timeline-format.md).

Written to a temporary file beside the target and renamed at the end, so an interrupted run
never leaves a half-written file under the target name.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import h5py
import numpy as np

import cmemu
from cmemu.lower import OP_TYPES
from cmemu.topology import LINK_KIND_NAMES

TIMELINE_FORMAT = "cmemu.timeline"
TIMELINE_VERSION = 1

OP_TYPE_ENUM = h5py.enum_dtype({name: i for i, name in enumerate(OP_TYPES)}, basetype="u1")
LINK_KIND_ENUM = h5py.enum_dtype({name: i for i, name in enumerate(LINK_KIND_NAMES)}, basetype="u1")
_CHUNK_ROWS = 1 << 16


def _dataset(group, name, data, dtype=None, unit=None, doc=None):
    data = np.asarray(data, dtype=object) if isinstance(data, list) else np.asarray(data)
    kwargs = {}
    if len(data) > 0:
        kwargs = dict(chunks=(min(len(data), _CHUNK_ROWS),), compression="gzip", shuffle=True)
    ds = group.create_dataset(name, data=data, dtype=dtype, **kwargs)
    if unit:
        ds.attrs["unit"] = unit
    if doc:
        ds.attrs["doc"] = doc
    return ds


def write_timeline(path, result) -> Path:
    """Write a RunResult to ``path`` (atomically: temporary file, then rename)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with h5py.File(tmp, "w") as f:
            _write(f, result)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def _write(f: h5py.File, r) -> None:
    L, topo, trace = r.lowered, r.topology, r.trace
    f.attrs["format"] = TIMELINE_FORMAT
    f.attrs["version"] = TIMELINE_VERSION
    f.attrs["cmemu_version"] = cmemu.__version__
    f.attrs["preset"] = r.spec.name
    f.attrs["spec_json"] = json.dumps(r.spec.to_dict(), sort_keys=True)
    f.attrs["trace_path"] = str(trace.path)
    f.attrs["trace_sha256"] = trace.sha256
    f.attrs["sim_end_ps"] = np.int64(r.sim_end_ps)
    f.attrs["wall_time_s"] = float(r.wall_time_s)
    f.attrs["events"] = np.int64(r.events)
    f.attrs["engine"] = "native" if r.native else "reference"

    ops = f.create_group("ops")
    ops.attrs["doc"] = "one row per trace node, in trace file order"
    _dataset(ops, "node_id", L.op_node_id, doc="the node's id in the trace")
    _dataset(ops, "rank", L.op_rank, doc="die index in the system")
    _dataset(ops, "stream", L.op_stream)
    _dataset(ops, "type", L.op_type.astype(np.uint8), dtype=OP_TYPE_ENUM)
    _dataset(ops, "name", L.op_name, dtype=h5py.string_dtype())
    _dataset(ops, "start_ps", r.op_start_ps, unit="ps", doc="when all its dependencies had ended")
    _dataset(ops, "end_ps", r.op_end_ps, unit="ps")
    _dataset(ops, "bytes", L.op_bytes, unit="B", doc="comm_size or tensor_size")

    msgs = f.create_group("messages")
    msgs.attrs["doc"] = "one row per matched COMM_SEND/COMM_RECV pair"
    _dataset(msgs, "send_op", L.msg_send_op, doc="row in /ops")
    _dataset(msgs, "recv_op", L.msg_recv_op, doc="row in /ops")
    _dataset(msgs, "bytes", L.msg_bytes, unit="B")
    _dataset(msgs, "packets", np.diff(L.msg_chunk_ptr).astype(np.int64))

    links = f.create_group("links")
    links.attrs["doc"] = "one row per directed link; totals over the whole run"
    _dataset(links, "src_vertex", topo.link_src)
    _dataset(links, "dst_vertex", topo.link_dst)
    _dataset(links, "kind", topo.link_kind, dtype=LINK_KIND_ENUM)
    _dataset(links, "rate_byte_per_s", topo.link_rate_byte_per_s, unit="B/s")
    _dataset(links, "latency_ps", topo.link_latency_ps, unit="ps")
    _dataset(links, "bytes", r.link_bytes, unit="B")
    _dataset(links, "busy_ps", r.link_busy_ps, unit="ps")
