"""Trace IR v1: reading, checking and loading cmemu's native operator trace.

A trace is a JSON document (or JSONL, one node per line) in the spirit of MLCommons Chakra: a
header and a list of nodes, each a compute op, one side of a point-to-point message, or a memory
transfer, placed on a rank (a die of the system) and a stream. docs/trace-format.md is the
reference; ``schema/trace-v1.schema.json`` is the shipped contract for what one file may hold.

This module checks everything a single file can get wrong (fields, types, ranges, references,
message matching, dependency cycles, the header's fault schedule, names that can be stored) with
plain Python, one pass per node, so that 10^5 nodes check in a fraction of a second; jsonschema is
never used at run time. What it leaves to the system (``node_check``, cmemu.lower.checks, called
once per distinct attributes when given): whether a preset has as many cores as ``cmemu.cores``
asks for, and what an op costs.
``COMM_COLL`` nodes are collectives over a group of ranks named in the header's ``groups``: each
member has its own node, and the k-th collective of a group on one member goes with the k-th on
every other member.
"""
from __future__ import annotations

import gc
import hashlib
import json
import math
import sys
from contextlib import contextmanager
from dataclasses import dataclass, field, fields, replace
from functools import cached_property
from importlib import resources
from pathlib import Path

import numpy as np

from cmemu.errors import TraceError
from cmemu.units import ns_to_ps  # noqa: F401 (re-exported)
from cmemu.vocab import COMP_DTYPES, COMP_OPS, COMP_SHAPE_ATTRS, COMP_UNITS, MEM_PLANES, NODE_TYPES, PLANES

SCHEMA = "cmemu.trace"
VERSION = 1
_NODE_TYPE_SET = frozenset(NODE_TYPES)
_NODE_TYPE_OWN = {t: t for t in NODE_TYPES}  # the module's own string for each type (see _own)
# Chakra node types that cmemu knows of but cannot run yet: named in the error, not "unknown".
_NOT_YET = ()
# Collectives (COMM_COLL comm_type), with the engines that can run them (the first is the default).
COLL_TYPES = ("ALL_TO_ALL", "ALL_GATHER", "REDUCE_SCATTER", "ALL_REDUCE", "BROADCAST", "MOE_DISPATCH",
              "MOE_COMBINE")
COLL_ENGINES = ("sdma", "aiv")
MOE_TYPES = ("MOE_DISPATCH", "MOE_COMBINE")
MOE_KERNELS = ("low_latency", "normal")  # cmemu.lower.moe.KERNELS: the fused kernels on AIV-Direct
# Attributes that must agree between the members of one collective.
_COLL_SHARED = ("comm_type", "comm_size", "cmemu.root", "cmemu.tokens", "cmemu.top_k", "cmemu.hidden",
                "cmemu.payload_bytes", "cmemu.experts", "cmemu.skew", "cmemu.seed", "cmemu.kernel")

# JSON numbers beyond 2**53 are not exact in a double, so no tool chain can be trusted with them.
MAX_INT = 2**53
# The core's clock is an int64 count of picoseconds; 2**62 leaves headroom for sums of durations.
MAX_PS = 2**62
# Streams are int32 in the lowered arrays and the timeline.
MAX_STREAM = 2**31 - 1

_HEADER_KEYS = frozenset({"schema", "version", "time_unit", "system", "description", "groups", "nodes"})
_NODE_KEYS = frozenset({"id", "name", "type", "rank", "stream", "data_deps", "ctrl_deps", "attrs"})


@dataclass(frozen=True, slots=True)
class Node:
    """One trace node, checked, with defaults filled in.

    ``attrs`` holds every attribute of the node's type that has a default (e.g. ``comm_tag``,
    ``cmemu.plane``, ``cmemu.unit``), the ones given, and ``x-`` attributes as written.
    ``cmemu.cores`` is absent when not given (meaning: all cores of the unit). Nodes of one type
    with equal attributes share one ``attrs`` dict (and nodes with one name one string): treat
    them as read-only.
    """

    id: int
    name: str
    type: str
    rank: int
    stream: int
    data_deps: tuple[int, ...]
    ctrl_deps: tuple[int, ...]
    attrs: dict = field(hash=False)


def _node_maker():
    """``Node(...)`` without the frozen dataclass's ``__init__``, which sets each field through
    ``object.__setattr__``: the slots' own setters, called directly, make the same node in half
    the time (0.4 s less for the 670,000 nodes of a 61-layer decode step)."""
    new = object.__new__
    s_id, s_name, s_type, s_rank, s_stream, s_data, s_ctrl, s_attrs = (
        Node.__dict__[f.name].__set__ for f in fields(Node))

    def make(id, name, type, rank, stream, data_deps, ctrl_deps, attrs):  # noqa: A002 (Node's names)
        node = new(Node)
        s_id(node, id)
        s_name(node, name)
        s_type(node, type)
        s_rank(node, rank)
        s_stream(node, stream)
        s_data(node, data_deps)
        s_ctrl(node, ctrl_deps)
        s_attrs(node, attrs)
        return node

    return make


_new_node = _node_maker()


@dataclass(frozen=True, eq=False)
class TraceGraph:
    """A trace's nodes and edges as arrays, by place in the file (node i is ``nodes[i]``): what
    the lowering reads instead of walking the nodes. The loader builds it as it checks."""

    id: np.ndarray  # int64 [nodes]
    rank: np.ndarray  # int32 [nodes]
    stream: np.ndarray  # int32 [nodes]
    # Dependencies: node data_succ[k] waits for node data_pred[k]; node after node, each node's
    # in the order of its data_deps (ctrl_* the same for ctrl_deps).
    data_pred: np.ndarray  # int32 [data edges]
    data_succ: np.ndarray  # int32 [data edges]
    ctrl_pred: np.ndarray  # int32 [control edges]
    ctrl_succ: np.ndarray  # int32 [control edges]
    stream_pred: np.ndarray  # int32 [nodes]: the node before it on its (rank, stream), else -1
    messages: np.ndarray  # int64 [messages, 2]: (COMM_SEND, COMM_RECV) of each message, in the sends' order
    # Each collective's members, in its group's rank order: the groups in the order of their first
    # COMM_COLL node, and within a group its first collective on every member, then its second...
    collectives: list


@dataclass(frozen=True)
class Trace:
    """A loaded, valid trace. ``nodes`` are in file order; ``header`` is everything but nodes."""

    path: str
    sha256: str
    header: dict
    nodes: list[Node]
    system: str | None

    @cached_property
    def by_id(self) -> dict[int, Node]:
        return {node.id: node for node in self.nodes}

    @cached_property
    def graph(self) -> TraceGraph:
        """The nodes as arrays (``load_trace`` gives the one it built as it checked)."""
        return graph_of(self.nodes, self.header.get("groups", {}))


def graph_of(nodes: list[Node], groups: dict) -> TraceGraph:
    """The TraceGraph of valid nodes, worked out from the nodes alone (as the loader's must be)."""
    index = {node.id: i for i, node in enumerate(nodes)}
    deps = {}
    for kind in ("data_deps", "ctrl_deps"):
        lists = [getattr(node, kind) for node in nodes]
        deps[kind] = (np.array([index[d] for lst in lists for d in lst], dtype=np.int32),
                      np.array([i for i, lst in enumerate(lists) for _ in lst], dtype=np.int32))
    msgs = []
    for i, node in enumerate(nodes):
        if node.type == "COMM_SEND":
            msgs.append((True, i, node.rank, node.attrs["comm_dst"], node.attrs["comm_tag"]))
        elif node.type == "COMM_RECV":
            msgs.append((False, i, node.attrs["comm_src"], node.rank, node.attrs["comm_tag"]))
    by = {}  # (group, rank) -> its COMM_COLL nodes in file order; groups in order of first node
    for i, node in enumerate(nodes):
        if node.type == "COMM_COLL":
            by.setdefault(node.attrs["cmemu.group"], {}).setdefault(node.rank, []).append(i)
    collectives = [[by[g][r][k] for r in groups[g]] for g in by for k in range(len(by[g][groups[g][0]]))]
    graph = TraceGraph(
        id=np.array([node.id for node in nodes], dtype=np.int64),
        rank=np.array([node.rank for node in nodes], dtype=np.int32),
        stream=np.array([node.stream for node in nodes], dtype=np.int32),
        data_pred=deps["data_deps"][0], data_succ=deps["data_deps"][1],
        ctrl_pred=deps["ctrl_deps"][0], ctrl_succ=deps["ctrl_deps"][1], stream_pred=None,
        messages=np.array(_pair_messages(msgs)[0], dtype=np.int64).reshape(-1, 2), collectives=collectives)
    return _with_stream_order(graph)


def _with_stream_order(graph: TraceGraph) -> TraceGraph:
    """The graph with its ``stream_pred`` (nodes whose rank is -1 have none and are none's)."""
    key = graph.rank.astype(np.int64) << 32 | graph.stream.astype(np.int64)
    order = np.argsort(key, kind="stable")
    same = (key[order[1:]] == key[order[:-1]]) & (graph.rank[order[1:]] >= 0)
    stream_pred = np.full(key.shape[0], -1, dtype=np.int32)
    stream_pred[order[1:][same]] = order[:-1][same]
    return replace(graph, stream_pred=stream_pred)


def schema_path():
    """The shipped JSON Schema (draft 2020-12) of trace v1, as a path-like Traversable."""
    return resources.files("cmemu.trace") / "schema" / "trace-v1.schema.json"


@contextmanager
def _gc_paused():
    """Pause the cyclic garbage collector while a trace is parsed and checked.

    Parsing and checking allocate millions of small objects, none of them in a cycle; with the
    collector on, it rescans the whole growing trace again and again (about half the load time).
    On the way out they are moved to the oldest generation without a scan (``gc.freeze()`` then
    ``gc.unfreeze()``): left in the youngest, the first allocation after would start a
    collection of all of them (0.5 s for a 670,000-node trace, once after reading and again
    after checking).
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        gc.unfreeze()
        if was_enabled:
            gc.enable()


# --------------------------------------------------------------------------------------- reading


def read_trace(path) -> tuple[dict, str]:
    """Parse a trace file into ``(doc, sha256)``; ``doc`` has the JSON document's shape.

    ``.jsonl`` files hold the header object (without ``nodes``) on their first non-blank line and
    one node object on each further non-blank line; anything else is read as one JSON document.
    Raises TraceError for a missing or unreadable file and for malformed JSON (line and column).
    """
    spath = str(path)
    p = Path(path)
    try:
        data = p.read_bytes()
    except FileNotFoundError:
        raise TraceError(spath, "no such file") from None
    except IsADirectoryError:
        raise TraceError(spath, "is a directory, not a trace file") from None
    except OSError as exc:
        raise TraceError(spath, f"cannot read: {exc.strerror}") from None
    sha256 = hashlib.sha256(data).hexdigest()
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise TraceError(spath, f"not UTF-8 text: invalid byte at line {line}") from None
    with _gc_paused():
        if p.suffix == ".jsonl":
            return _parse_jsonl(text, spath), sha256
        return _parse_json(text, spath, 0), sha256


class TraceDocument:
    """A trace in memory, ready to check and run: a document of docs/trace-format.md's shape
    (what ``read_trace`` parses a file into, or what a generator builds: the scenarios'), the
    name its errors carry, and the file it came from, if any. ``cmemu run`` reads its file into
    one (``read_document``) and the scenarios make one of the dict they generated; both hand it
    to cmemu.run.run_trace, which checks and runs it the same way, so a generated trace needs no
    file. The run takes the document over (``take``) and reads it without changing it: with no
    other reference, it is freed once checked."""

    __slots__ = ("doc", "name", "file", "_sha256")

    def __init__(self, doc: dict, name: str = "<generated trace>", sha256: str | None = None, file=None):
        self.doc, self.name, self.file, self._sha256 = doc, str(name), file, sha256

    @property
    def sha256(self) -> str:
        """The file's sha256; a generated document's is that of the file `cmemu trace gen` would
        write of it (cmemu.trace.writer: the same digest as the run of that file records)."""
        if self._sha256 is None:
            from cmemu.trace.writer import write_trace

            digest = hashlib.sha256()

            class _Hashing:
                def write(self, text):
                    digest.update(text.encode())

            write_trace(self.doc, _Hashing())
            self._sha256 = digest.hexdigest()
        return self._sha256

    def take(self) -> tuple[dict, str]:
        """(document, sha256) for ``load_trace(read=...)``, and this object keeps the document no
        more. The sha256 is "" for a generated document whose ``sha256`` was never asked for (it
        costs a serialisation: a run asks only when it writes a timeline, which records it)."""
        if self.doc is None:
            raise ValueError(f"{self.name}: this trace document was already run")
        read = self.doc, self._sha256 or ""
        self.doc = None
        return read


def read_document(path) -> TraceDocument:
    """A trace file read into memory (``read_trace``)."""
    doc, sha256 = read_trace(path)
    return TraceDocument(doc, str(path), sha256, file=Path(path))


_JSON_SPACE = " \t\n\r"  # JSON's whitespace (str.strip() would take Unicode's, which JSON refuses)


def _parse_json(text: str, spath: str, line_offset: int):
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise TraceError(
            spath,
            f"invalid JSON at line {exc.lineno + line_offset} column {exc.colno}: {exc.msg}",
        ) from None
    except RecursionError:
        raise TraceError(spath, "invalid JSON: nested too deeply") from None
    except ValueError:
        # Python refuses integer literals of more than sys.get_int_max_str_digits() digits.
        raise TraceError(spath, "invalid JSON: a number has too many digits "
                         f"(more than {sys.get_int_max_str_digits()})") from None


def _parse_jsonl(text: str, spath: str) -> dict:
    header = None
    nodes = []
    # json.loads per line, without its wrapper's cost per call (half the read of a 670,000-line
    # trace): the decoder's scanner on the line without its JSON whitespace, which must be one
    # value; anything else goes through json.loads itself, for its error (or, all the same, value).
    scan = json.JSONDecoder().scan_once
    for lineno, line in enumerate(text.split("\n")):
        value = line.strip(_JSON_SPACE)
        if not value:
            continue
        try:
            obj, end = scan(value, 0)
            if end != len(value):
                raise ValueError("extra data")
        except (StopIteration, ValueError, RecursionError):
            if not line.strip():  # blank but for Unicode's whitespace: skipped, as every blank line
                continue
            obj = _parse_json(line, spath, lineno)
        if header is None:
            if type(obj) is not dict:
                raise TraceError(
                    spath, f"line {lineno + 1}: the first line of a JSONL trace must be the "
                    f"header object, got {_kind(obj)}"
                )
            if "nodes" in obj:
                raise TraceError(
                    spath, f"line {lineno + 1}: a JSONL header must not hold 'nodes'; write one "
                    "node per line after it", field="nodes"
                )
            header = obj
        else:
            nodes.append(obj)
    if header is None:
        raise TraceError(spath, "empty file: expected a header line and node lines")
    doc = dict(header)
    doc["nodes"] = nodes
    return doc


# -------------------------------------------------------------------------------------- checking


def check_trace(doc, path, num_ranks: int, node_check=None) -> list[TraceError]:
    """Every problem of a parsed trace, in file order; an empty list means it is valid.

    ``num_ranks`` is the number of dies of the system the trace will run on. ``node_check``,
    when given, is called as ``node_check(type, attrs)`` once for each distinct set of checked
    attributes of a COMP or COMM_COLL node (the system's own checks: cores, the die model's
    limits; see ``cmemu.lower.checks``) and returns its problems as ``[(field, message)]``;
    each is reported on the first node with those attributes. Never raises for bad content
    (only ValueError for a bad ``num_ranks``, a caller's bug).
    """
    with _gc_paused():
        return _check(doc, str(path), num_ranks, build=False, node_check=node_check)[0]


def load_trace(path, num_ranks: int, read=None, node_check=None) -> Trace:
    """Read and check a trace; raise its first TraceError (saying how many more there are).

    ``read`` is what ``read_trace(path)`` returned, for a caller that already read the file
    (to learn its ``system`` before knowing ``num_ranks``); ``node_check`` as for check_trace.
    """
    doc, sha256 = read if read is not None else read_trace(path)
    spath = str(path)
    with _gc_paused():
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


def stream_predecessors(trace: Trace) -> dict[int, int]:
    """For each node that is not first on its (rank, stream): the id of the node before it."""
    last = {}
    pred = {}
    for node in trace.nodes:
        key = (node.rank, node.stream)
        before = last.get(key)
        if before is not None:
            pred[node.id] = before
        last[key] = node.id
    return pred


def match_messages(trace: Trace) -> list[tuple[int, int]]:
    """``(send_id, recv_id)`` of every message of a valid trace, in the sends' file order."""
    nodes = trace.nodes
    return [(nodes[s].id, nodes[r].id) for s, r in trace.graph.messages.tolist()]


def _pair_messages(msgs):
    """Match sends and receives given in file order as (is_send, file index, src, dst, tag).

    The k-th send from src to dst with a tag matches the k-th receive on dst from src with that
    tag, as MPI orders the messages of one (source, tag). Returns the (send, recv) pairs of file
    indices in the sends' order, and the sends and the receives left unmatched (as given).
    """
    sends = {}
    recvs = {}
    order = {}  # channels in order of first appearance
    for m in msgs:
        channel = m[2:]
        book = sends if m[0] else recvs
        queue = book.get(channel)
        if queue is None:
            queue = book[channel] = []
            order[channel] = None
        queue.append(m)
    matched = []
    lone_sends = []
    lone_recvs = []
    for channel in order:
        s = sends.get(channel, ())
        r = recvs.get(channel, ())
        matched.extend(zip(s, r))
        lone_sends.extend(s[len(r):])
        lone_recvs.extend(r[len(s):])
    matched.sort(key=lambda pair: pair[0][1])
    return [(s[1], r[1]) for s, r in matched], lone_sends, lone_recvs


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


def _kind(v) -> str:
    if v is None:
        return "null"
    if type(v) is bool:
        return "a boolean"
    if type(v) is str:
        return json.dumps(v if len(v) <= 60 else v[:57] + "...")
    if type(v) is list:
        return "an array"
    if type(v) is dict:
        return "an object"
    return _num(v)


def _num(v) -> str:
    """A number for a one-line message: a huge integer by its number of digits, not in full."""
    text = repr(v)
    return text if len(text) <= 40 else f"a {len(text.lstrip('-'))}-digit number"


def _bad_float(v: float) -> str | None:
    if v != v:
        return "NaN is not a number cmemu accepts"
    if v in (math.inf, -math.inf):
        return "Infinity is not a number cmemu accepts"
    if abs(v) > MAX_INT:
        return f"{v!r} is too large (at most 2**53)"
    return None


def _as_int(v, lo: int):
    """``(int, None)`` for an integer >= lo (1024.0 counts, as in JSON Schema), else (None, msg)."""
    t = type(v)
    if t is int:
        if v > MAX_INT:
            return None, f"{_num(v)} is too large (at most 2**53)"
    elif t is float:
        msg = _bad_float(v)
        if msg:
            return None, msg
        if not v.is_integer():
            return None, f"expected an integer, got {v!r}"
        v = int(v)
    else:
        return None, f"expected an integer, got {_kind(v)}"
    if v < lo:
        return None, f"must be >= {lo}, got {_num(v)}"
    return v, None


def _as_number(v):
    """``(number, None)`` for a finite number >= 0, else (None, msg)."""
    t = type(v)
    if t is int:
        if v > MAX_INT:
            return None, f"{_num(v)} is too large (at most 2**53)"
    elif t is float:
        msg = _bad_float(v)
        if msg:
            return None, msg
    else:
        return None, f"expected a number, got {_kind(v)}"
    if v < 0:
        return None, f"must be >= 0, got {_num(v)}"
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
        return None, f"must be one of {', '.join(choices)}; got {_kind(v)}"

    return check


def _as_size(v):
    return _as_int(v, 0)


def _as_group_name(v):
    if type(v) is str and v:
        return v, None
    return None, f"must be the name of a group in the header's \"groups\", got {_kind(v)}"


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
        err(-1, f"the top level must be an object (the header with its nodes), got {_kind(doc)}")
        return done(None)
    _check_header(doc, err)
    nodes_in = doc.get("nodes")
    if nodes_in is None and "nodes" not in doc:
        err(-1, "missing: the trace needs a list of nodes", fld="nodes")
        return done(None)
    if type(nodes_in) is not list:
        err(-1, f"must be an array of node objects, got {_kind(nodes_in)}", fld="nodes")
        return done(None)

    n = len(nodes_in)
    # Pass 1: ids, so that a node may depend on one written after it.
    ids = [None] * n  # id of each node with a valid id, first occurrence only
    labels = [None] * n  # any valid id, duplicates too: what errors about the node name
    index_of = {}
    for i, nd in enumerate(nodes_in):
        if type(nd) is not dict:
            err(i, f"nodes[{i}] must be an object, got {_kind(nd)}")
            continue
        nid = nd.get("id")
        if type(nid) is not int or not 0 <= nid <= MAX_INT:
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
    node_keys = _NODE_KEYS
    no_deps = ()
    # Many nodes repeat a name (one per rank) and attributes (one operator shape): the nodes keep
    # one string and one checked attrs dict for each, as the lowering's per-shape costs expect.
    shared_names = {}
    shared_attrs = {}  # (type, raw items, their value types) -> attrs, for attrs without problems
    checked = {}  # id(attrs) -> [first node's index, label, prefix, nodes, attrs, node_check's problems]
    own_int = {}.setdefault  # the trace's own copy of each rank and stream (see _own)
    new_node = _new_node
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
                msg = f"unknown type {_kind(ntype)}; one of {', '.join(NODE_TYPES)}"
            err(i, pre + msg, label, "type")

        name = get("name")
        if name is None and "name" not in nd:
            if build and type_ok:
                name = f"{ntype.lower()}_{label}"
        elif type(name) is not str or not name:
            err(i, f"{pre}must be a non-empty string, got {_kind(name)}", label, "name")
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
                stream, msg = None, f"{_num(stream)} is too large (at most 2**31 - 1)"
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
                        err(i, f"{pre}must be an array of node ids, got {_kind(raw)}", label, fld)
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
                    err(i, f"{pre}must be an array of node ids, got {_kind(raw)}", label, fld)
            data_deps = ctrl_deps = no_deps

        raw_attrs = get("attrs", no_deps)
        attrs = None
        if type(raw_attrs) is not dict:
            if raw_attrs is no_deps:
                raw_attrs = {}
            else:
                err(i, f"{pre}must be an object, got {_kind(raw_attrs)}", label, "attrs")
                raw_attrs = None
        if type_ok and raw_attrs is not None:
            # A message's attributes are checked against its rank; other nodes' only against
            # themselves. The value types are in the key: 1, 1.0 and true are equal in a tuple.
            key = None
            if ntype not in _COMM_PEER:
                key = (ntype, tuple(raw_attrs.items()), tuple(map(type, raw_attrs.values())))
                try:
                    attrs = shared_attrs.get(key)
                except TypeError:  # an unhashable value (an 'x-' array or object)
                    key = None
            attrs_ok = True
            if attrs is None:
                before = len(found)
                attrs = _check_attrs(ntype, raw_attrs, rank, num_ranks, i, label, pre, err)
                attrs_ok = len(found) == before
                if key is not None and attrs_ok:
                    shared_attrs[key] = attrs
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
    graph = _with_stream_order(graph)
    _check_cycles(ids, graph, forward, err)
    return done(out_nodes, graph)


def _check_groups(raw, num_ranks: int, err) -> dict:
    """The header's groups: name -> tuple of distinct ranks (at least two)."""
    if type(raw) is not dict:
        err(-1, f"must be an object of group name -> list of ranks, got {_kind(raw)}", fld="groups")
        return {}
    out = {}
    for name, ranks in raw.items():
        if type(ranks) is not list or len(ranks) < 2:
            err(-1, f"group '{name}' must be a list of at least two ranks, got {_kind(ranks)}", fld="groups")
            continue
        bad = [r for r in ranks if type(r) is not int or not 0 <= r < num_ranks]
        if bad:
            err(-1, f"group '{name}': {_kind(bad[0])} is not a rank of the system (0..{num_ranks - 1})",
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
        got = _kind(doc["schema"]) if "schema" in doc else "nothing"
        err(-1, f"must be \"{SCHEMA}\", got {got}", fld="schema")
    version = doc.get("version")
    if "version" not in doc:
        err(-1, f"missing; this cmemu reads version {VERSION}", fld="version")
    elif version != VERSION or type(version) not in (int, float):
        shown = _num(version) if type(version) in (int, float) else _kind(version)
        err(-1, f"unsupported trace version {shown}; this cmemu reads version {VERSION}",
            fld="version")
    if doc.get("time_unit") != "ns" or type(doc.get("time_unit")) is not str:
        got = _kind(doc["time_unit"]) if "time_unit" in doc else "nothing"
        err(-1, f"must be \"ns\" (every time in a v1 trace is in nanoseconds), got {got}",
            fld="time_unit")
    for key in ("system", "description"):
        if key in doc and (type(doc[key]) is not str or not doc[key]):
            err(-1, f"must be a non-empty string, got {_kind(doc[key])}", fld=key)
    if "cmemu.faults" in doc:
        _check_faults(doc["cmemu.faults"], err)
    for key in doc:
        if key not in _HEADER_KEYS and not (
            type(key) is str and (key.startswith("x-") or key.startswith("cmemu."))
        ):
            err(-1, f"unknown header field (header fields: {', '.join(sorted(_HEADER_KEYS))}; "
                "'x-' and 'cmemu.' fields are kept)", fld=key)


# A fault schedule entry: the part (as --fail names it) and when it fails (0: from the start).
FAULT_KEYS = ("fail", "at_ns")
# A failure during a run must land on the clock: its time in ps below 2**62 (at_ns below 2**52).
MAX_FAULT_NS = 2**52


def _check_faults(raw, err) -> None:
    """The header's ``cmemu.faults``: a list of {"fail": PART, "at_ns": TIME}. Whether each PART
    names a part of the system is checked against the topology (cmemu.run.trace_failures)."""
    fld = "cmemu.faults"
    if type(raw) is not list:
        err(-1, f"must be a list of {{\"fail\": PART, \"at_ns\": TIME}} objects (PART as --fail names it: "
            f"link:ID, l1:NODE.PLANE, l2:PLANE.CHIP or die:ID), got {_kind(raw)}", fld=fld)
        return
    for k, entry in enumerate(raw):
        where = f"{fld}[{k}]"
        if type(entry) is not dict:
            err(-1, f"must be {{\"fail\": PART, \"at_ns\": TIME}}, got {_kind(entry)}", fld=where)
            continue
        for key in entry:
            if key not in FAULT_KEYS and not (type(key) is str and key.startswith("x-")):
                err(-1, f"unknown key {_kind(key)} (an entry holds fail and at_ns; 'x-' keys are kept and "
                    "ignored)", fld=where)
        part = entry.get("fail")
        if type(part) is not str or not part:
            got = _kind(part) if "fail" in entry else "nothing"
            err(-1, f"must name a part as --fail does (link:ID, l1:NODE.PLANE, l2:PLANE.CHIP or die:ID), "
                f"got {got}", fld=f"{where}.fail")
        at = entry.get("at_ns", 0)
        if type(at) not in (int, float) or not 0 <= at < MAX_FAULT_NS:
            err(-1, f"at_ns must be a time in ns >= 0 and below 2**52 (when the part fails; 0: from the start), "
                f"got {_kind(at)}", fld=f"{where}.at_ns")


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
        if type(value) is int and check in _INT_CHECKS and _INT_CHECKS[check] <= value <= MAX_INT:
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
    pairs, lone_sends, lone_recvs = _pair_messages(msgs)
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
