"""The front end's shortcuts (trace loading and lowering) give what the plain way gives.

Loading shares one checked attrs dict (and name) between equal nodes, keeps its own copies of
the document's values, and skips the full cycle search when the file order already is one;
lowering costs a COMP once per (type, attrs dict) and builds its arrays in growing columns.
Each test checks a shortcut against the result it must not change, or the error it must keep.
"""
import json

import numpy as np
import pytest

from cmemu.errors import TraceError
from cmemu.lower import lower
from cmemu.lower.comm import Columns, MessageTable
from cmemu.spec import load_system
from cmemu.topology import build_topology
from cmemu.trace import load_trace, read_trace

RANKS = 32
HEADER = {"schema": "cmemu.trace", "version": 1, "time_unit": "ns"}


def write(tmp_path, nodes, name="t.json", **header):
    path = tmp_path / name
    path.write_text(json.dumps({**HEADER, **header, "nodes": nodes}))
    return path


@pytest.fixture(scope="module")
def mini():
    return build_topology(load_system("mini"))


def gemm(i, rank=0, cores=8, **extra):
    return {"id": i, "name": f"gemm{i % 3}", "type": "COMP", "rank": rank, "data_deps": [i - 1] if i else [],
            "attrs": {"cmemu.op": "gemm", "cmemu.m": 64, "cmemu.n": 256, "cmemu.k": 512, "cmemu.cores": cores, **extra}}


def test_equal_attributes_share_one_dict_and_name(tmp_path):
    trace = load_trace(write(tmp_path, [gemm(i, rank=i % 4) for i in range(9)]), RANKS)
    assert len({id(n.attrs) for n in trace.nodes}) == 1
    assert trace.nodes[0].name is trace.nodes[3].name
    assert trace.nodes[0].attrs == {"cmemu.op": "gemm", "cmemu.m": 64, "cmemu.n": 256, "cmemu.k": 512,
                                    "cmemu.cores": 8, "cmemu.unit": "aic", "cmemu.dtype": "bf16"}


def test_values_equal_in_a_tuple_are_not_merged(tmp_path):
    # 1, 1.0 and true are equal as tuple items: each keeps its own check and its own type.
    nodes = [{"id": 0, "type": "COMP", "rank": 0, "attrs": {"num_ops": 1}},
             {"id": 1, "type": "COMP", "rank": 0, "attrs": {"num_ops": 1.0}}]
    trace = load_trace(write(tmp_path, nodes), RANKS)
    assert [type(n.attrs["num_ops"]) for n in trace.nodes] == [int, float]
    nodes = [gemm(0, cores=1), gemm(1, cores=True)]
    with pytest.raises(TraceError) as err:
        load_trace(write(tmp_path, nodes), RANKS)
    assert err.value.node_id == 1 and err.value.field == "cmemu.cores"


def test_the_trace_keeps_none_of_the_documents_values(tmp_path):
    nodes = [{**gemm(1000 + i, rank=300 + i), "data_deps": [1000 + i - 1] if i else []} for i in range(3)]
    path = write(tmp_path, nodes)
    read = read_trace(path)
    doc = read[0]
    trace = load_trace(path, 768, read=read)
    for raw, node in zip(doc["nodes"], trace.nodes):
        assert node.id == raw["id"] and node.id is not raw["id"]
        assert node.rank == raw["rank"] and node.rank is not raw["rank"]
        assert node.name == raw["name"] and node.name is not raw["name"]
        for key, value in raw["attrs"].items():
            assert node.attrs[key] == value and (node.attrs[key] is not value or -5 <= value <= 256)
    assert trace.nodes[2].data_deps[0] is trace.nodes[1].id


def test_a_collective_whose_member_leads_back_before_its_last_member_still_loads(tmp_path):
    # Rank 0's member (node 0) has a successor (node 1) that comes before rank 1's member (node
    # 2): the file order with the collective at its last member is not an order, the full search
    # runs and finds no cycle.
    coll = {"comm_type": "ALL_REDUCE", "comm_size": 64, "cmemu.group": "g"}
    nodes = [{"id": 0, "type": "COMM_COLL", "rank": 0, "attrs": coll},
             {"id": 1, "type": "COMP", "rank": 0, "data_deps": [0], "attrs": {"num_ops": 10}},
             {"id": 2, "type": "COMM_COLL", "rank": 1, "attrs": coll},
             {"id": 3, "type": "COMP", "rank": 1, "data_deps": [2, 1], "attrs": {"num_ops": 10}}]
    trace = load_trace(write(tmp_path, nodes, groups={"g": [0, 1]}), RANKS)
    assert [n.id for n in trace.nodes] == [0, 1, 2, 3]
    # A member that waits for what follows the other member is a cycle, found either way.
    nodes[2] = {**nodes[2], "data_deps": [1]}
    with pytest.raises(TraceError, match="dependency cycle"):
        load_trace(write(tmp_path, nodes, groups={"g": [0, 1]}), RANKS)


def test_a_comp_is_costed_once_per_shape_as_if_each_node_had_its_own(tmp_path, mini):
    # An unhashable 'x-' value keeps every node's attrs dict its own: the per-node way.
    shared = load_trace(write(tmp_path, [gemm(i, rank=i % 4) for i in range(12)], "a.json"), RANKS)
    own = load_trace(write(tmp_path, [gemm(i, rank=i % 4, **{"x-n": [i]}) for i in range(12)], "b.json"), RANKS)
    assert len({id(n.attrs) for n in own.nodes}) == 12
    a, b = lower(shared, mini), lower(own, mini)
    for name in ("op_dur_ps", "op_aic", "op_aiv", "op_hbm_bytes", "succ_ptr", "succ_idx", "pipe_task_op",
                 "pipe_task_pipe", "pipe_task_busy_ps"):
        assert np.array_equal(getattr(a, name), getattr(b, name)), name
    assert a.pipe_task_op.size > 12


def test_a_bad_shape_is_named_by_its_first_node(tmp_path, mini):
    trace = load_trace(write(tmp_path, [gemm(0), gemm(1, cores=99), gemm(2), gemm(3, cores=99)]), RANKS)
    with pytest.raises(TraceError) as err:
        lower(trace, mini)
    assert err.value.node_id == 1 and err.value.field == "cmemu.cores"


def test_columns_grow_in_place_and_are_taken_once():
    cols = Columns({"a": np.int32, "b": np.int64}, {"b": -1})
    for k in range(50):
        cols.append(100, {"a": np.arange(k * 100, (k + 1) * 100)})
    out = cols.take()
    assert np.array_equal(out["a"], np.arange(5000)) and out["a"].dtype == np.int32
    assert out["b"].shape == (5000,) and (out["b"] == -1).all()
    with pytest.raises(RuntimeError):
        cols.take()
    with pytest.raises(RuntimeError):
        cols.append(1, {"a": 0})


def test_message_table_keeps_single_and_batched_messages_in_order(mini):
    table = MessageTable()
    table.add(mini, 0, 2, 64, "ub", send_op=0, recv_op=1)
    table.add_many(mini, np.array([1, 2]), np.array([3, 0]), 128, np.array([2, 3]), -1)
    table.add(mini, 3, 1, 32, "rdma", send_op=4, recv_op=5)
    arrays = table.arrays()
    assert arrays["msg_src"].tolist() == [0, 1, 2, 3] and arrays["msg_bytes"].tolist() == [64, 128, 128, 32]
    assert arrays["msg_send_op"].tolist() == [0, 2, 3, 4] and arrays["msg_recv_op"].tolist() == [1, -1, -1, 5]
    with pytest.raises(RuntimeError):
        table.arrays()
