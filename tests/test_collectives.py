"""COMM_COLL lowering: MoE dispatch/combine and collectives."""
import json

import numpy as np
import pytest

from cmemu.fabric import build_fabric
from cmemu.lower import lower
from cmemu.workload.moe import dispatch_payload_byte, moe_routing
from cmemu.run import run_trace, simulate
from cmemu.spec import load_system
from cmemu.topology import build_topology
from cmemu.trace import load_trace

HIDDEN = 7168


def coll_doc(ranks, *colls, extra_nodes=()):
    nodes = list(extra_nodes)
    for name, attrs in colls:
        for r in ranks:
            nodes.append({"id": len(nodes), "name": name, "type": "COMM_COLL", "rank": r, "stream": 1,
                          "attrs": {"cmemu.group": "g", **attrs}})
    return {"schema": "cmemu.trace", "version": 1, "time_unit": "ns", "system": "mini",
            "groups": {"g": list(ranks)}, "nodes": nodes}


def moe(ctype, tokens=4, top_k=2, **kw):
    """MoE collective attributes; keyword arguments without a dot get the cmemu. prefix."""
    kw = {(k if "." in k else f"cmemu.{k}"): v for k, v in kw.items()}
    return {"comm_type": ctype, "cmemu.tokens": tokens, "cmemu.top_k": top_k, "cmemu.hidden": HIDDEN, **kw}


def lowered_of(tmp_path, doc):
    path = tmp_path / "t.json"
    path.write_text(json.dumps(doc))
    topo = build_topology(load_system("mini"))
    trace = load_trace(path, topo.num_dies)
    return lower(trace, topo), topo


def test_dispatch_payload_is_the_padded_int8_token():
    # 7,168 B of INT8 + a 4 B scale, padded to 512 B: 7.5 KB (docs/machine.md 2.5).
    assert dispatch_payload_byte(7168) == 7680


def test_sdma_dispatch_messages_per_destination_by_hand(tmp_path):
    # On SDMA a member stages its pairs per destination and sends each destination one
    # descriptor's write: all its pairs for that die, 7,680 B each (the padded INT8 token).
    ranks = [0, 2, 4, 6]
    L, _ = lowered_of(tmp_path, coll_doc(ranks, ("dispatch", moe("MOE_DISPATCH", seed=3, engine="sdma"))))
    routing = moe_routing(4, 2, 4, 4, 0.0, 3)  # [source, token, k] -> destination member
    data = L.msg_bytes % 7680 == 0
    for s in range(4):
        for d in range(4):
            n = 0 if s == d else int((routing[s] == d).sum())
            sel = data & (L.msg_src == ranks[s]) & (L.msg_dst == ranks[d])
            assert int(L.msg_bytes[sel].sum()) == n * 7680, (s, d)
            assert int(sel.sum()) == (1 if n else 0)
    # Every token goes to top_k distinct experts.
    assert all(len(set(tok)) == 2 for tok in routing.reshape(-1, 2).tolist())
    # One 32 B status flag from every member to every other.
    flags = L.msg_bytes == 32
    assert flags.sum() == 4 * 3


def test_a_flag_is_never_seen_before_its_data(tmp_path):
    ranks = list(range(0, 16, 2))
    L, topo = lowered_of(tmp_path, coll_doc(ranks, ("dispatch", moe("MOE_DISPATCH", tokens=16, top_k=4))))
    e = simulate(L, build_fabric(topo))
    delivered = np.asarray(e.msg_delivered_ps)
    flags = np.flatnonzero(L.msg_bytes == 32)
    data = np.flatnonzero(L.msg_bytes != 32)
    for f in flags:
        same = data[(L.msg_src[data] == L.msg_src[f]) & (L.msg_dst[data] == L.msg_dst[f])]
        if same.size:
            assert delivered[f] > delivered[same].max()


def test_combine_sends_every_pair_back_to_its_source(tmp_path):
    ranks = [1, 3, 5, 7, 9]
    attrs = moe("MOE_DISPATCH", tokens=6, top_k=3, seed=7, experts=10)
    back = dict(attrs, comm_type="MOE_COMBINE")
    L, _ = lowered_of(tmp_path, coll_doc(ranks, ("dispatch", attrs), ("combine", back)))
    out = (L.msg_bytes == 7212)  # a dispatch write: the INT8 token, its scale slot and (rank, token, k)
    ret = (L.msg_bytes == 2 * HIDDEN)
    for a in ranks:
        for b in ranks:
            if a != b:
                there = int(np.sum(out & (L.msg_src == a) & (L.msg_dst == b)))
                back_n = int(np.sum(ret & (L.msg_src == b) & (L.msg_dst == a)))
                assert there == back_n, (a, b)
    # The status flags: dispatch, one per (source, expert on another member); combine, one per row.
    flags = L.msg_bytes == 32
    assert int(flags.sum()) == 5 * 8 + int(ret.sum())
    assert set(L.msg_bytes[~(out | ret | flags)].tolist()) == set()


def test_aiv_direct_occupies_vector_cores(tmp_path):
    # A vector kernel on all 48 AIV of die 0, ready 1 us after an AIV-Direct dispatch on another
    # stream started: the dispatch's token loads hold AIVs, so the kernel waits for them and ends
    # later than it does alone.
    kernel = [{"id": 0, "name": "before", "type": "COMP", "rank": 0, "stream": 0, "attrs": {"cmemu.duration_ns": 1000}},
              {"id": 1, "name": "vector_kernel", "type": "COMP", "rank": 0, "stream": 0,
               "attrs": {"cmemu.op": "softmax", "cmemu.rows": 4096, "cmemu.cols": 1024}}]
    alone = run_trace(_write(tmp_path, "a.json", {**coll_doc([0, 2]), "nodes": kernel}), progress=False)
    doc = coll_doc([0, 2], ("dispatch", moe("MOE_DISPATCH", tokens=64, top_k=2)), extra_nodes=kernel)
    both = run_trace(_write(tmp_path, "b.json", doc), progress=False)
    assert both.op_end_ps[1] > alone.op_end_ps[1]


def _write(tmp_path, name, doc):
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return path


@pytest.mark.parametrize("engine", ["sdma", "aiv"])
def test_collective_bytes_on_the_fabric(tmp_path, engine):
    ranks = [0, 4, 8, 12]
    size = 1 << 20
    for ctype, per_rank in [("ALL_GATHER", 3 * size), ("ALL_TO_ALL", 3 * size),
                            ("REDUCE_SCATTER", 3 * size // 4), ("ALL_REDUCE", 2 * 3 * size // 4)]:
        L, _ = lowered_of(tmp_path, coll_doc(ranks, (ctype, {"comm_type": ctype, "comm_size": size,
                                                            "cmemu.engine": engine})))
        data = L.msg_bytes != 32
        for r in ranks:
            assert int(L.msg_bytes[data & (L.msg_src == r)].sum()) == per_rank, (ctype, r)
    L, _ = lowered_of(tmp_path, coll_doc(ranks, ("bcast", {"comm_type": "BROADCAST", "comm_size": size,
                                                           "cmemu.root": 8, "cmemu.engine": engine})))
    data = L.msg_bytes != 32
    assert set(L.msg_src[data].tolist()) == {8} and int(L.msg_bytes[data].sum()) == 3 * size


def test_collective_spans_and_tasks_in_the_timeline(tmp_path):
    doc = coll_doc([0, 2, 4, 6], ("a2a", {"comm_type": "ALL_TO_ALL", "comm_size": 65536, "cmemu.engine": "aiv"}))
    r = run_trace(_write(tmp_path, "t.json", doc), progress=False)
    assert r.lowered.num_ops == 4  # the trace's own nodes; the rest are tasks
    assert np.all(r.op_end_ps > r.op_start_ps)
    assert r.tasks is not None and set(r.tasks["op"].tolist()) == {0, 1, 2, 3}
    # Nothing ends before its collective started, or after it ended.
    for op in range(4):
        mine = r.tasks["op"] == op
        assert r.tasks["start_ps"][mine].min() >= r.op_start_ps[op]
        assert r.tasks["end_ps"][mine].max() <= r.op_end_ps[op]


def test_sdma_startup_makes_small_collectives_slower_than_aiv(tmp_path):
    ranks = list(range(0, 16, 2))
    t = {}
    for engine in ("sdma", "aiv"):
        doc = coll_doc(ranks, ("a2a", {"comm_type": "ALL_TO_ALL", "comm_size": 4096, "cmemu.engine": engine}))
        r = run_trace(_write(tmp_path, f"{engine}.json", doc), progress=False)
        t[engine] = int((r.op_end_ps - r.op_start_ps).max())
    assert t["sdma"] > t["aiv"]


def test_deterministic(tmp_path):
    doc = coll_doc(list(range(8)), ("d", moe("MOE_DISPATCH", tokens=32, top_k=4)), ("c", moe("MOE_COMBINE", tokens=32, top_k=4)))
    a = run_trace(_write(tmp_path, "x.json", doc), progress=False)
    b = run_trace(_write(tmp_path, "x.json", doc), progress=False)
    np.testing.assert_array_equal(a.op_end_ps, b.op_end_ps)
    np.testing.assert_array_equal(a.tasks["end_ps"], b.tasks["end_ps"])


@pytest.mark.parametrize("faults", [None, [{"fail": "l2:0.1", "at_ns": 10000}]])
def test_native_and_reference_agree_on_collectives(tmp_path, faults):
    # MoE dispatch and combine on AIV-Direct (a send op per batch of writes, one flag send and one
    # flag receive per member), an SDMA all-to-all and an AIV all-reduce, with a vector kernel
    # sharing die 0's cores and HBM; with and without an L2 chip failing mid-run.
    ranks = [0, 3, 8, 17, 30]
    kernel = [{"id": 0, "name": "vector_kernel", "type": "COMP", "rank": 0, "stream": 0,
               "attrs": {"cmemu.op": "softmax", "cmemu.rows": 2048, "cmemu.cols": 1024}}]
    doc = coll_doc(ranks, ("dispatch", moe("MOE_DISPATCH", tokens=24, top_k=3)),
                   ("combine", moe("MOE_COMBINE", tokens=24, top_k=3)),
                   ("a2a", {"comm_type": "ALL_TO_ALL", "comm_size": 300_000, "cmemu.engine": "sdma"}),
                   ("ar", {"comm_type": "ALL_REDUCE", "comm_size": 200_000, "cmemu.engine": "aiv"}),
                   extra_nodes=kernel)
    if faults:
        doc["cmemu.faults"] = faults
    a = run_trace(_write(tmp_path, "n.json", doc), progress=False)
    b = run_trace(_write(tmp_path, "r.json", doc), progress=False, native=False)
    np.testing.assert_array_equal(a.op_start_ps, b.op_start_ps)
    np.testing.assert_array_equal(a.op_end_ps, b.op_end_ps)
    np.testing.assert_array_equal(a.msg_delivered_ps, b.msg_delivered_ps)
    assert a.events == b.events and a.packets_sent == b.packets_sent and a.packets_lost == b.packets_lost
    if faults:
        assert a.packets_lost > 0  # the failure hit traffic in flight
