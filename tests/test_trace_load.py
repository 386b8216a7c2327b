"""Trace IR v1: loading, defaults, and one test per class of bad input (docs/architecture.md, "Bad input").

Each error test asserts the message names the node id and the field, as a user needs to fix it.
"""
import graphlib
import hashlib
import json
from pathlib import Path

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cmemu.errors import TraceError
from cmemu.trace import (
    Node,
    check_trace,
    load_trace,
    match_messages,
    ns_to_ps,
    read_trace,
    schema_path,
    stream_predecessors,
)
from cmemu.vocab import NODE_TYPES

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = sorted((REPO / "traces" / "examples").glob("*.json"))
RANKS = 4


def header(**extra):
    return {"schema": "cmemu.trace", "version": 1, "time_unit": "ns", **extra}


def comp(nid, rank=0, **kw):
    return {"id": nid, "type": "COMP", "rank": rank, "attrs": {"num_ops": 1000}, **kw}


def send(nid, rank, dst, size=64, **attrs):
    return {"id": nid, "type": "COMM_SEND", "rank": rank,
            "attrs": {"comm_dst": dst, "comm_size": size, **attrs}}


def recv(nid, rank, src, size=64, **attrs):
    return {"id": nid, "type": "COMM_RECV", "rank": rank,
            "attrs": {"comm_src": src, "comm_size": size, **attrs}}


def valid_doc():
    return header(system="mini", description="two ranks", **{"x-tool": "t", "cmemu.run": 3}) | {
        "nodes": [
            {"id": 10, "name": "gemm", "type": "COMP", "rank": 0, "stream": 2,
             "attrs": {"num_ops": 2.5e9, "tensor_size": 4096, "cmemu.dtype": "int8",
                       "cmemu.unit": "aic", "cmemu.cores": 12, "x-src": "aten::mm"}},
            {"id": 11, "type": "COMM_SEND", "rank": 0, "stream": 2, "data_deps": [10, 10],
             "attrs": {"comm_dst": 1, "comm_size": 1024, "comm_tag": 5}},
            {"id": 3, "type": "COMM_RECV", "rank": 1,
             "attrs": {"comm_src": 0, "comm_size": 1024.0, "comm_tag": 5}},
            {"id": 4, "type": "MEM_LOAD", "rank": 1, "ctrl_deps": [3], "attrs": {"tensor_size": 0}},
            {"id": 5, "type": "COMP", "rank": 1, "data_deps": [4],
             "attrs": {"cmemu.duration_ns": 12.5, "cmemu.unit": "aiv"}},
            {"id": 6, "type": "MEM_STORE", "rank": 1, "stream": 1, "attrs": {"tensor_size": 8}},
            {"id": 7, "type": "COMM_SEND", "rank": 1, "stream": 1,
             "attrs": {"comm_dst": 0, "comm_size": 16, "cmemu.plane": "rdma"}},
            {"id": 8, "type": "COMM_SEND", "rank": 1, "stream": 1,
             "attrs": {"comm_dst": 0, "comm_size": 32, "cmemu.plane": "rdma"}},
            {"id": 9, "type": "COMM_RECV", "rank": 0, "data_deps": [],
             "attrs": {"comm_src": 1, "comm_size": 16, "cmemu.plane": "rdma"}},
            {"id": 12, "type": "COMM_RECV", "rank": 0, "x-note": "kept",
             "attrs": {"comm_src": 1, "comm_size": 32, "cmemu.plane": "rdma"}},
        ],
    }


def write(tmp_path, doc, name="t.json"):
    path = tmp_path / name
    path.write_text(json.dumps(doc), encoding="utf-8")
    return path


def write_jsonl(tmp_path, doc, name="t.jsonl"):
    head = {k: v for k, v in doc.items() if k != "nodes"}
    lines = [json.dumps(head)] + [json.dumps(node) for node in doc["nodes"]]
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def problems(tmp_path, doc, num_ranks=RANKS):
    path = write(tmp_path, doc)
    data, _ = read_trace(path)
    return check_trace(data, path, num_ranks)


def one_problem(tmp_path, doc, num_ranks=RANKS):
    """The single error of a trace that should have exactly one; load_trace raises it too."""
    errors = problems(tmp_path, doc, num_ranks)
    assert len(errors) == 1, [str(e) for e in errors]
    with pytest.raises(TraceError) as raised:
        load_trace(tmp_path / "t.json", num_ranks)
    assert str(raised.value) == str(errors[0])
    return errors[0]


def nodes_doc(*nodes, **head):
    return header(**head) | {"nodes": list(nodes)}


def assert_names(error, node_id, field, *words):
    assert error.node_id == node_id
    assert error.field == field
    text = str(error)
    assert f"node {node_id}" in text if node_id is not None else "node " not in text.split(":")[1]
    assert f"field '{field}'" in text if field is not None else "field '" not in text
    for word in words:
        assert word in text, text


# ------------------------------------------------------------------------------- valid traces


def test_valid_trace_loads_with_defaults(tmp_path):
    path = write(tmp_path, valid_doc())
    trace = load_trace(path, RANKS)
    assert trace.path == str(path)
    assert trace.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    assert trace.system == "mini"
    assert "nodes" not in trace.header
    assert trace.header["x-tool"] == "t" and trace.header["cmemu.run"] == 3
    assert [n.id for n in trace.nodes] == [10, 11, 3, 4, 5, 6, 7, 8, 9, 12]

    gemm = trace.by_id[10]
    assert gemm == Node(10, "gemm", "COMP", 0, 2, (), (), {
        "num_ops": 2.5e9, "tensor_size": 4096, "cmemu.dtype": "int8", "cmemu.unit": "aic",
        "cmemu.cores": 12, "x-src": "aten::mm"})
    first_send = trace.by_id[11]
    assert first_send.name == "comm_send_11"
    assert first_send.data_deps == (10,)  # duplicates dropped
    assert first_send.attrs == {"comm_dst": 1, "comm_size": 1024, "comm_tag": 5,
                                "cmemu.plane": "ub"}
    first_recv = trace.by_id[3]
    assert first_recv.stream == 0 and first_recv.ctrl_deps == ()
    assert first_recv.attrs["comm_size"] == 1024 and type(first_recv.attrs["comm_size"]) is int
    assert trace.by_id[4].ctrl_deps == (3,)
    fixed = trace.by_id[5].attrs
    assert fixed == {"cmemu.duration_ns": 12.5, "cmemu.unit": "aiv"}  # no work defaults
    assert ns_to_ps(fixed["cmemu.duration_ns"]) == 12_500
    assert trace.by_id[9].attrs["comm_tag"] == 0
    assert trace.by_id[12].name == "comm_recv_12"


def test_comp_work_defaults(tmp_path):
    trace = load_trace(write(tmp_path, nodes_doc(comp(0))), RANKS)
    assert trace.nodes[0].attrs == {"num_ops": 1000, "tensor_size": 0, "cmemu.dtype": "bf16",
                                    "cmemu.unit": "aic"}
    assert "cmemu.cores" not in trace.nodes[0].attrs  # absent means all cores of the unit


def test_stream_predecessors(tmp_path):
    trace = load_trace(write(tmp_path, valid_doc()), RANKS)
    # (0,2): 10, 11   (1,0): 3, 4, 5   (1,1): 6, 7, 8   (0,0): 9, 12
    assert stream_predecessors(trace) == {11: 10, 4: 3, 5: 4, 7: 6, 8: 7, 12: 9}


def test_message_matching_in_order(tmp_path):
    trace = load_trace(write(tmp_path, valid_doc()), RANKS)
    assert match_messages(trace) == [(11, 3), (7, 9), (8, 12)]


def test_kth_send_matches_kth_recv_per_tag(tmp_path):
    doc = nodes_doc(
        send(0, 0, 1, size=1), send(1, 0, 1, size=2, comm_tag=1), send(2, 0, 1, size=3),
        recv(3, 1, 0, size=2, comm_tag=1), recv(4, 1, 0, size=1), recv(5, 1, 0, size=3),
    )
    trace = load_trace(write(tmp_path, doc), RANKS)
    assert match_messages(trace) == [(0, 4), (1, 3), (2, 5)]


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_shipped_examples_load_and_match_schema(path, schema):
    doc, _ = read_trace(path)
    schema.validate(doc)
    trace = load_trace(path, 32)
    assert trace.nodes


def test_documented_example_is_the_shipped_one(tmp_path):
    text = (REPO / "docs" / "trace-format.md").read_text(encoding="utf-8")
    example = json.loads(text.split("```json\n", 1)[1].split("```", 1)[0])
    shipped, _ = read_trace(REPO / "traces" / "examples" / "pingpong.json")
    assert example == shipped
    trace = load_trace(write(tmp_path, example), 32)
    assert trace.by_id[5].name == "mem_store_5"  # as the page says
    assert stream_predecessors(trace)[5] == 4 and stream_predecessors(trace)[6] == 2
    assert match_messages(trace) == [(1, 2), (6, 7)]


def test_jsonl_round_trip(tmp_path):
    doc = valid_doc()
    from_json = load_trace(write(tmp_path, doc), RANKS)
    jsonl = write_jsonl(tmp_path, doc)
    jsonl.write_text("\n" + jsonl.read_text() + "\n\n", encoding="utf-8")  # blank lines skipped
    from_jsonl = load_trace(jsonl, RANKS)
    assert from_jsonl.nodes == from_json.nodes
    assert from_jsonl.header == from_json.header
    assert from_jsonl.sha256 == hashlib.sha256(jsonl.read_bytes()).hexdigest()
    assert from_jsonl.sha256 != from_json.sha256
    # and back: the loaded header and nodes written again load the same
    again = from_jsonl.header | {"nodes": [
        {"id": n.id, "name": n.name, "type": n.type, "rank": n.rank, "stream": n.stream,
         "data_deps": list(n.data_deps), "ctrl_deps": list(n.ctrl_deps), "attrs": n.attrs}
        for n in from_jsonl.nodes]}
    assert load_trace(write_jsonl(tmp_path, again, "again.jsonl"), RANKS).nodes == from_json.nodes


def test_x_fields_are_kept_and_ignored(tmp_path):
    doc = nodes_doc(comp(0) | {"x-color": [1, 2]}, **{"x-anything": {"a": 1}})
    doc["nodes"][0]["attrs"]["x-shape"] = [4, 4]
    trace = load_trace(write(tmp_path, doc), RANKS)
    assert trace.nodes[0].attrs["x-shape"] == [4, 4]
    assert trace.header["x-anything"] == {"a": 1}


def test_integral_floats_count_as_integers(tmp_path):
    doc = nodes_doc(comp(0.0, rank=1.0, stream=2.0), comp(1, data_deps=[0.0]))
    trace = load_trace(write(tmp_path, doc), RANKS)
    assert trace.nodes[0].id == 0 and type(trace.nodes[0].rank) is int
    assert trace.nodes[1].data_deps == (0,)


def test_dependency_on_a_later_node_is_fine(tmp_path):
    doc = nodes_doc(comp(0, data_deps=[1]), comp(1, rank=1))
    assert load_trace(write(tmp_path, doc), RANKS).nodes[0].data_deps == (1,)


# ------------------------------------------------------------------------------ bad input


def test_missing_file(tmp_path):
    with pytest.raises(TraceError) as raised:
        load_trace(tmp_path / "nope.json", RANKS)
    assert str(raised.value) == f"{tmp_path / 'nope.json'}: no such file"


def test_malformed_json_names_line_and_column(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text('{\n  "schema": "cmemu.trace",\n  "version" 1\n}\n', encoding="utf-8")
    with pytest.raises(TraceError) as raised:
        load_trace(path, RANKS)
    assert str(raised.value).startswith(f"{path}: invalid JSON at line 3 column 13: ")
    assert "Expecting ':'" in str(raised.value)


def test_truncated_json(tmp_path):
    text = json.dumps(valid_doc(), indent=1)
    path = tmp_path / "cut.json"
    path.write_text(text[: len(text) // 2], encoding="utf-8")
    with pytest.raises(TraceError) as raised:
        read_trace(path)
    line = text[: len(text) // 2].count("\n") + 1
    assert f"invalid JSON at line {line} column" in str(raised.value)


def test_malformed_jsonl_names_the_file_line(tmp_path):
    path = write_jsonl(tmp_path, nodes_doc(comp(0), comp(1), comp(2)))
    lines = path.read_text().splitlines()
    lines[2] = lines[2][:-3]
    path.write_text("\n".join(lines), encoding="utf-8")
    with pytest.raises(TraceError) as raised:
        load_trace(path, RANKS)
    assert "invalid JSON at line 3 column" in str(raised.value)


@pytest.mark.parametrize("line, error", [
    (' \t{"x-a": [1, 2.5, "s", null, true]}\r', None),  # JSON's whitespace around a value: the value
    ('{"x-a": NaN}', None),  # what json.loads takes, the line takes
    ('\u00a0', None),  # blank but for Unicode's whitespace: skipped, as json.loads would not take it
    ('\u00a0{"x-a": 1}', "line 3 column 1: Expecting value"),  # Unicode's whitespace is not JSON's
    ('{"x-a": 1} {"x-b": 2}', "line 3 column 12: Extra data"),  # two values on a line
    ('{"x-a": 1}, ', "line 3 column 11: Extra data"),
    ('{"x-a": [1,', "line 3 column 12: Expecting value"),  # a value over two lines
])
def test_jsonl_lines_read_as_json_loads_reads_them(tmp_path, line, error):
    """Each JSONL line is read as json.loads reads it (read_trace takes a faster way to the same)."""
    path = write_jsonl(tmp_path, nodes_doc(comp(0), comp(1)))
    lines = path.read_text().splitlines()
    lines.insert(2, line)
    if error and line.endswith(","):
        lines.insert(3, "2]}")
    path.write_text("\n".join(lines), encoding="utf-8")
    if error:
        with pytest.raises(TraceError) as raised:
            read_trace(path)
        assert f"invalid JSON at {error}" in str(raised.value)
        return
    doc, _ = read_trace(path)
    blank = not line.strip()
    assert len(doc["nodes"]) == 2 + (not blank)
    if not blank:
        assert json.dumps(doc["nodes"][1]) == json.dumps(json.loads(line))


def test_jsonl_header_must_not_hold_nodes(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps(nodes_doc(comp(0))) + "\n", encoding="utf-8")
    with pytest.raises(TraceError) as raised:
        load_trace(path, RANKS)
    assert raised.value.field == "nodes"


@pytest.mark.parametrize("doc, field, words", [
    ([1, 2], None, ["top level must be an object", "an array"]),
    (header(), "nodes", ["missing"]),
    (header(nodes={"0": {}}), "nodes", ["must be an array", "an object"]),
])
def test_bad_top_level(tmp_path, doc, field, words):
    error = one_problem(tmp_path, doc)
    assert_names(error, None, field, *words)


def test_unsupported_version(tmp_path):
    error = one_problem(tmp_path, nodes_doc(comp(0)) | {"version": 2})
    assert_names(error, None, "version", "unsupported trace version 2; this cmemu reads version 1")


@pytest.mark.parametrize("key, value, words", [
    ("schema", "chakra", ['must be "cmemu.trace"', '"chakra"']),
    ("time_unit", "us", ['must be "ns"']),
    ("system", 3, ["non-empty string"]),
    ("ranks", 4, ["unknown header field"]),
])
def test_bad_header_fields(tmp_path, key, value, words):
    error = one_problem(tmp_path, nodes_doc(comp(0)) | {key: value})
    assert_names(error, None, key, *words)


def test_unknown_type(tmp_path):
    error = one_problem(tmp_path, nodes_doc(comp(0), comp(7) | {"type": "COMP_NODE"}))
    assert_names(error, 7, "type", 'unknown type "COMP_NODE"', "COMM_SEND")


def coll(i, rank, ctype="ALL_REDUCE", group="g", **attrs):
    return {"id": i, "type": "COMM_COLL", "rank": rank,
            "attrs": {"comm_type": ctype, "comm_size": 64, "cmemu.group": group, **attrs}}


def test_collective_loads(tmp_path):
    doc = nodes_doc(coll(0, 0), coll(1, 1), coll(2, 2), groups={"g": [0, 1, 2]})
    trace = load_trace(write(tmp_path, doc), RANKS)
    assert [n.type for n in trace.nodes] == ["COMM_COLL"] * 3
    assert trace.header["groups"] == {"g": [0, 1, 2]}


@pytest.mark.parametrize("nodes, groups, node_id, field, words", [
    ([coll(0, 0), coll(1, 1, group="h")], {"g": [0, 1]}, 1, "cmemu.group", ["no group 'h'"]),
    ([coll(0, 0), coll(1, 3)], {"g": [0, 1]}, 1, "cmemu.group", ["rank 3 is not a member"]),
    ([coll(0, 0), coll(1, 1), coll(2, 0)], {"g": [0, 1]}, 2, "cmemu.group", ["rank 1 has 1 COMM_COLL"]),
    ([coll(0, 0), coll(1, 1, comm_size=65)], {"g": [0, 1]}, 1, "comm_size", ["differs from node 0"]),
    ([coll(0, 0, "MOE_DISPATCH"), coll(1, 1, "MOE_DISPATCH")], {"g": [0, 1]}, 0, "cmemu.tokens", ["needs"]),
    ([coll(0, 0, "BROADCAST", **{"cmemu.root": 5}), coll(1, 1, "BROADCAST", **{"cmemu.root": 5})],
     {"g": [0, 1]}, 0, "cmemu.root", ["not a member"]),
])
def test_collective_errors(tmp_path, nodes, groups, node_id, field, words):
    errors = problems(tmp_path, nodes_doc(*nodes, groups=groups))
    match = [e for e in errors if e.node_id == node_id and e.field == field]
    assert match, [str(e) for e in errors]
    assert_names(match[0], node_id, field, *words)


def test_collectives_in_opposite_orders_are_a_cycle(tmp_path):
    # Rank 0 runs the collective of group a, then b; rank 1 runs b, then a: neither can start.
    doc = nodes_doc(coll(0, 0, group="a"), coll(1, 0, group="b"), coll(2, 1, group="b"), coll(3, 1, group="a"),
                    groups={"a": [0, 1], "b": [0, 1]})
    error = one_problem(tmp_path, doc)
    assert "dependency cycle" in str(error) and "collective" in str(error)


def test_bad_groups(tmp_path):
    errors = problems(tmp_path, nodes_doc(comp(0), groups={"g": [0, 0], "h": [1], "k": [0, 99]}))
    assert [e.field for e in errors] == ["groups"] * 3


def test_rank_out_of_range(tmp_path):
    error = one_problem(tmp_path, nodes_doc(comp(0), comp(1, rank=RANKS)))
    assert_names(error, 1, "rank", f"rank {RANKS} is outside the system", f"0..{RANKS - 1}")


def test_peer_rank_out_of_range(tmp_path):
    errors = problems(tmp_path, nodes_doc(send(0, 0, 9), recv(1, 0, 0)))
    assert_names(errors[0], 0, "comm_dst", "rank 9 is outside the system")
    assert_names(errors[1], 1, "comm_src", "own rank 0")
    assert len(errors) == 2  # no "unmatched" noise on top of the real problems


def test_negative_size(tmp_path):
    doc = nodes_doc({"id": 2, "type": "MEM_STORE", "rank": 0, "attrs": {"tensor_size": -8}})
    assert_names(one_problem(tmp_path, doc), 2, "tensor_size", "must be >= 0, got -8")


def test_bool_is_not_an_int(tmp_path):
    error = one_problem(tmp_path, nodes_doc(comp(0, stream=True)))
    assert_names(error, 0, "stream", "expected an integer, got a boolean")


def test_bool_is_not_a_number(tmp_path):
    doc = nodes_doc({"id": 0, "type": "COMP", "rank": 0, "attrs": {"num_ops": False}})
    assert_names(one_problem(tmp_path, doc), 0, "num_ops", "expected a number, got a boolean")


@pytest.mark.parametrize("value, word", [(float("nan"), "NaN"), (float("inf"), "Infinity")])
def test_nan_and_infinity_are_rejected(tmp_path, value, word):
    doc = nodes_doc({"id": 3, "type": "COMP", "rank": 0, "attrs": {"cmemu.duration_ns": value}})
    assert word in json.dumps(doc)  # what Python writes, and its parser reads back
    assert_names(one_problem(tmp_path, doc), 3, "cmemu.duration_ns", word)


def test_fractional_value_where_int_expected(tmp_path):
    doc = nodes_doc(send(0, 0, 1, size=1.5), recv(1, 1, 0))
    errors = problems(tmp_path, doc)
    assert_names(errors[0], 0, "comm_size", "expected an integer, got 1.5")


def test_too_large_integer(tmp_path):
    doc = nodes_doc({"id": 0, "type": "MEM_LOAD", "rank": 0, "attrs": {"tensor_size": 2**53 + 1}})
    assert_names(one_problem(tmp_path, doc), 0, "tensor_size", "too large")


def test_duration_beyond_int64_picoseconds(tmp_path):
    doc = nodes_doc({"id": 0, "type": "COMP", "rank": 0,
                     "attrs": {"cmemu.duration_ns": 2**62 // 1000 + 1}})
    assert_names(one_problem(tmp_path, doc), 0, "cmemu.duration_ns", "too large", "2**62 ps")
    ok = nodes_doc({"id": 0, "type": "COMP", "rank": 0,
                    "attrs": {"cmemu.duration_ns": 2**62 // 1000}})
    assert problems(tmp_path, ok) == []


def test_comp_needs_work_or_duration(tmp_path):
    doc = nodes_doc({"id": 0, "type": "COMP", "rank": 0, "attrs": {"tensor_size": 4}})
    assert_names(one_problem(tmp_path, doc), 0, "num_ops", "num_ops", "cmemu.duration_ns")


def test_comp_work_and_duration_exclude_each_other(tmp_path):
    both = nodes_doc({"id": 0, "type": "COMP", "rank": 0,
                      "attrs": {"num_ops": 4, "cmemu.duration_ns": 4}})
    assert_names(one_problem(tmp_path, both), 0, "cmemu.duration_ns", "not both")
    dtype = nodes_doc({"id": 0, "type": "COMP", "rank": 0,
                       "attrs": {"cmemu.dtype": "fp16", "cmemu.duration_ns": 4}})
    assert_names(one_problem(tmp_path, dtype), 0, "cmemu.dtype", "only applies with num_ops")


@pytest.mark.parametrize("attrs, field, words", [
    ({"cmemu.unit": "cube"}, "cmemu.unit", ["aic, aiv", '"cube"']),
    ({"cmemu.dtype": "fp8"}, "cmemu.dtype", ["bf16"]),
    ({"cmemu.cores": 0}, "cmemu.cores", [">= 1"]),
    ({"flops": 3}, "flops", ["unknown attribute for COMP"]),
    ({"cmemu.flops": 3}, "cmemu.flops", ["unknown attribute for COMP"]),
])
def test_bad_comp_attrs(tmp_path, attrs, field, words):
    doc = nodes_doc({"id": 5, "type": "COMP", "rank": 0, "attrs": {"num_ops": 1, **attrs}})
    assert_names(one_problem(tmp_path, doc), 5, field, *words)


@pytest.mark.parametrize("change, field, words", [
    ({"name": ""}, "name", ["non-empty string"]),
    ({"name": 5}, "name", ["non-empty string", "got 5"]),
    ({"stream": -1}, "stream", [">= 0, got -1"]),
    ({"data_deps": 1}, "data_deps", ["array of node ids", "got 1"]),
    ({"ctrl_deps": None}, "ctrl_deps", ["array of node ids", "got null"]),
    ({"ctrl_deps": ["0"]}, "ctrl_deps", ["expected an integer", '"0"']),
    ({"attrs": [1]}, "attrs", ["must be an object"]),
    ({"rank": None}, "rank", ["expected an integer, got null"]),
])
def test_bad_node_fields(tmp_path, change, field, words):
    error = one_problem(tmp_path, nodes_doc(comp(0), comp(1, rank=1) | change))
    assert_names(error, 1, field, *words)


@pytest.mark.parametrize("missing", ["type", "rank"])
def test_missing_node_fields(tmp_path, missing):
    node = comp(1)
    del node[missing]
    assert_names(one_problem(tmp_path, nodes_doc(node)), 1, missing, "missing")


def test_unknown_node_field(tmp_path):
    error = one_problem(tmp_path, nodes_doc(comp(0) | {"duration_micros": 3}))
    assert_names(error, 0, "duration_micros", "unknown field")


def test_dependency_on_missing_node(tmp_path):
    error = one_problem(tmp_path, nodes_doc(comp(0), comp(1, ctrl_deps=[0, 42, 42])))
    assert_names(error, 1, "ctrl_deps", "no node with id 42")
    assert "42, 42" not in str(error)


def test_self_dependency(tmp_path):
    error = one_problem(tmp_path, nodes_doc(comp(0), comp(1, data_deps=[0, 1])))
    assert_names(error, 1, "data_deps", "depends on itself")


def test_duplicate_id(tmp_path):
    error = one_problem(tmp_path, nodes_doc(comp(0), comp(1), comp(0, rank=1)))
    assert_names(error, 0, "id", "duplicate id", "nodes[0]")


def test_node_without_valid_id_is_named_by_index(tmp_path):
    error = one_problem(tmp_path, nodes_doc(comp(0), comp(-1)))
    assert_names(error, None, "id", "nodes[1]", ">= 0")


def test_recv_without_send(tmp_path):
    doc = nodes_doc(send(0, 0, 1, comm_tag=1), recv(1, 1, 0, comm_tag=1), recv(2, 1, 0, comm_tag=1))
    error = one_problem(tmp_path, doc)
    assert_names(error, 2, "comm_src", "no matching COMM_SEND from rank 0 with comm_tag 1")


def test_send_without_recv(tmp_path):
    doc = nodes_doc(send(0, 0, 1), recv(1, 1, 0, comm_tag=3))
    errors = problems(tmp_path, doc)
    assert [(e.node_id, e.field) for e in errors] == [(0, "comm_dst"), (1, "comm_src")]
    assert "no matching COMM_RECV on rank 1 with comm_src 0 and comm_tag 0" in str(errors[0])


def test_size_mismatch(tmp_path):
    error = one_problem(tmp_path, nodes_doc(send(4, 0, 1, size=64), recv(9, 1, 0, size=65)))
    assert_names(error, 9, "comm_size", "65", "64", "COMM_SEND 4")


def test_plane_mismatch(tmp_path):
    doc = nodes_doc(send(4, 0, 1, **{"cmemu.plane": "rdma"}), recv(9, 1, 0))
    assert_names(one_problem(tmp_path, doc), 9, "cmemu.plane", "'ub'", "'rdma'", "COMM_SEND 4")


def test_dependency_cycle(tmp_path):
    doc = nodes_doc(comp(3, data_deps=[5]), comp(4, rank=1), comp(5, rank=2, data_deps=[3]))
    error = one_problem(tmp_path, doc)
    assert_names(error, 3, "data_deps", "dependency cycle: 3 -> 5 -> 3")
    assert "stream" not in str(error)


def test_dependency_cycle_through_ctrl_deps_names_smallest_id(tmp_path):
    doc = nodes_doc(comp(8, rank=1, ctrl_deps=[6]), comp(6, rank=2, data_deps=[7]),
                    comp(7, rank=3, ctrl_deps=[8]))
    error = one_problem(tmp_path, doc)
    assert_names(error, 6, "data_deps", "dependency cycle: 6 -> 7 -> 8 -> 6")


def test_dependency_cycle_through_stream_order(tmp_path):
    # 1 runs after 0 on rank 0 stream 0, and 0 waits for 1.
    doc = nodes_doc(comp(0, data_deps=[1]), comp(1))
    error = one_problem(tmp_path, doc)
    assert_names(error, 0, "data_deps", "dependency cycle: 0 -> 1 -> 0", "stream order",
                 "1 comes after 0 on rank 0 stream 0")


def test_dependency_cycle_through_a_message(tmp_path):
    # Each rank receives before it sends: the classic head-to-head deadlock.
    doc = nodes_doc(recv(0, 0, 1), send(1, 0, 1), recv(2, 1, 0), send(3, 1, 0))
    error = one_problem(tmp_path, doc)
    assert_names(error, 0, "comm_src", "dependency cycle: 0 -> 3 -> 2 -> 1 -> 0",
                 "COMM_RECV 0 waits for COMM_SEND 3", "stream order")


def test_cycle_in_a_long_chain_needs_no_recursion(tmp_path):
    n = 100_000
    nodes = [{"id": i, "type": "MEM_LOAD", "rank": i % RANKS, "data_deps": [i + 1],
              "attrs": {"tensor_size": 1}} for i in range(n - 1)]
    nodes.append({"id": n - 1, "type": "MEM_LOAD", "rank": 0, "data_deps": [0],
                  "attrs": {"tensor_size": 1}})
    errors = check_trace(nodes_doc(*nodes), "long.json", RANKS)
    assert len(errors) == 1 and errors[0].node_id == 0
    assert f"-> {n - 1} -> 0 (" in str(errors[0])


def test_all_problems_reported_in_file_order(tmp_path):
    doc = nodes_doc(
        comp(0, rank=99),
        {"id": 1, "type": "COMM_COLL", "rank": 0},
        send(2, 0, 1, size=-1),
        comp(3, data_deps=[77]),
        "not a node",
        recv(5, 1, 0, size=3),  # matches send 2: its size is wrong, but it is not missing
        recv(6, 1, 2),
        **{"version": 3},
    )
    errors = problems(tmp_path, doc)
    assert [(e.node_id, e.field) for e in errors] == [
        (None, "version"), (0, "rank"), (1, "comm_type"), (1, "cmemu.group"), (2, "comm_size"), (3, "data_deps"),
        (None, None), (6, "comm_src"),
    ]
    assert "nodes[4] must be an object" in str(errors[6])
    with pytest.raises(TraceError) as raised:
        load_trace(tmp_path / "t.json", RANKS)
    assert str(raised.value).endswith("(and 7 more problems)")
    assert raised.value.field == "version"


def test_nodes_sharing_one_attrs_dict_check_as_if_each_had_its_own():
    # A generated document shares one attrs dict among the nodes of one shape (cmemu.models.step);
    # the checker finds them again by identity, with what it finds for copies of them.
    good, bad, size = {"num_ops": 1000, "cmemu.cores": 2}, {"num_ops": -1}, {"tensor_size": 8}
    kinds = [("COMP", good), ("COMP", bad), ("MEM_LOAD", size), ("COMP", good), ("MEM_STORE", size),
             ("COMP", bad), ("MEM_LOAD", size), ("COMP", good), ("MEM_STORE", size)]
    shared = nodes_doc(*[{"id": i, "type": t, "rank": i % 2, "attrs": a} for i, (t, a) in enumerate(kinds)])
    copied = json.loads(json.dumps(shared))

    def found(doc):
        errors = check_trace(doc, "t.json", RANKS, node_check=lambda t, a: [("cmemu.cores", "no")] if t == "COMP"
                             else [])
        return [(e.node_id, e.field, str(e)) for e in errors]

    assert found(shared) == found(copied)
    assert any("and 2 more nodes with these attributes" in e[2] for e in found(shared))
    del shared["nodes"][5], shared["nodes"][1]
    del copied["nodes"][5], copied["nodes"][1]
    nodes = load_trace("t.json", RANKS, read=(shared, "")).nodes
    assert nodes == load_trace("t.json", RANKS, read=(copied, "")).nodes
    assert nodes[0].attrs is nodes[2].attrs and nodes[1].attrs is nodes[4].attrs
    assert nodes[6].attrs is nodes[3].attrs is not nodes[1].attrs  # a type's own, though one raw dict


def test_check_trace_never_raises_on_odd_content():
    odd = [None, 0, "x", [], {}, {"nodes": None}, {"nodes": [None, [], {"id": []}]},
           nodes_doc({"id": 0, "type": ["COMP"], "rank": {}, "stream": None, "data_deps": 1,
                      "ctrl_deps": [[1]], "attrs": [], "name": 4}),
           nodes_doc({"id": 0, "type": "COMP", "rank": 0, "attrs": {"num_ops": "9"}})]
    for doc in odd:
        assert check_trace(doc, "odd.json", RANKS)


def test_num_ranks_must_be_positive():
    with pytest.raises(ValueError):
        check_trace(nodes_doc(), "x.json", 0)


# ------------------------------------------------------------------- the shipped JSON Schema


@pytest.fixture(scope="module")
def schema():
    doc = json.loads(schema_path().read_text(encoding="utf-8"))
    jsonschema.Draft202012Validator.check_schema(doc)
    return jsonschema.Draft202012Validator(doc)


def test_schema_accepts_valid_traces(schema):
    schema.validate(valid_doc())
    schema.validate(nodes_doc(comp(0), comp(1, data_deps=[0])))
    schema.validate(nodes_doc(*[send(i, 0, 1) for i in range(3)]
                              + [recv(10 + i, 1, 0) for i in range(3)]))
    schema.validate(nodes_doc({"id": 0, "type": "COMP", "rank": 0,
                               "attrs": {"cmemu.duration_ns": 1, "cmemu.cores": 1}}))


@pytest.mark.parametrize("doc", [
    nodes_doc(comp(0)) | {"version": 2},
    nodes_doc(comp(0)) | {"ranks": 4},
    nodes_doc(comp(0) | {"type": "COMM_COLL"}),
    nodes_doc(comp(0, stream=-1)),
    nodes_doc(comp(0, rank=True)),
    nodes_doc({"id": 0, "type": "MEM_LOAD", "rank": 0, "attrs": {"tensor_size": -1}}),
    nodes_doc({"id": 0, "type": "MEM_LOAD", "rank": 0}),
    nodes_doc(comp(0) | {"attrs": {"num_ops": 1, "cmemu.duration_ns": 1}}),
    nodes_doc(comp(0) | {"attrs": {"tensor_size": 1}}),
    nodes_doc(comp(0) | {"attrs": {"cmemu.duration_ns": 1, "num_opz": 1}}),
    nodes_doc({"id": 0, "type": "COMM_SEND", "rank": 0, "attrs": {"comm_size": 1}}),
    nodes_doc(recv(0, 0, 1, **{"cmemu.plane": "pcie"})),
])
def test_schema_rejects_invalid_traces(schema, tmp_path, doc):
    assert not schema.is_valid(doc)
    assert problems(tmp_path, doc), "the loader must reject what the schema rejects"


# ------------------------------------------------------------ cycles against a reference


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 1),
                          st.lists(st.integers(0, 11), max_size=3)), min_size=1, max_size=12))
def test_cycle_found_exactly_when_graphlib_finds_one(spec):
    """Random nodes (rank, stream, deps): a cycle error iff graphlib's sorter finds a cycle."""
    nodes = []
    graph = {}
    last = {}
    for nid, (rank, stream, deps) in enumerate(spec):
        deps = [d for d in deps if d < len(spec) and d != nid]
        nodes.append(comp(nid, rank=rank, stream=stream, ctrl_deps=deps))
        graph[nid] = set(deps) | ({last[rank, stream]} if (rank, stream) in last else set())
        last[rank, stream] = nid
    errors = check_trace(nodes_doc(*nodes), "p.json", 3)
    try:
        graphlib.TopologicalSorter(graph).prepare()
        cyclic = False
    except graphlib.CycleError:
        cyclic = True
    if not cyclic:
        assert errors == []
        return
    assert len(errors) == 1
    text = str(errors[0])
    named = text.split("dependency cycle: ")[1].split(" (")[0].split(" -> ")
    ids = [int(x) for x in named]
    assert ids[0] == ids[-1] == errors[0].node_id == min(ids)
    assert len(set(ids)) == len(ids) - 1
    for a, b in zip(ids, ids[1:]):
        assert b in graph[a], (a, b, graph)  # a really waits for b


def test_node_types_constant():
    assert NODE_TYPES == ("COMP", "COMM_SEND", "COMM_RECV", "MEM_LOAD", "MEM_STORE", "COMM_COLL")
