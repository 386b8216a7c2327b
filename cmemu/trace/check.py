"""Checking a trace and loading it: everything a single file can get wrong (fields, types, ranges,
references, message matching, dependency cycles, the header's fault schedule, names that can be
stored), with plain Python, one pass per node, so that 10^5 nodes check in a fraction of a
second; jsonschema (``schema/trace-v1.schema.json``, the shipped contract) is never used at run
time. What it leaves to the system (``node_check``, cmemu.lower.checks, called once per distinct
attributes when given): whether a preset has as many cores as ``cmemu.cores`` asks for, and what
an op costs.
``COMM_COLL`` nodes are collectives over a group of ranks named in the header's ``groups``: each
member has its own node, and the k-th collective of a group on one member goes with the k-th on
every other member.
"""
from __future__ import annotations

import json
import math

import numpy as np

from cmemu.errors import TraceError
from cmemu.trace.model import Trace, TraceGraph, make_node, pair_messages, with_stream_order
from cmemu.trace.read import gc_paused, number_text, read_trace, value_kind
from cmemu.trace.vocab import (
    COLL_ENGINES,
    COLL_TYPES,
    FAULT_KEYS,
    HEADER_KEYS,
    MAX_FAULT_NS,
    MAX_PS,
    MAX_STREAM,
    MOE_KERNELS,
    MOE_TYPES,
    NODE_KEYS,
    SCHEMA,
    VERSION,
)
from cmemu.units import MAX_TRACE_INT, ns_to_ps
from cmemu.vocab import COMP_DTYPES, COMP_OPS, COMP_SHAPE_ATTRS, COMP_UNITS, MEM_PLANES, NODE_TYPES, PLANES

_NODE_TYPE_SET = frozenset(NODE_TYPES)
_NODE_TYPE_OWN = {t: t for t in NODE_TYPES}  # the module's own string for each type (see _own)
# Chakra node types that cmemu knows of but cannot run yet: named in the error, not "unknown".
_NOT_YET = ()
# Attributes that must agree between the members of one collective.
_COLL_SHARED = ("comm_type", "comm_size", "cmemu.root", "cmemu.tokens", "cmemu.top_k", "cmemu.hidden",
                "cmemu.payload_bytes", "cmemu.experts", "cmemu.skew", "cmemu.seed", "cmemu.kernel")


def check_trace(doc, path, num_ranks: int, node_check=None) -> list[TraceError]:
    """Every problem of a parsed trace, in file order; an empty list means it is valid.

    ``num_ranks`` is the number of dies of the system the trace will run on. ``node_check``,
    when given, is called as ``node_check(type, attrs)`` once for each distinct set of checked
    attributes of a COMP or COMM_COLL node (the system's own checks: cores, the die model's
    limits; see ``cmemu.lower.checks``) and returns its problems as ``[(field, message)]``;
    each is reported on the first node with those attributes. Never raises for bad content
    (only ValueError for a bad ``num_ranks``, a caller's bug).
    """
    with gc_paused():
        return _check(doc, str(path), num_ranks, build=False, node_check=node_check)[0]


def load_trace(path, num_ranks: int, read=None, node_check=None) -> Trace:
    """Read and check a trace; raise its first TraceError (saying how many more there are).

    ``read`` is what ``read_trace(path)`` returned, for a caller that already read the file
    (to learn its ``system`` before knowing ``num_ranks``); ``node_check`` as for check_trace.
    """
    doc, sha256 = read if read is not None else read_trace(path)
    spath = str(path)
    with gc_paused():
        errors, nodes, graph = _check(doc, spath, num_ranks, build=True, node_check=node_check)
    if errors:
        first = errors[0]
        if len(errors) > 1:
            more = len(errors) - 1
            detail = f"{first.detail} (and {more} more problem{'s' if more > 1 else ''})"
            first = TraceError(first.path, detail, first.node_id, first.field)
        first.problems = errors  # every problem, for a caller that lists them (cmemu trace validate)
        raise first
    header = {k: v for k, v in doc.items() if k != "nodes"}
    trace = Trace(spath, sha256, header, nodes, header.get("system"))
    trace.__dict__["graph"] = graph  # Trace.graph, as it was built while checking
    return trace



def _own(v):
    """A copy of a scalar of the parsed document, for the loaded trace to keep.

    Python frees a block of small objects only when all of them are gone: one kept int or string
    of the document (an id, a name, an attribute) holds its whole block, and a trace whose nodes
    keep such values holds most of the document after it is dropped (900 MB for a 144 MB
    trace). Ints above 256 (Python shares the small ones), floats and strings are copied; the
    rest is kept as it is: None and booleans are shared, and 'x-' arrays and objects are rare
    (the header, parsed first, shares its few blocks with no node).
    """
    t = type(v)
    if t is int:
        return v + 0
    if t is float:
        return v * 1.0  # keeps -0.0
    if t is str:
        return (v + " ")[:-1]
    return v



def _bad_float(v: float) -> str | None:
    if v != v:
        return "NaN is not a number cmemu accepts"
    if v in (math.inf, -math.inf):
        return "Infinity is not a number cmemu accepts"
    if abs(v) > MAX_TRACE_INT:
        return f"{v!r} is too large (at most 2**53)"
    return None


def _as_int(v, lo: int):
    """``(int, None)`` for an integer >= lo (1024.0 counts, as in JSON Schema), else (None, msg)."""
    t = type(v)
    if t is int:
        if v > MAX_TRACE_INT:
            return None, f"{number_text(v)} is too large (at most 2**53)"
    elif t is float:
        msg = _bad_float(v)
        if msg:
            return None, msg
        if not v.is_integer():
            return None, f"expected an integer, got {v!r}"
        v = int(v)
    else:
        return None, f"expected an integer, got {value_kind(v)}"
    if v < lo:
        return None, f"must be >= {lo}, got {number_text(v)}"
    return v, None


def _as_number(v):
    """``(number, None)`` for a finite number >= 0, else (None, msg)."""
    t = type(v)
    if t is int:
        if v > MAX_TRACE_INT:
            return None, f"{number_text(v)} is too large (at most 2**53)"
    elif t is float:
        msg = _bad_float(v)
        if msg:
            return None, msg
    else:
        return None, f"expected a number, got {value_kind(v)}"
    if v < 0:
        return None, f"must be >= 0, got {number_text(v)}"
    return v, None


def _as_duration(v):
    v, msg = _as_number(v)
    if msg is None and ns_to_ps(v) > MAX_PS:
        return None, f"{v!r} ns is too large (at most 2**62 ps, about 53 days)"
    return v, msg


def _as_choice(choices):
    def check(v):
        if v in choices and type(v) is str:
            return v, None
        return None, f"must be one of {', '.join(choices)}; got {value_kind(v)}"

    return check


def _as_size(v):
    return _as_int(v, 0)


def _as_group_name(v):
    if type(v) is str and v:
        return v, None
    return None, f"must be the name of a group in the header's \"groups\", got {value_kind(v)}"


def _as_cores(v):
    return _as_int(v, 1)


# Per node type: attribute -> checker returning (value, None) or (None, message). Peer ranks
# (comm_dst, comm_src) are ints here; their range is checked against the node's rank afterwards.
_ATTR_CHECKS = {
    "COMP": {
        "cmemu.duration_ns": _as_duration,
        "num_ops": _as_number,
        "tensor_size": _as_size,
        "cmemu.unit": _as_choice(COMP_UNITS),
        "cmemu.dtype": _as_choice(COMP_DTYPES),
        "cmemu.cores": _as_cores,
        "cmemu.op": _as_choice(tuple(COMP_OPS)),
        **{key: _as_cores for key in COMP_SHAPE_ATTRS},  # shape sizes: integers >= 1
    },
    "COMM_SEND": {
        "comm_dst": _as_size,
        "comm_size": _as_size,
        "comm_tag": _as_size,
        "cmemu.plane": _as_choice(PLANES),
    },
    "COMM_RECV": {
        "comm_src": _as_size,
        "comm_size": _as_size,
        "comm_tag": _as_size,
        "cmemu.plane": _as_choice(PLANES),
    },
    # cmemu.src_cpu: a load from that CPU socket's DRAM (the EMS pool) over UB or the VPC plane.
    "MEM_LOAD": {"tensor_size": _as_size, "cmemu.src_cpu": _as_size, "cmemu.plane": _as_choice(MEM_PLANES)},
    "MEM_STORE": {"tensor_size": _as_size},
    "COMM_COLL": {
        "comm_type": _as_choice(COLL_TYPES),
        "comm_size": _as_size,
        "cmemu.group": _as_group_name,
        "cmemu.engine": _as_choice(COLL_ENGINES),
        "cmemu.kernel": _as_choice(MOE_KERNELS),
        "cmemu.cores": _as_cores,
        "cmemu.root": _as_size,
        "cmemu.tokens": _as_size,
        "cmemu.top_k": _as_cores,
        "cmemu.hidden": _as_cores,
        "cmemu.payload_bytes": _as_cores,
        "cmemu.experts": _as_cores,
        "cmemu.skew": _as_number,
        "cmemu.seed": _as_size,
    },
}
# The module's own string for each known attribute name (see _own).
_ATTR_KEY = {key: key for checks in _ATTR_CHECKS.values() for key in checks}
# Checkers of integer attributes and their lower bound, for the fast path of _check_attrs.
_INT_CHECKS = {_as_size: 0, _as_cores: 1}
_REQUIRED_ATTRS = {
    "COMP": (),  # num_ops or cmemu.duration_ns: checked on its own
    "COMM_SEND": ("comm_dst", "comm_size"),
    "COMM_RECV": ("comm_src", "comm_size"),
    "MEM_LOAD": ("tensor_size",),
    "MEM_STORE": ("tensor_size",),
    "COMM_COLL": ("comm_type", "cmemu.group"),
}
_DEFAULT_ATTRS = {
    "COMP": {"cmemu.unit": "aic"},
    "COMM_SEND": {"comm_tag": 0, "cmemu.plane": "ub"},
    "COMM_RECV": {"comm_tag": 0, "cmemu.plane": "ub"},
    "MEM_LOAD": {},
    "MEM_STORE": {},
    "COMM_COLL": {},
}
_COMM_PEER = {"COMM_SEND": "comm_dst", "COMM_RECV": "comm_src"}
# Node types whose attributes the system checks too (_check's node_check: cores, op sizes).
_SYSTEM_CHECKED = frozenset({"COMP", "COMM_COLL", "MEM_LOAD"})
# Only meaningful when a COMP's time is derived from its work (num_ops), not fixed.
_COMP_WORK_DEFAULTS = {"tensor_size": 0, "cmemu.dtype": "bf16"}


def _check(doc, path: str, num_ranks: int, build: bool, node_check=None):
    """Check a parsed trace: (errors in file order, nodes if build and no errors)."""
    if type(num_ranks) is not int or num_ranks < 1:
        raise ValueError(f"num_ranks must be a positive int, got {num_ranks!r}")
    found = []  # (index of the node in file order, -1 for the header; TraceError)

    def err(index, message, node_id=None, fld=None):
        if type(fld) is str and not fld.isprintable():
            fld = json.dumps(fld)[1:-1]  # a key with a line break or control character, escaped
        found.append((index, TraceError(path, message, node_id, fld)))

    def done(nodes, graph=None):
        found.sort(key=lambda e: e[0])  # stable: within one node, fields stay in check order
        errors = [e for _, e in found]
        if build and not errors:
            return errors, nodes, graph
        return errors, None, None

    if type(doc) is not dict:
        err(-1, f"the top level must be an object (the header with its nodes), got {value_kind(doc)}")
        return done(None)
    _check_header(doc, err)
    nodes_in = doc.get("nodes")
    if nodes_in is None and "nodes" not in doc:
        err(-1, "missing: the trace needs a list of nodes", fld="nodes")
        return done(None)
    if type(nodes_in) is not list:
        err(-1, f"must be an array of node objects, got {value_kind(nodes_in)}", fld="nodes")
        return done(None)

    n = len(nodes_in)
    # Pass 1: ids, so that a node may depend on one written after it.
    ids = [None] * n  # id of each node with a valid id, first occurrence only
    labels = [None] * n  # any valid id, duplicates too: what errors about the node name
    index_of = {}
    for i, nd in enumerate(nodes_in):
        if type(nd) is not dict:
            err(i, f"nodes[{i}] must be an object, got {value_kind(nd)}")
            continue
        nid = nd.get("id")
        if type(nid) is not int or not 0 <= nid <= MAX_TRACE_INT:
            nid, msg = _as_int(nid, 0) if "id" in nd else (None, "missing: every node needs an id")
            if msg:
                err(i, f"nodes[{i}]: {msg}", fld="id")
                continue
        labels[i] = nid
        first = index_of.get(nid)
        if first is not None:
            err(i, f"duplicate id: nodes[{first}] already has id {nid}", nid, "id")
            continue
        index_of[nid] = i
        ids[i] = nid + 0  # the trace's own int, not the document's (see _own)

    # Pass 2: fields of each node. Graph data is kept by file index for the cycle check.
    out_nodes = [] if build else None
    # Dependencies as flat lists of (pred, succ) file indices, node after node, each node's in
    # its own order (valid ones, of nodes with a valid id).
    data_pred, data_succ, ctrl_pred, ctrl_succ = [], [], [], []
    dep_lists = {"data_deps": (data_pred, data_succ), "ctrl_deps": (ctrl_pred, ctrl_succ)}
    data_pred_add, data_succ_add = data_pred.append, data_succ.append
    node_rank = [-1] * n  # rank and stream when both are valid and the id is, else -1
    node_stream = [-1] * n
    msgs = []  # (is_send, index, src, dst, tag) for message matching
    msg_info = {}  # index -> (size, plane)
    colls = []  # (index, rank, attrs) of COMM_COLL nodes
    groups = _check_groups(doc.get("groups"), num_ranks, err) if "groups" in doc else {}
    forward = False  # some dependency names a node later in the file
    node_keys = NODE_KEYS
    no_deps = ()
    # Many nodes repeat a name (one per rank) and attributes (one operator shape): the nodes keep
    # one string and one checked attrs dict for each, as the lowering's per-shape costs expect.
    shared_names = {}
    # (type, raw items, their value types) -> [attrs, the last raw dict found], for attrs without
    # problems. A generated document shares one raw dict among the nodes of one op shape (one per
    # die: cmemu.models.step): a raw dict found twice in a row is kept in same_raw, id(raw) ->
    # (raw, type, attrs), which finds it again without the key (whose tuples took 0.5 s of the
    # 61-layer decode step's check). A file's nodes share none: same_raw stays empty. An entry
    # holds its raw dict, so that its id stays its own.
    shared_attrs = {}
    same_raw = {}
    checked = {}  # id(attrs) -> [first node's index, label, prefix, nodes, attrs, node_check's problems]
    own_int = {}.setdefault  # the trace's own copy of each rank and stream (see _own)
    new_node = make_node
    for i, nd in enumerate(nodes_in):
        if type(nd) is not dict:
            continue
        nid = ids[i]
        label = labels[i]
        pre = "" if label is not None else f"nodes[{i}]: "
        get = nd.get
        # The common case of each field is tested inline; helpers only run to explain a problem.

        if not nd.keys() <= node_keys:
            for k in nd:
                if k not in node_keys and not (type(k) is str and k.startswith("x-")):
                    err(i, f"{pre}unknown field (node fields: {', '.join(sorted(node_keys))}; "
                        "'x-' fields are kept and ignored)", label, k)

        ntype = get("type")
        type_ok = type(ntype) is str and ntype in _NODE_TYPE_SET
        if not type_ok:
            if "type" not in nd:
                msg = f"missing; one of {', '.join(NODE_TYPES)}"
            elif ntype in _NOT_YET:
                msg = f"{ntype} is a Chakra node type cmemu does not support in trace v1 yet; " \
                      "write the collective as COMM_SEND/COMM_RECV nodes"
            else:
                msg = f"unknown type {value_kind(ntype)}; one of {', '.join(NODE_TYPES)}"
            err(i, pre + msg, label, "type")

        name = get("name")
        if name is None and "name" not in nd:
            if build and type_ok:
                name = f"{ntype.lower()}_{label}"
        elif type(name) is not str or not name:
            err(i, f"{pre}must be a non-empty string, got {value_kind(name)}", label, "name")
        elif name not in shared_names and _unstorable(name):
            err(i, f"{pre}{_unstorable(name)}", label, "name")
        elif build:
            shared = shared_names.get(name)
            name = shared_names[name] = _own(name) if shared is None else shared
        else:
            shared_names[name] = name  # checked: the next node with this name is not checked again

        rank = get("rank")
        if type(rank) is not int or not 0 <= rank < num_ranks:
            rank, msg = _as_int(rank, 0) if "rank" in nd else (None, "missing: every node "
                                                                "needs a rank (a die index)")
            if msg is None and rank >= num_ranks:
                rank, msg = None, f"rank {rank} is outside the system: ranks are die " \
                                  f"indices 0..{num_ranks - 1}"
            if msg:
                err(i, pre + msg, label, "rank")

        stream = get("stream", 0)
        if type(stream) is not int or not 0 <= stream <= MAX_STREAM:
            stream, msg = _as_int(stream, 0)
            if msg is None and stream > MAX_STREAM:
                stream, msg = None, f"{number_text(stream)} is too large (at most 2**31 - 1)"
            if msg:
                err(i, pre + msg, label, "stream")

        data_deps = get("data_deps", no_deps)
        ctrl_deps = get("ctrl_deps", no_deps)
        if (ctrl_deps is no_deps and type(data_deps) is list and len(data_deps) == 1
                and type(data_deps[0]) is int and index_of.get(data_deps[0], i) != i):
            # The common case, one dependency on another node, without the loop below.
            j = index_of[data_deps[0]]
            forward = forward or j > i
            if nid is not None:
                data_pred_add(j)
                data_succ_add(i)
            data_deps = (ids[j],)
        elif data_deps or ctrl_deps:
            deps_out = []
            for fld, raw in (("data_deps", data_deps), ("ctrl_deps", ctrl_deps)):
                if type(raw) is not list:
                    if raw is not no_deps:
                        err(i, f"{pre}must be an array of node ids, got {value_kind(raw)}", label, fld)
                    deps_out.append(no_deps)
                    continue
                good = []
                missing = []
                for d in raw:
                    if type(d) is not int:
                        d, msg = _as_int(d, 0)
                        if msg:
                            err(i, f"{pre}{msg}", label, fld)
                            continue
                    j = index_of.get(d)
                    if j is None:
                        missing.append(d)
                    elif j == i:
                        err(i, f"{pre}node {d} depends on itself", label, fld)
                    else:
                        good.append(ids[j])  # the id's own int object, not a copy per dep
                        if j > i:
                            forward = True
                if missing:
                    missing = list(dict.fromkeys(missing))
                    shown = ", ".join(map(str, missing[:5])) + (", ..." if len(missing) > 5
                                                                else "")
                    err(i, f"{pre}no node with id {shown}", label, fld)
                if len(good) > 1:
                    good = list(dict.fromkeys(good))
                if good and nid is not None:
                    preds, succs = dep_lists[fld]
                    preds.extend(index_of[d] for d in good)
                    succs.extend([i] * len(good))
                deps_out.append(tuple(good))
            data_deps, ctrl_deps = deps_out
        elif data_deps is not no_deps or ctrl_deps is not no_deps:
            for fld, raw in (("data_deps", data_deps), ("ctrl_deps", ctrl_deps)):
                if raw is not no_deps and type(raw) is not list:
                    err(i, f"{pre}must be an array of node ids, got {value_kind(raw)}", label, fld)
            data_deps = ctrl_deps = no_deps

        raw_attrs = get("attrs", no_deps)
        attrs = None
        if type(raw_attrs) is not dict:
            if raw_attrs is no_deps:
                raw_attrs = {}
            else:
                err(i, f"{pre}must be an object, got {value_kind(raw_attrs)}", label, "attrs")
                raw_attrs = None
        if type_ok and raw_attrs is not None:
            # A message's attributes are checked against its rank; other nodes' only against
            # themselves. The value types are in the key: 1, 1.0 and true are equal in a tuple.
            key = None
            same = same_raw.get(id(raw_attrs))
            if same is not None and same[0] is raw_attrs and same[1] == ntype:
                attrs = same[2]
            elif ntype not in _COMM_PEER:
                key = (ntype, tuple(raw_attrs.items()), tuple(map(type, raw_attrs.values())))
                try:
                    shared = shared_attrs.get(key)
                except TypeError:  # an unhashable value (an 'x-' array or object)
                    key = shared = None
                if shared is not None:
                    attrs = shared[0]
                    if shared[1] is raw_attrs:
                        same_raw[id(raw_attrs)] = (raw_attrs, ntype, attrs)
                    else:
                        shared[1] = raw_attrs
            attrs_ok = True
            if attrs is None:
                before = len(found)
                attrs = _check_attrs(ntype, raw_attrs, rank, num_ranks, i, label, pre, err)
                attrs_ok = len(found) == before
                if key is not None and attrs_ok:
                    shared_attrs[key] = [attrs, raw_attrs]
            if node_check is not None and attrs_ok and ntype in _SYSTEM_CHECKED:
                seen = checked.get(id(attrs))
                if seen is None:  # once per attrs dict (kept in the entry, so its id stays its own)
                    checked[id(attrs)] = [i, label, pre, 1, attrs, node_check(ntype, attrs)]
                else:
                    seen[3] += 1

        if nid is not None and rank is not None and stream is not None:
            node_rank[i] = rank
            node_stream[i] = stream
            peer_key = _COMM_PEER.get(ntype) if type_ok else None  # ntype may be unhashable
            if peer_key is not None and attrs is not None:
                peer = attrs.get(peer_key)
                tag = attrs.get("comm_tag")
                size = attrs.get("comm_size")
                plane = attrs.get("cmemu.plane")
                # A message with a valid channel is matched even if its size or plane is wrong,
                # so that its partner gets no second error.
                if peer is not None and tag is not None:
                    if peer_key == "comm_dst":
                        msgs.append((True, i, rank, peer, tag))
                    else:
                        msgs.append((False, i, peer, rank, tag))
                    msg_info[i] = (size, plane)

        if ntype == "COMM_COLL" and attrs is not None and nid is not None and rank is not None:
            colls.append((i, rank, attrs))

        if build and not found:
            out_nodes.append(new_node(nid, name, _NODE_TYPE_OWN[ntype], own_int(rank, rank + 0),
                                      own_int(stream, stream + 0), data_deps, ctrl_deps, attrs))

    for i, label, pre, count, _attrs, problems in checked.values():
        more = f" (and {count - 1:,} more node{'s' if count > 2 else ''} with these attributes)" if count > 1 else ""
        for fld, message in problems:
            err(i, f"{pre}{message}{more}", label, fld)
    pairs = _check_messages(msgs, msg_info, ids, err)
    instances = _check_collectives(colls, groups, ids, err)
    graph = TraceGraph(
        id=np.array([-1 if k is None else k for k in ids] if None in ids else ids, dtype=np.int64),
        rank=np.array(node_rank, dtype=np.int32), stream=np.array(node_stream, dtype=np.int32),
        data_pred=np.array(data_pred, dtype=np.int32), data_succ=np.array(data_succ, dtype=np.int32),
        ctrl_pred=np.array(ctrl_pred, dtype=np.int32), ctrl_succ=np.array(ctrl_succ, dtype=np.int32),
        stream_pred=None, messages=np.array(pairs, dtype=np.int64).reshape(-1, 2), collectives=instances)
    graph = with_stream_order(graph)
    _check_cycles(ids, graph, forward, err)
    return done(out_nodes, graph)


def _check_groups(raw, num_ranks: int, err) -> dict:
    """The header's groups: name -> tuple of distinct ranks (at least two)."""
    if type(raw) is not dict:
        err(-1, f"must be an object of group name -> list of ranks, got {value_kind(raw)}", fld="groups")
        return {}
    out = {}
    for name, ranks in raw.items():
        if type(ranks) is not list or len(ranks) < 2:
            err(-1, f"group '{name}' must be a list of at least two ranks, got {value_kind(ranks)}", fld="groups")
            continue
        bad = [r for r in ranks if type(r) is not int or not 0 <= r < num_ranks]
        if bad:
            err(-1, f"group '{name}': {value_kind(bad[0])} is not a rank of the system (0..{num_ranks - 1})",
                fld="groups")
            continue
        if len(set(ranks)) != len(ranks):
            err(-1, f"group '{name}' names a rank twice", fld="groups")
            continue
        out[name] = tuple(ranks)
    return out


def _check_collectives(colls, groups, ids, err) -> list:
    """Match each group's k-th COMM_COLL on every member; returns the instances (file indices)."""
    per_group = {}  # group -> rank -> [indices in file order]
    member_sets = {name: frozenset(ranks) for name, ranks in groups.items()}
    for i, rank, attrs in colls:
        name = attrs.get("cmemu.group")
        if name is None:
            continue
        if name not in groups:
            known = ", ".join(sorted(groups)) or "none defined"
            err(i, f"no group '{name}' in the header's groups ({known})", ids[i], "cmemu.group")
            continue
        if rank not in member_sets[name]:
            err(i, f"rank {rank} is not a member of group '{name}'", ids[i], "cmemu.group")
            continue
        ctype = attrs.get("comm_type")
        if ctype in MOE_TYPES:
            for key in ("cmemu.tokens", "cmemu.top_k", "cmemu.hidden"):
                if key not in attrs:
                    err(i, f"{ctype} needs {key}", ids[i], key)
        elif ctype is not None and "comm_size" not in attrs:
            err(i, f"{ctype} needs comm_size (bytes)", ids[i], "comm_size")
        if ctype == "BROADCAST" and attrs.get("cmemu.root", groups[name][0]) not in member_sets[name]:
            err(i, f"cmemu.root {attrs['cmemu.root']} is not a member of group '{name}'", ids[i], "cmemu.root")
        if ctype in MOE_TYPES and attrs.get("cmemu.top_k", 1) > attrs.get("cmemu.experts", len(groups[name])):
            err(i, "cmemu.top_k is larger than the number of experts", ids[i], "cmemu.top_k")
        if ctype in MOE_TYPES and attrs.get("cmemu.experts", len(groups[name])) % len(groups[name]):
            err(i, f"cmemu.experts ({attrs['cmemu.experts']}) must be a multiple of the group's {len(groups[name])} "
                "members: each holds as many, in contiguous blocks (expert e on member e // (experts / members))",
                ids[i], "cmemu.experts")
        per_group.setdefault(name, {}).setdefault(rank, []).append(i)
    instances = []
    for name, by_rank in per_group.items():
        counts = {r: len(by_rank.get(r, ())) for r in groups[name]}
        most = max(counts.values())
        for r, c in counts.items():
            if c < most:
                first = by_rank[next(q for q in groups[name] if counts[q] == most)][c]
                err(first, f"group '{name}': rank {r} has {c} COMM_COLL node(s) in this group, other members "
                    f"have {most}; every member needs its own node for each collective", ids[first], "cmemu.group")
        for k in range(min(counts.values())):
            inst = [by_rank[r][k] for r in groups[name]]
            instances.append(inst)
    by_index = {i: attrs for i, _rank, attrs in colls}
    for inst in instances:
        ref = by_index[inst[0]]
        for i in inst[1:]:
            if by_index[i] is ref:
                continue  # equal attributes share one dict (see _check)
            for key in _COLL_SHARED:
                if by_index[i].get(key) != ref.get(key):
                    err(i, f"{key} differs from node {ids[inst[0]]}, another member of the same collective",
                        ids[i], key)
                    break
    return instances


def _check_header(doc: dict, err) -> None:
    if doc.get("schema") != SCHEMA or type(doc.get("schema")) is not str:
        got = value_kind(doc["schema"]) if "schema" in doc else "nothing"
        err(-1, f"must be \"{SCHEMA}\", got {got}", fld="schema")
    version = doc.get("version")
    if "version" not in doc:
        err(-1, f"missing; this cmemu reads version {VERSION}", fld="version")
    elif version != VERSION or type(version) not in (int, float):
        shown = number_text(version) if type(version) in (int, float) else value_kind(version)
        err(-1, f"unsupported trace version {shown}; this cmemu reads version {VERSION}",
            fld="version")
    if doc.get("time_unit") != "ns" or type(doc.get("time_unit")) is not str:
        got = value_kind(doc["time_unit"]) if "time_unit" in doc else "nothing"
        err(-1, f"must be \"ns\" (every time in a v1 trace is in nanoseconds), got {got}",
            fld="time_unit")
    for key in ("system", "description"):
        if key in doc and (type(doc[key]) is not str or not doc[key]):
            err(-1, f"must be a non-empty string, got {value_kind(doc[key])}", fld=key)
    if "cmemu.faults" in doc:
        _check_faults(doc["cmemu.faults"], err)
    for key in doc:
        if key not in HEADER_KEYS and not (
            type(key) is str and (key.startswith("x-") or key.startswith("cmemu."))
        ):
            err(-1, f"unknown header field (header fields: {', '.join(sorted(HEADER_KEYS))}; "
                "'x-' and 'cmemu.' fields are kept)", fld=key)



def _check_faults(raw, err) -> None:
    """The header's ``cmemu.faults``: a list of {"fail": PART, "at_ns": TIME}. Whether each PART
    names a part of the system is checked against the topology (cmemu.run.pipeline.trace_failures)."""
    fld = "cmemu.faults"
    if type(raw) is not list:
        err(-1, f"must be a list of {{\"fail\": PART, \"at_ns\": TIME}} objects (PART as --fail names it: "
            f"link:ID, l1:NODE.PLANE, l2:PLANE.CHIP or die:ID), got {value_kind(raw)}", fld=fld)
        return
    for k, entry in enumerate(raw):
        where = f"{fld}[{k}]"
        if type(entry) is not dict:
            err(-1, f"must be {{\"fail\": PART, \"at_ns\": TIME}}, got {value_kind(entry)}", fld=where)
            continue
        for key in entry:
            if key not in FAULT_KEYS and not (type(key) is str and key.startswith("x-")):
                err(-1, f"unknown key {value_kind(key)} (an entry holds fail and at_ns; 'x-' keys are kept and "
                    "ignored)", fld=where)
        part = entry.get("fail")
        if type(part) is not str or not part:
            got = value_kind(part) if "fail" in entry else "nothing"
            err(-1, f"must name a part as --fail does (link:ID, l1:NODE.PLANE, l2:PLANE.CHIP or die:ID), "
                f"got {got}", fld=f"{where}.fail")
        at = entry.get("at_ns", 0)
        if type(at) not in (int, float) or not 0 <= at < MAX_FAULT_NS:
            err(-1, f"at_ns must be a time in ns >= 0 and below 2**52 (when the part fails; 0: from the start), "
                f"got {value_kind(at)}", fld=f"{where}.at_ns")


def _unstorable(name: str) -> str | None:
    """Why a name cannot be stored as text (HDF5 strings end at a NUL; UTF-8 cannot hold a lone
    surrogate, which is no character at all), or None."""
    if name.isascii():
        return None if "\0" not in name else "holds a NUL character (U+0000), which an HDF5 string cannot hold"
    if "\0" in name:
        return "holds a NUL character (U+0000), which an HDF5 string cannot hold"
    try:
        name.encode("utf-8")
    except UnicodeEncodeError as exc:
        return f"holds a lone surrogate (U+{ord(name[exc.start]):04X}), which is not Unicode text"
    return None


def _check_attrs(ntype, raw, rank, num_ranks, i, label, pre, err):
    """Attrs with defaults filled in; a wrong attribute is reported and left out."""
    checks = _ATTR_CHECKS[ntype]
    attrs = dict(_DEFAULT_ATTRS[ntype])
    for key, value in raw.items():
        check = checks.get(key)
        if type(value) is int and check in _INT_CHECKS and _INT_CHECKS[check] <= value <= MAX_TRACE_INT:
            attrs[key] = value  # the common case, without a call
            continue
        if check is None:
            if type(key) is str and key.startswith("x-"):
                attrs[key] = value
                continue
            err(i, f"{pre}unknown attribute for {ntype} (known: {', '.join(checks)}; "
                "'x-' attributes are kept and ignored)", label, key)
            continue
        value, msg = check(value)
        if msg:
            err(i, pre + msg, label, key)
        else:
            attrs[key] = value
    for key in _REQUIRED_ATTRS[ntype]:
        if key not in raw:
            err(i, f"{pre}missing: a {ntype} node needs attrs.{key}", label, key)
    if ntype == "MEM_LOAD" and "cmemu.plane" in raw and "cmemu.src_cpu" not in raw:
        err(i, f"{pre}only applies with cmemu.src_cpu (a load from a CPU's memory); a load from the die's own "
            "HBM crosses no network", label, "cmemu.plane")
    if ntype == "COMP":
        has_time = "cmemu.duration_ns" in raw
        op = attrs.get("cmemu.op")
        if op is not None:
            _check_comp_op(op, raw, attrs, i, label, pre, err)
        elif "cmemu.op" not in raw and any(k in raw for k in COMP_SHAPE_ATTRS):
            key = next(k for k in raw if k in COMP_SHAPE_ATTRS)
            err(i, f"{pre}only applies with cmemu.op (an operator with a shape)", label, key)
        if "cmemu.op" in raw:
            pass
        elif "num_ops" in raw:
            if has_time:
                err(i, f"{pre}give either cmemu.duration_ns (a fixed time) or num_ops (work to "
                    "time on the unit), not both", label, "cmemu.duration_ns")
            for key, default in _COMP_WORK_DEFAULTS.items():
                attrs.setdefault(key, default)
        elif has_time:
            for key in _COMP_WORK_DEFAULTS:
                if key in raw:
                    err(i, f"{pre}only applies with num_ops; a COMP with cmemu.duration_ns takes "
                        "exactly that time", label, key)
        else:
            err(i, f"{pre}missing: a COMP node needs num_ops (operations) or cmemu.duration_ns",
                label, "num_ops")
    elif ntype in ("COMM_SEND", "COMM_RECV"):
        key = "comm_dst" if ntype == "COMM_SEND" else "comm_src"
        peer = attrs.get(key)
        if peer is not None:
            if peer >= num_ranks or peer == rank:
                del attrs[key]
            if peer >= num_ranks:
                err(i, f"{pre}rank {peer} is outside the system: ranks are die indices "
                    f"0..{num_ranks - 1}", label, key)
            elif peer == rank:
                err(i, f"{pre}a message to its own rank {rank}; use MEM_LOAD/MEM_STORE for local "
                    "copies", label, key)
    return {_ATTR_KEY.get(k) or _own(k): _own(v) for k, v in attrs.items()}  # see _own


def _check_comp_op(op, raw, attrs, i, label, pre, err) -> None:
    """A COMP with cmemu.op: its shape, and nothing that gives its work another way. A
    ``cmemu.duration_ns`` beside it is the op's measured time (an imported profile): replayed as
    given, and ``cmemu run --retime`` times the op by its shape instead."""
    unit, required, optional = COMP_OPS[op]
    for key in ("num_ops", "tensor_size"):
        if key in raw:
            err(i, f"{pre}not with cmemu.op: the operator's work and traffic come from its shape", label, key)
    for key in required:
        if key not in raw:
            err(i, f"{pre}missing: cmemu.op \"{op}\" needs attrs.{key}", label, key)
    allowed = set(required) | set(optional)
    for key in raw:
        if key in COMP_SHAPE_ATTRS and key not in allowed:
            err(i, f"{pre}does not apply to cmemu.op \"{op}\" (its shape: "
                f"{', '.join(required + optional)})", label, key)
    if op in ("mla_prefill_attention", "gqa_prefill_attention"):
        tokens, kv_len = raw.get("cmemu.tokens"), raw.get("cmemu.kv_len")
        if isinstance(tokens, int) and isinstance(kv_len, int) and kv_len < tokens:
            err(i, f"{pre}{kv_len} is fewer than cmemu.tokens ({tokens}): the queries are the last "
                "cmemu.tokens of the cmemu.kv_len positions", label, "cmemu.kv_len")
    if op in ("gqa_attention", "gqa_prefill_attention"):
        heads, kv_heads = raw.get("cmemu.heads"), raw.get("cmemu.kv_heads")
        if isinstance(heads, int) and isinstance(kv_heads, int) and kv_heads >= 1 and heads % kv_heads:
            err(i, f"{pre}cmemu.heads ({heads}) is not a multiple of it ({kv_heads}): each K/V head serves a whole "
                "group of query heads", label, "cmemu.kv_heads")
    if op in ("mla_decode", "mla_attention", "gqa_attention"):
        tokens, per = raw.get("cmemu.tokens"), raw.get("cmemu.queries_per_request")
        if isinstance(tokens, int) and isinstance(per, int) and per >= 1 and tokens % per:
            err(i, f"{pre}cmemu.tokens ({tokens}) is not a whole number of requests of {per} queries: make it a "
                "multiple of cmemu.queries_per_request", label, "cmemu.queries_per_request")
    if "cmemu.unit" in raw and raw["cmemu.unit"] != unit:
        err(i, f"{pre}cmemu.op \"{op}\" runs on {unit}; leave cmemu.unit out", label, "cmemu.unit")
    attrs["cmemu.unit"] = unit
    attrs.setdefault("cmemu.dtype", "bf16")


def _check_messages(msgs, msg_info, ids, err) -> list[tuple[int, int]]:
    """Report unmatched and inconsistent messages; return the (send, recv) index pairs, in the
    sends' file order."""
    pairs, lone_sends, lone_recvs = pair_messages(msgs)
    for _, i, src, dst, tag in lone_sends:
        err(i, f"no matching COMM_RECV on rank {dst} with comm_src {src} and comm_tag {tag}",
            ids[i], "comm_dst")
    for _, i, src, dst, tag in lone_recvs:
        err(i, f"no matching COMM_SEND from rank {src} with comm_tag {tag}", ids[i], "comm_src")
    for s, r in pairs:
        s_size, s_plane = msg_info[s]
        r_size, r_plane = msg_info[r]
        if s_size != r_size and s_size is not None and r_size is not None:
            err(r, f"comm_size {r_size} differs from comm_size {s_size} of the matching "
                f"COMM_SEND {ids[s]}", ids[r], "comm_size")
        if s_plane != r_plane and s_plane is not None and r_plane is not None:
            err(r, f"plane '{r_plane}' differs from plane '{s_plane}' of the matching "
                f"COMM_SEND {ids[s]}", ids[r], "cmemu.plane")
    return pairs


def _members_lead_forward(graph) -> bool:
    """Whether every edge from a collective's member (data, control, stream; messages never
    leave one) goes to a node after the collective's last member."""
    n = graph.id.shape[0]
    place = np.arange(n)  # where each node stands in the order: a member at its last member
    for inst in graph.collectives:
        place[inst] = max(inst)
    after = graph.stream_pred >= 0
    return bool(np.all(graph.data_succ > place[graph.data_pred]) and np.all(graph.ctrl_succ > place[graph.ctrl_pred])
                and np.all(np.flatnonzero(after) > place[graph.stream_pred[after]]))


# A dependency cycle's error names at most this many nodes at each end, and this many notes.
CYCLE_SHOWN = 5


def _check_cycles(ids, graph, forward, err) -> None:
    """Find a cycle over data_deps, ctrl_deps, stream order and messages (Kahn, no recursion).

    A receive waits for its send (its data cannot arrive before the send starts), so a receive
    that waits, directly or not, for its own send is a cycle too. The members of one collective
    wait for each other: none can end before every member could start, so they count as one.
    """
    instances = graph.collectives
    pairs = graph.messages
    if not forward and np.all(pairs[:, 0] < pairs[:, 1]):
        # Every edge points back in the file: the file order is a topological order. With
        # collectives, each counts as one node placed at its last member: the order stays
        # topological if no edge leaves a member for a node at or before that place.
        if not instances or _members_lead_forward(graph):
            return

    n = len(ids)
    recv_send = dict(zip(pairs[:, 1].tolist(), pairs[:, 0].tolist()))
    member_of = {}
    for k, inst in enumerate(instances):
        for i in inst:
            member_of[i] = k
    data_idx, ctrl_idx = [None] * n, [None] * n
    for idx, preds_of, succs_of in ((data_idx, graph.data_pred, graph.data_succ),
                                    (ctrl_idx, graph.ctrl_pred, graph.ctrl_succ)):
        for j, i in zip(preds_of.tolist(), succs_of.tolist()):
            if idx[i] is None:
                idx[i] = []
            idx[i].append(j)
    stream_pred = [None if p < 0 else p for p in graph.stream_pred.tolist()]

    def preds(i):
        """(predecessor index, field of the edge) of node i."""
        out = [(j, "data_deps") for j in data_idx[i] or ()]
        out += [(j, "ctrl_deps") for j in ctrl_idx[i] or ()]
        if stream_pred[i] is not None:
            out.append((stream_pred[i], "stream"))
        if i in recv_send:
            out.append((recv_send[i], "comm_src"))
        if i in member_of:
            out += [(j, "cmemu.group") for j in instances[member_of[i]] if j != i]
        return out

    indeg = [0] * n
    succ = [[] for _ in range(n)]
    for i in range(n):
        for lst in (data_idx[i], ctrl_idx[i]):
            if lst:
                for j in lst:
                    succ[j].append(i)
                indeg[i] += len(lst)
        if stream_pred[i] is not None:
            succ[stream_pred[i]].append(i)
            indeg[i] += 1
    for r, s in recv_send.items():
        succ[s].append(r)
        indeg[r] += 1
    # A collective's members become ready together, once each of them has no predecessor left.
    waiting = [0] * len(instances)

    def release(i, ready):
        k = member_of.get(i)
        if k is None:
            ready.append(i)
            return
        waiting[k] += 1
        if waiting[k] == len(instances[k]):
            ready.extend(instances[k])

    ready = []
    for i in range(n):
        if indeg[i] == 0:
            release(i, ready)
    done = 0
    while ready:
        i = ready.pop()
        done += 1
        for j in succ[i]:
            indeg[j] -= 1
            if indeg[j] == 0:
                release(j, ready)
    if done == n:
        return
    # A member waiting only for its fellow members is still blocked: count it as such below.
    for k, inst in enumerate(instances):
        if waiting[k] < len(inst):
            for i in inst:
                if indeg[i] == 0:
                    indeg[i] = 1

    # Every node left has a predecessor left: walk back along them until a node repeats.
    blocked = sum(1 for d in indeg if d > 0)
    at = {}
    walk = []
    i = next(k for k in range(n) if indeg[k] > 0)
    while i not in at:
        at[i] = len(walk)
        j, fld = next((j, f) for j, f in preds(i) if indeg[j] > 0)
        walk.append((i, fld))
        i = j
    cycle = walk[at[i]:]
    low = min(range(len(cycle)), key=lambda k: ids[cycle[k][0]])
    cycle = cycle[low:] + cycle[:low]
    if len(cycle) <= 2 * CYCLE_SHOWN:
        path = " -> ".join(str(ids[k]) for k, _ in cycle) + f" -> {ids[cycle[0][0]]}"
    else:  # a long cycle: its first and last few nodes (a line of a million ids helps nobody)
        head = " -> ".join(str(ids[k]) for k, _ in cycle[:CYCLE_SHOWN])
        tail = " -> ".join(str(ids[k]) for k, _ in cycle[-CYCLE_SHOWN:])
        path = f"{head} -> ... ({len(cycle) - 2 * CYCLE_SHOWN:,} more) ... -> {tail} -> {ids[cycle[0][0]]}"
    notes = []
    for pos, (k, fld) in enumerate(cycle):
        if len(notes) >= CYCLE_SHOWN:
            break
        nxt = cycle[(pos + 1) % len(cycle)][0]
        if fld == "stream":
            rank, stream = int(graph.rank[k]), int(graph.stream[k])
            notes.append(f"{ids[k]} -> {ids[nxt]} is stream order: {ids[k]} comes after "
                         f"{ids[nxt]} on rank {rank} stream {stream}")
        elif fld == "comm_src":
            notes.append(f"{ids[k]} -> {ids[nxt]} is a message: COMM_RECV {ids[k]} waits for "
                         f"COMM_SEND {ids[nxt]}")
        elif fld == "cmemu.group":
            notes.append(f"{ids[k]} -> {ids[nxt]} is a collective: {ids[k]} and {ids[nxt]} are "
                         "members of one COMM_COLL and wait for each other")
    size = f"a cycle of {len(cycle):,} nodes; " if len(cycle) > 2 * CYCLE_SHOWN else ""
    message = f"dependency cycle: {path} ({size}a -> b: a waits for b)"
    if notes:
        message += "; " + "; ".join(notes)
    if blocked > len(cycle):
        message += f"; {blocked} nodes in all can never run"
    first, fld = cycle[0]
    err(first, message, ids[first], fld)
