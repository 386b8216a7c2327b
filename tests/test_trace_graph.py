"""Trace.graph: the nodes and edges as arrays, built by the loader while it checks, equal to the
graph worked out from the loaded nodes alone (cmemu.trace.model.graph_of)."""
import json
from pathlib import Path

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from cmemu.errors import TraceError
from cmemu.trace import load_trace
from cmemu.trace.model import graph_of
from conftest import assert_same_fields

REPO = Path(__file__).resolve().parent.parent
SHIPPED = sorted((REPO / "traces").glob("*.json")) + sorted((REPO / "traces" / "examples").glob("*.json"))


def assert_same_graph(trace):
    assert_same_fields(trace.graph, graph_of(trace.nodes, trace.header.get("groups", {})))


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_shipped_traces(path):
    trace = load_trace(path, 32)
    assert_same_graph(trace)
    assert len(trace.graph.id) == len(trace.nodes)


def test_match_messages_and_stream_order_from_the_graph(tmp_path):
    nodes = [{"id": 7, "type": "COMM_SEND", "rank": 0, "attrs": {"comm_dst": 1, "comm_size": 8}},
             {"id": 3, "type": "COMP", "rank": 0, "data_deps": [7, 9, 7], "ctrl_deps": [9],
              "attrs": {"num_ops": 1}},
             {"id": 9, "type": "COMM_RECV", "rank": 1, "stream": 4, "attrs": {"comm_src": 0, "comm_size": 8}},
             {"id": 1, "type": "COMP", "rank": 1, "stream": 4, "attrs": {"num_ops": 1}}]
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"schema": "cmemu.trace", "version": 1, "time_unit": "ns", "nodes": nodes}))
    trace = load_trace(path, 4)
    g = trace.graph
    assert g.id.tolist() == [7, 3, 9, 1] and g.rank.tolist() == [0, 0, 1, 1] and g.stream.tolist() == [0, 0, 4, 4]
    assert list(zip(g.data_pred.tolist(), g.data_succ.tolist())) == [(0, 1), (2, 1)]  # a repeated dep once
    assert list(zip(g.ctrl_pred.tolist(), g.ctrl_succ.tolist())) == [(2, 1)]
    assert g.stream_pred.tolist() == [-1, 0, -1, 2] and g.messages.tolist() == [[0, 2]]
    assert_same_graph(trace)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 1), st.lists(st.integers(0, 20), max_size=3),
                          st.lists(st.integers(0, 20), max_size=2), st.sampled_from(["comp", "message", "coll"]),
                          st.booleans()),
                min_size=1, max_size=12))
def test_random_traces(tmp_path_factory, spec):
    """Random nodes (rank, stream, data and control deps on earlier nodes and sometimes later
    ones, messages from rank 0 to 1, collectives over ranks 3 and 2): whenever they load, the
    two graphs agree."""
    nodes = []
    count = sum(2 if kind != "comp" else 1 for *_, kind, _ in spec)
    for rank, stream, data, ctrl, kind, forward in spec:
        def node(**kw):
            i = len(nodes)
            allowed = [d for d in data + ctrl if d != i and (d < i or forward) and d < count]
            nodes.append({"id": 1000 - i, "type": "COMP", "rank": rank, "stream": stream, "attrs": {"num_ops": 1},
                          "data_deps": [1000 - d for d in allowed if d in data],
                          "ctrl_deps": [1000 - d for d in allowed if d in ctrl], **kw})
        if kind == "comp":
            node()
        elif kind == "message":
            node(type="COMM_SEND", rank=0, attrs={"comm_dst": 1, "comm_size": 8})
            node(type="COMM_RECV", rank=1, attrs={"comm_src": 0, "comm_size": 8})
        else:
            for r in (2, 3) if forward else (3, 2):
                node(type="COMM_COLL", rank=r, attrs={"comm_type": "ALL_GATHER", "comm_size": 8, "cmemu.group": "g"})
    path = tmp_path_factory.mktemp("g") / "t.json"
    path.write_text(json.dumps({"schema": "cmemu.trace", "version": 1, "time_unit": "ns", "groups": {"g": [3, 2]},
                                "nodes": nodes}))
    try:
        trace = load_trace(path, 4)
    except TraceError as exc:
        assert "dependency cycle" in str(exc)
        assume(False)
    assert_same_graph(trace)
