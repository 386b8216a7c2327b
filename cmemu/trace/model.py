"""The loaded trace: its checked nodes (``Node``), the whole trace (``Trace``) and its nodes and
edges as arrays (``TraceGraph``), with the rules of its order: stream order, and which send a
receive matches. Built by the loader (cmemu.trace.check) as it checks; nothing here checks.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from functools import cached_property

import numpy as np


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


make_node = _node_maker()


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
        messages=np.array(pair_messages(msgs)[0], dtype=np.int64).reshape(-1, 2), collectives=collectives)
    return with_stream_order(graph)


def with_stream_order(graph: TraceGraph) -> TraceGraph:
    """The graph with its ``stream_pred`` (nodes whose rank is -1 have none and are none's)."""
    key = graph.rank.astype(np.int64) << 32 | graph.stream.astype(np.int64)
    order = np.argsort(key, kind="stable")
    same = (key[order[1:]] == key[order[:-1]]) & (graph.rank[order[1:]] >= 0)
    stream_pred = np.full(key.shape[0], -1, dtype=np.int32)
    stream_pred[order[1:][same]] = order[:-1][same]
    return replace(graph, stream_pred=stream_pred)


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


def pair_messages(msgs):
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
