"""Chakra execution traces (MLCommons Chakra's ``et_def.proto``) to and from cmemu traces
(docs/trace-format.md, "Chakra execution traces").

A Chakra ET is one file per rank, ``PREFIX.{rank}.et``: a ``GlobalMetadata`` message, then one
``Node`` message per node, each prefixed by its length as a varint (Chakra's protolib). The
protobuf classes come from ``mlc-chakra`` (``pip install 'cmemu[chakra]'``).

What maps: node types one to one (METADATA_NODE nodes are skipped); ``data_deps`` and
``ctrl_deps``; ``duration_micros`` of a COMP (when it has no ``num_ops``) as its fixed time; the
attributes ``num_ops``, ``tensor_size``, ``comm_type`` (ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER,
ALL_TO_ALL, BROADCAST), ``comm_size``, ``comm_src``, ``comm_dst``, ``comm_tag`` and ``pg_name``
(a collective's group). cmemu writes what Chakra has no field for (its streams, exact durations
in ns, operator shapes, group members, MoE collectives) as attributes named ``cmemu.*``, and reads
them back, so that a cmemu trace survives the round trip whole.
"""
from __future__ import annotations

import io
import json
import re
from pathlib import Path

from cmemu.errors import CmemuError
from cmemu.trace.importers.common import InputFileError, Unmapped

MISSING = ("Chakra traces need the optional extra mlc-chakra: pip install 'cmemu[chakra]' "
           "(or pip install mlc-chakra)")
TYPES = {"COMP": "COMP_NODE", "COMM_SEND": "COMM_SEND_NODE", "COMM_RECV": "COMM_RECV_NODE",
         "COMM_COLL": "COMM_COLL_NODE", "MEM_LOAD": "MEM_LOAD_NODE", "MEM_STORE": "MEM_STORE_NODE"}
CHAKRA_COLL = ("ALL_REDUCE", "ALL_GATHER", "REDUCE_SCATTER", "ALL_TO_ALL", "BROADCAST")
# Chakra attribute -> (its value field when cmemu writes it)
CHAKRA_ATTRS = {"num_ops": "int64_val", "tensor_size": "uint64_val", "comm_size": "int64_val",
                "comm_src": "int32_val", "comm_dst": "int32_val", "comm_tag": "int32_val"}
RANK_FILE = re.compile(r"\.(\d+)\.et$")


def require_chakra():
    """(et_def_pb2, protolib) of mlc-chakra, or the one-line error saying how to install it."""
    try:
        from chakra.schema.protobuf import et_def_pb2
        from chakra.src.third_party.utils import protolib
    except ImportError:
        raise CmemuError(MISSING) from None
    return et_def_pb2, protolib


def rank_files(prefix: str) -> dict[int, Path]:
    """PREFIX.0.et, PREFIX.1.et, ... -> {rank: path}; none is an error naming the prefix."""
    base = Path(prefix)
    folder = base.parent if str(base.parent) else Path(".")
    files = {}
    if folder.is_dir():
        for path in folder.iterdir():
            m = RANK_FILE.search(path.name)
            if m and path.name[:m.start()] == base.name and path.is_file():
                files[int(m.group(1))] = path
    if not files:
        raise InputFileError(prefix, f"no Chakra trace files {base.name}.0.et, {base.name}.1.et, ... in {folder}")
    return dict(sorted(files.items()))


def _value(attr):
    kind = attr.WhichOneof("value")
    if kind is None:
        return None
    value = getattr(attr, kind)
    if kind.endswith("_list"):
        return list(value.values)
    if kind == "string_val" and attr.doc_string == "json":
        return json.loads(value)
    return value


def _attr(pb, name: str, value):
    a = pb.AttributeProto(name=name)
    if isinstance(value, bool):
        a.bool_val = value
    elif isinstance(value, int):
        a.int64_val = value
    elif isinstance(value, float):
        a.double_val = value
    elif isinstance(value, str):
        a.string_val = value
    else:
        a.string_val = json.dumps(value)
        a.doc_string = "json"
    return a


def read_chakra(prefix: str) -> tuple[dict[int, list], dict[int, dict]]:
    """{rank: [Node messages]}, {rank: GlobalMetadata attributes as a dict}."""
    pb, protolib = require_chakra()
    nodes, meta = {}, {}
    for rank, path in rank_files(prefix).items():
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise InputFileError(path, f"cannot read: {exc.strerror or exc}") from None
        stream = io.BytesIO(data)
        gm = pb.GlobalMetadata()
        try:
            if not protolib.decodeMessage(stream, gm):
                raise InputFileError(path, "empty: a Chakra trace starts with its GlobalMetadata")
            meta[rank] = {a.name: _value(a) for a in gm.attr}
            lst = []
            while True:
                n = pb.Node()
                at = stream.tell()
                if not protolib.decodeMessage(stream, n):
                    if at < len(data):
                        raise InputFileError(path, f"truncated or not a Chakra trace at byte {at}")
                    break
                lst.append(n)
        except Exception as exc:  # protobuf's DecodeError and friends
            if isinstance(exc, CmemuError):
                raise
            raise InputFileError(path, f"not a Chakra trace: {exc}") from None
        nodes[rank] = lst
    return nodes, meta


def chakra_to_doc(prefix: str, system: str | None = None) -> tuple[dict, Unmapped]:
    """A cmemu trace document from the Chakra ET files of ``prefix``."""
    pb, _ = require_chakra()
    by_rank, meta = read_chakra(prefix)
    unmapped = Unmapped()
    type_name = {v: k for k, v in TYPES.items()}
    groups, header = {}, {}
    for m in meta.values():
        if isinstance(m.get("cmemu.header"), dict):  # a cmemu export's header
            header = m["cmemu.header"]
            groups.update(header.get("groups", {}))
    all_ids = [n.id for lst in by_rank.values() for n in lst]
    unique = len(all_ids) == len(set(all_ids))
    nodes, pg_members = [], {}
    for rank, lst in by_rank.items():
        # ids unique over the files (cmemu's export): a dependency may name another rank's node
        offset = 0 if unique else (max(all_ids, default=0) + 1) * rank
        known = set(all_ids) if unique else {n.id for n in lst}
        streams = {}  # chakra id -> stream, for those without cmemu.stream
        last_on = {}  # stream -> the id last put on it
        for n in lst:
            kind = pb.NodeType.Name(n.type)
            attrs = {a.name: _value(a) for a in n.attr}
            if kind == "METADATA_NODE":
                unmapped.add("METADATA_NODE nodes (no work): skipped", n.name or str(n.id))
                continue
            ntype = type_name.get(kind)
            if ntype is None:
                raise InputFileError(rank_files(prefix)[rank], f"node {n.id}: node type {kind} cmemu cannot replay")
            node = {"id": n.id + offset, "name": n.name or f"{ntype.lower()}_{n.id}", "type": ntype, "rank": rank}
            implicit = attrs.pop("cmemu.stream_dep", None)  # cmemu's stream order, written as a dependency
            deps = {"data_deps": [d for d in n.data_deps if d in known],
                    "ctrl_deps": [d for d in n.ctrl_deps if d in known and d != implicit]}
            lost = [d for d in list(n.data_deps) + list(n.ctrl_deps) if d not in known]
            if lost:
                unmapped.add("dependencies on nodes that are not in the rank's file (other ranks', or METADATA): "
                             "dropped", f"{n.id} -> {lost[0]}")
            stream = attrs.pop("cmemu.stream", None)
            if stream is None:  # a chain: the stream of a predecessor that is its stream's last node
                preds = deps["data_deps"] + deps["ctrl_deps"]
                stream = next((streams[p] for p in preds if p in streams and last_on.get(streams[p]) == p),
                              len(last_on))
            streams[n.id], last_on[stream] = stream, n.id
            if stream:
                node["stream"] = int(stream)
            for k, v in deps.items():
                if v:
                    node[k] = [d + offset for d in v]
            node["attrs"] = _attrs_in(ntype, n, attrs, unmapped, pg_members, rank)
            if node["attrs"] is None:
                node["type"], node["attrs"] = "COMP", {"cmemu.duration_ns": float(n.duration_micros * 1000)}
            nodes.append(node)
    for name, ranks in pg_members.items():
        groups.setdefault(name, sorted(ranks))
    doc = {"schema": "cmemu.trace", "version": 1, "time_unit": "ns",
           "description": f"imported from the Chakra execution trace {Path(prefix).name} ({len(by_rank)} rank(s))"}
    doc.update({k: v for k, v in header.items() if k not in ("schema", "version", "time_unit", "nodes")})
    if system:
        doc["system"] = system
    if groups:
        doc["groups"] = groups
    doc["nodes"] = nodes
    return doc, unmapped


def _attrs_in(ntype, n, attrs, unmapped, pg_members, rank) -> dict | None:
    """A Chakra node's attributes as cmemu's; None for a node cmemu cannot map (a fixed COMP)."""
    pb, _ = require_chakra()
    out = {k: v for k, v in attrs.items() if k.startswith(("cmemu.", "x-")) and k != "cmemu.comm_type"}
    own = any(k.startswith("cmemu.") for k in attrs)  # written by cmemu: its attributes are exact
    for k in ("num_ops", "tensor_size", "comm_size", "comm_src", "comm_dst", "comm_tag"):
        if k in attrs and attrs[k] is not None:
            out[k] = int(attrs[k])
    if attrs.get("is_cpu_op"):
        unmapped.add("nodes marked is_cpu_op (cmemu models no host CPU): replayed on the NPU", n.name or str(n.id))
    if ntype == "COMP" and not own and (n.duration_micros or "num_ops" not in out):
        # another tool's: its measured time when it has one (as ASTRA-sim replays it), else its work
        out.pop("num_ops", None)
        out.pop("tensor_size", None)
        out["cmemu.duration_ns"] = float(n.duration_micros * 1000)
    elif ntype == "COMM_COLL":
        kind = attrs.get("cmemu.comm_type") or (pb.CollectiveCommType.Name(attrs["comm_type"])
                                                if isinstance(attrs.get("comm_type"), int) else None)
        if kind not in CHAKRA_COLL + ("MOE_DISPATCH", "MOE_COMBINE"):
            unmapped.add(f"COMM_COLL of type {kind} (no cmemu collective): kept as a fixed-time COMP",
                         n.name or str(n.id))
            return None
        out["comm_type"] = kind
        group = attrs.get("pg_name") or "world"
        out["cmemu.group"] = group
        pg_members.setdefault(group, set()).add(rank)
    return out


def trace_to_chakra(trace) -> dict[int, bytes]:
    """A loaded cmemu Trace as Chakra ET files' bytes, {rank: bytes} for every rank with nodes
    (the file of rank r is ``PREFIX.r.et``)."""
    pb, protolib = require_chakra()

    by_rank = {}
    for node in trace.nodes:
        by_rank.setdefault(node.rank, []).append(node)
    prev = {}  # (rank, stream) -> id of the last node
    messages = {}
    for rank, lst in sorted(by_rank.items()):
        out = []
        for node in lst:
            n = pb.Node(id=node.id, name=node.name, type=getattr(pb, TYPES[node.type]))
            n.data_deps.extend(node.data_deps)
            ctrl = list(node.ctrl_deps)
            before = prev.get((rank, node.stream))
            if before is not None and before not in ctrl and before not in node.data_deps:
                ctrl.append(before)  # stream order, made a dependency as Chakra has no streams
                n.attr.append(_attr(pb, "cmemu.stream_dep", before))
            prev[(rank, node.stream)] = node.id
            n.ctrl_deps.extend(ctrl)
            n.attr.append(_attr(pb, "cmemu.stream", node.stream))
            n.attr.append(pb.AttributeProto(name="is_cpu_op", bool_val=False))
            a = node.attrs
            if "cmemu.duration_ns" in a:
                n.duration_micros = int(round(a["cmemu.duration_ns"] / 1000))
            for k, v in a.items():
                if k in CHAKRA_ATTRS:
                    n.attr.append(pb.AttributeProto(name=k, **{CHAKRA_ATTRS[k]: int(v)}))
                elif k == "comm_type":
                    chakra_kind = v if v in CHAKRA_COLL else "ALL_TO_ALL"
                    n.attr.append(pb.AttributeProto(name="comm_type",
                                                    int64_val=pb.CollectiveCommType.Value(chakra_kind)))
                    if chakra_kind != v:
                        n.attr.append(_attr(pb, "cmemu.comm_type", v))
                elif k == "cmemu.group":
                    n.attr.append(pb.AttributeProto(name="pg_name", string_val=v))
                elif k.startswith(("cmemu.", "x-")):
                    n.attr.append(_attr(pb, k, v))
            out.append(n)
        messages[rank] = out
    files = {}
    for rank, out in messages.items():
        f = io.BytesIO()
        gm = pb.GlobalMetadata(version="0.0.4")
        gm.attr.append(pb.AttributeProto(name="schema", string_val="cmemu.trace v1 (exported by cmemu)"))
        gm.attr.append(pb.AttributeProto(name="rank", uint64_val=rank))
        gm.attr.append(_attr(pb, "cmemu.header", trace.header))  # groups, faults, system: read back
        protolib.encodeMessage(f, gm)
        for n in out:
            protolib.encodeMessage(f, n)
        files[rank] = f.getvalue()
    return files
