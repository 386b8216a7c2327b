"""Lowering in blocks: a collective lowered once per shape and placed again, arrays assembled at
their final size, and the per-op lists built by Numba kernels (cmemu/lower/builder.py, passes.py).

Each shortcut is checked against the plain way: every collective lowered on its own, and the
numpy references of the kernels.
"""
import json

import numpy as np
import pytest

import cmemu.lower.collectives as collectives
from cmemu._core import op_message_lists
from cmemu.errors import TraceError
from cmemu.lower import Lowered, lower
from cmemu.lower.builder import Block, OpBuilder, _Ids
from cmemu.lower.passes import (
    early_successor,
    leading_kept,
    leading_kept_reference,
    early_successor_reference,
    hbm_demand,
    hbm_demand_reference,
    message_lists,
    message_lists_reference,
    name_messages,
    name_messages_reference,
    shift_own,
    shift_own_reference,
    successor_csr,
    successor_csr_reference,
)
from cmemu.spec import load_system
from cmemu.topology import build_topology
from cmemu.trace import load_trace
from conftest import assert_same_fields


@pytest.fixture(scope="module")
def mini():
    return build_topology(load_system("mini"))


COLLS = {
    "dispatch": {"comm_type": "MOE_DISPATCH", "cmemu.tokens": 6, "cmemu.top_k": 2, "cmemu.hidden": 7168},
    "combine": {"comm_type": "MOE_COMBINE", "cmemu.tokens": 6, "cmemu.top_k": 2, "cmemu.hidden": 7168,
                "cmemu.engine": "sdma"},
    "allreduce": {"comm_type": "ALL_REDUCE", "comm_size": 300_000, "cmemu.engine": "aiv"},
    "gather": {"comm_type": "ALL_GATHER", "comm_size": 4096},
    "bcast": {"comm_type": "BROADCAST", "comm_size": 1000, "cmemu.root": 6},
}


def layered_trace(tmp_path, layers, own_attrs: bool, name="t.json"):
    """Layers of [a GEMM per rank, then each collective] on two groups, plus a message; with
    ``own_attrs`` every node gets an unhashable 'x-' attribute, so no two share an attrs dict
    (each collective is then lowered on its own)."""
    groups = {"a": [0, 2, 4, 6], "b": [1, 3, 5, 7, 9]}
    nodes = []
    last = {}
    for layer in range(layers):
        for g, ranks in groups.items():
            for r in ranks:
                nodes.append({"id": len(nodes), "name": f"gemm{layer}", "type": "COMP", "rank": r,
                              "data_deps": [last[r]] if r in last else [],
                              "attrs": {"cmemu.op": "gemm", "cmemu.m": 64, "cmemu.n": 256, "cmemu.k": 512}})
                last[r] = nodes[-1]["id"]
            for cname, attrs in COLLS.items():
                if cname == "bcast" and g == "b":
                    continue
                for r in ranks:
                    nodes.append({"id": len(nodes), "name": f"{cname}{layer}", "type": "COMM_COLL", "rank": r,
                                  "stream": 1, "data_deps": [last[r]], "attrs": {"cmemu.group": g, **attrs}})
                    last[r] = nodes[-1]["id"]
    nodes.append({"id": len(nodes), "type": "COMM_SEND", "rank": 0, "data_deps": [last[0]],
                  "attrs": {"comm_dst": 1, "comm_size": 5000}})
    nodes.append({"id": len(nodes), "type": "COMM_RECV", "rank": 1, "attrs": {"comm_src": 0, "comm_size": 5000}})
    if own_attrs:
        for i, node in enumerate(nodes):
            node["attrs"]["x-own"] = [i]
    path = tmp_path / name
    path.write_text(json.dumps({"schema": "cmemu.trace", "version": 1, "time_unit": "ns", "system": "mini",
                                "groups": groups, "nodes": nodes}))
    return path


def test_collectives_placed_again_equal_each_lowered_on_its_own(tmp_path, mini, monkeypatch):
    calls = []
    real = collectives.lower_collective
    monkeypatch.setattr(collectives, "lower_collective", lambda b, *a: calls.append(b.base) or real(b, *a))
    shared = lower(load_trace(layered_trace(tmp_path, 3, own_attrs=False), mini.num_dies), mini)
    assert len(calls) == 9  # 5 collectives on group a, 4 on group b: once each
    calls.clear()
    own = lower(load_trace(layered_trace(tmp_path, 3, own_attrs=True, name="own.json"), mini.num_dies), mini)
    assert len(calls) == 27
    assert_same_fields(shared, own, skip=("msg_segments",))
    # Every member's report start (its entry), each in its own collective's ops.
    assert shared.num_messages > 1000 and (shared.op_report_start >= 0).sum() == 3 * (5 * 4 + 4 * 5)
    # The segments: in order, covering every message; each collective lowered on its own is its own
    # template; one placed again repeats its template's messages with their ops moved.
    for lowered in (shared, own):
        seg = lowered.msg_segments
        assert seg[0, 0] == 0 and np.array_equal(seg[1:, 0], seg[:-1, 0] + seg[:-1, 1])
        assert seg[:, 1].sum() == lowered.num_messages
    assert np.array_equal(own.msg_segments[:, 2], own.msg_segments[:, 0]) and not own.msg_segments[:, 3].any()
    copies = shared.msg_segments[shared.msg_segments[:, 2] != shared.msg_segments[:, 0]]
    assert len(copies) == 27 - 9  # every collective but the first of its shape
    for lo, n, tpl, shift in copies.tolist():
        for name in ("msg_src", "msg_dst", "msg_bytes", "msg_kind", "msg_path"):
            assert np.array_equal(getattr(shared, name)[lo:lo + n], getattr(shared, name)[tpl:tpl + n]), name
        for name in ("msg_send_op", "msg_recv_op"):
            got, template = getattr(shared, name)[lo:lo + n], getattr(shared, name)[tpl:tpl + n]
            assert np.array_equal(got, np.where(template >= 0, template + shift, -1)), name


def test_a_bad_collective_is_named_by_its_first_node(tmp_path, mini):
    nodes = [{"id": 10 * k + r, "type": "COMM_COLL", "rank": r, "stream": 1,
              "attrs": {"cmemu.group": "g", "comm_type": "ALL_TO_ALL", "comm_size": 64, "cmemu.cores": 99}}
             for k in range(2) for r in (0, 1)]
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"schema": "cmemu.trace", "version": 1, "time_unit": "ns", "groups": {"g": [0, 1]},
                                "nodes": nodes}))
    with pytest.raises(TraceError) as err:
        lower(load_trace(path, mini.num_dies), mini)
    assert err.value.node_id == 0 and err.value.field == "cmemu.cores"


def test_a_block_names_only_its_own_and_its_members_ops(mini):
    b = OpBuilder(base=100)
    ops = b.ops(3, kind=0, parent=7)
    b.edges(ops[:2], ops[1:])
    b.edges(ops[2], 7)
    b.messages_between(mini, [0, 2], [2, 0], 64, ops[1], -1)
    block = b.block(members=[7])
    out = np.empty(3, dtype=np.int32)
    block.place("dst", out, 500, np.array([42]))
    assert out.tolist() == [501, 502, 42]
    block.place("msg_recv_op", out[:2], 500, np.array([42]))
    assert out[:2].tolist() == [-1, -1]
    with pytest.raises(RuntimeError, match="op 8, neither its own nor a member's"):
        _Ids(np.array([100, 8]), 100, 3, np.array([7]))
    fixed = OpBuilder().block()
    assert isinstance(fixed, Block)
    with pytest.raises(RuntimeError):
        fixed.place("src", np.empty(0, dtype=np.int32), 5, None)


@pytest.mark.parametrize("seed", range(8))
def test_kernels_equal_their_references(seed):
    rng = np.random.default_rng(seed)
    n, e, m = int(rng.integers(1, 60)), int(rng.integers(0, 300)), int(rng.integers(0, 300))
    src, dst = rng.integers(0, n, e).astype(np.int32), rng.integers(0, n, e).astype(np.int32)
    for got, want in zip(successor_csr(src, dst, n), successor_csr_reference(src, dst, n)):
        assert got.dtype == want.dtype and np.array_equal(got, want)
    send, recv = rng.integers(-1, n + 3, m).astype(np.int32), rng.integers(-1, n + 3, m).astype(np.int32)
    msg = np.where(rng.random(n) < 0.3, rng.integers(0, 9, n), -1).astype(np.int32)
    a, b = msg.copy(), msg.copy()
    name_messages(a, send, recv)
    name_messages_reference(b, send, recv)  # ops outside the ops (n and above) are ignored
    assert np.array_equal(a, b)
    kind = rng.integers(0, 4, n).astype(np.uint8)
    send, recv = np.minimum(send, n - 1), np.minimum(recv, n - 1)
    for got, want in zip(message_lists(kind, send, recv, 1, 2), message_lists_reference(kind, send, recv, 1, 2)):
        assert got.dtype == want.dtype and np.array_equal(got, want)
    # Op times with some dependencies broken (a successor starting before its op ended), or none.
    ptr, idx, _ = successor_csr(src, dst, n)
    end = rng.integers(0, 100, n).astype(np.int64)
    for start in (end - rng.integers(1, 50, n), end - 200, np.full(n, 100)):
        got = early_successor(ptr, idx, start, end)
        assert got == early_successor_reference(ptr, idx, start, end)
        if got[0] >= 0:
            assert got[1] in idx[ptr[got[0]]:ptr[got[0] + 1]] and start[got[1]] < end[got[0]]
        else:
            assert np.all(start[idx] >= np.repeat(end, np.diff(ptr)))
    # A block's own ids moved, the rest kept.
    rel, own = rng.integers(-1, n, m).astype(np.int32), rng.random(m) < 0.7
    got, want = np.empty(m, np.int32), np.empty(m, np.int32)
    shift_own(rel, own, 1000, got)
    shift_own_reference(rel, own, 1000, want)
    assert np.array_equal(got, want)
    # The leading messages between the first ops: all of them, some, or some out of order.
    for nt in (0, n // 2, n):
        for s_op, r_op in ((send, recv), (np.sort(send), np.sort(recv)), (send[::-1].copy(), recv[::-1].copy())):
            assert leading_kept(s_op, r_op, nt) == leading_kept_reference(s_op, r_op, nt)


@pytest.mark.parametrize("seed", range(4))
def test_kernels_read_copies_through_their_segments(seed):
    # A template's messages between ops 0..w-1 and copies of it w, 2w, ... ops on: the passes
    # over every message read a copy's ops from its template (the copies' rows hold garbage) and
    # give what the numpy references give on the columns written out.
    rng = np.random.default_rng(seed)
    w, t, copies = int(rng.integers(2, 12)), int(rng.integers(1, 40)), int(rng.integers(1, 5))
    n = w * (copies + 1) + int(rng.integers(0, 5))
    send, recv = rng.integers(-1, w, t).astype(np.int32), rng.integers(-1, w, t).astype(np.int32)
    segs = np.array([[0, t, 0, 0]] + [[k * t, t, 0, k * w] for k in range(1, copies + 1)], dtype=np.int64)
    whole = [np.concatenate([np.where(c >= 0, c + k * w, c) for k in range(copies + 1)]).astype(np.int32)
             for c in (send, recv)]
    lazy = [np.concatenate([c, np.full(t * copies, 10**6, np.int32)]) for c in (send, recv)]
    # The copies' ops of their template's kinds (a copy's lists are its template's, shifted), or not.
    tiled = np.resize(rng.integers(0, 4, w), n).astype(np.uint8)
    kind = rng.integers(0, 4, n).astype(np.uint8)
    for k in (tiled, kind):
        for got, want in zip(message_lists(k, *lazy, 1, 2, segs), message_lists_reference(k, *whole, 1, 2)):
            assert np.array_equal(got, want)
    msg = np.where(rng.random(n) < 0.3, rng.integers(0, 9, n), -1).astype(np.int32)
    a, b = msg.copy(), msg.copy()
    name_messages(a, *lazy, segs)
    name_messages_reference(b, *whole)
    assert np.array_equal(a, b)
    for nt in (0, w, n):
        assert leading_kept(*lazy, nt, segs) == leading_kept_reference(*whole, nt)
    bad = segs.copy()
    bad[-1, 3] = n  # a copy shifted past the ops
    if np.any(send >= 0) or np.any(recv >= 0):
        for k in (tiled, kind):
            with pytest.raises(ValueError, match="outside the"):
                message_lists(k, *lazy, 1, 2, bad)


def test_kernels_refuse_ops_outside_the_ops():
    with pytest.raises(ValueError, match="an edge's successor is op 5, outside the 5 ops"):
        successor_csr(np.array([0]), np.array([5]), 5)
    with pytest.raises(ValueError, match="an edge's source is op -1, outside the 5 ops"):
        successor_csr(np.array([0, -1]), np.array([1, 1]), 5)
    with pytest.raises(ValueError, match="a message's receive op is op -2"):
        message_lists(np.zeros(3, dtype=np.uint8), np.array([0]), np.array([-2]), 1, 2)
    with pytest.raises(ValueError, match="a message's send op is op 3, outside the 3 ops"):
        message_lists(np.zeros(3, dtype=np.uint8), np.array([0, 3]), np.array([-1, -1]), 1, 2)


@pytest.mark.parametrize("from_member", [False, True])
def test_successor_lists_straight_from_blocks_or_sorted_at_the_end(from_member):
    # Two ops of the trace, then a block placed twice with its members swapped. An edge from a
    # member's op makes the successor lists no longer the block's alone: they are then sorted
    # at the end; either way each op's successors keep the order their edges were added in.
    from cmemu.lower.builder import assemble
    from cmemu.lower.passes import successor_csr_reference

    head = OpBuilder()
    head.ops(2, kind=0)
    b = OpBuilder(base=2)
    x = b.ops(3, kind=0, parent=0)
    b.edges([x[1], x[0], x[0]], [x[2], x[2], x[1]])
    b.edges(x[2], 1)
    if from_member:
        b.edges(0, x[0])
    block = b.block(members=[0, 1])
    assert (block.sorted_edges() is None) == from_member
    parts = [(head.block(), None), (block, np.array([0, 1])), (block, np.array([1, 0]))]
    L = assemble(parts, ["a", "b"], 1, [0], [0], num_trace_ops=2)
    edges = [(3, 4), (2, 4), (2, 3), (4, 1)] + [(0, 2)] * from_member  # at op 2, members 0 and 1
    edges += [(6, 7), (5, 7), (5, 6), (7, 0)] + [(1, 5)] * from_member  # at op 5, members 1 and 0
    src, dst = zip(*edges)
    ptr, idx, npred = successor_csr_reference(src, dst, 8)
    assert np.array_equal(L.succ_ptr, ptr) and np.array_equal(L.succ_idx, idx) and np.array_equal(L.op_npred, npred)
    assert L.op_parent.tolist() == [-1, -1, 0, 0, 0, 1, 1, 1]


@pytest.mark.parametrize("seed", range(6))
def test_hbm_demand_equals_its_reference(seed):
    # Ops of every kind on dies with and without a capacity (and ranks past the dies), durations
    # down to 1 ps and sizes up to 2**50 B: demands past the capacity, and far past int64 before
    # the clip, in the same double-precision rounding.
    rng = np.random.default_rng(seed)
    n, dies = int(rng.integers(1, 400)), int(rng.integers(0, 6))
    kind = rng.integers(0, 4, n).astype(np.uint8)
    dur = np.where(rng.random(n) < 0.2, rng.integers(0, 3, n), rng.integers(1, 10**9, n)).astype(np.int64)
    hbm = np.where(rng.random(n) < 0.2, 0, rng.integers(1, 2**50, n)).astype(np.int64)
    rank = rng.integers(-1, dies + 2, n).astype(np.int32)
    cap = np.where(rng.random(dies) < 0.3, 0, rng.integers(1, 2**41, dies)).astype(np.int64)
    got = hbm_demand(kind, dur, hbm, rank, cap, (0, 3))
    want = hbm_demand_reference(kind, dur, hbm, rank, cap, (0, 3))
    assert got.dtype == want.dtype and np.array_equal(got, want)
    # With what the ops' cores can move (some ops with none: their own rate only), per die.
    aic = np.where(rng.random(n) < 0.3, 0, rng.integers(0, 25, n)).astype(np.int32)
    aiv = np.where(rng.random(n) < 0.5, 0, rng.integers(0, 49, n)).astype(np.int32)
    aic_move, aiv_move = rng.integers(1, 2**39, dies), rng.integers(1, 2**38, dies)
    got = hbm_demand(kind, dur, hbm, rank, cap, (0, 3), aic, aiv, aic_move, aiv_move)
    want = hbm_demand_reference(kind, dur, hbm, rank, cap, (0, 3), aic, aiv, aic_move, aiv_move)
    assert got.dtype == want.dtype and np.array_equal(got, want)
    if dies:  # the cap lowers a demand to what the op's cores move, and does nothing else
        r = np.clip(rank, 0, dies - 1)
        most = aic * aic_move[r] + aiv * aiv_move[r]
        uncapped = hbm_demand(kind, dur, hbm, rank, cap, (0, 3))
        assert np.array_equal(got, np.where(most > 0, np.minimum(uncapped, most), uncapped))



def test_engine_inputs_dropped_after_the_engine_is_built(tmp_path, mini):
    """run_trace cuts the columns only the engine reads to the trace's ops once the engine has
    its copy; the rest stays whole, and the run's results are those of the lowering kept whole."""
    from cmemu.fabric import build_fabric
    from cmemu.lower import Lowered
    from cmemu.run import run_trace, simulate

    path = layered_trace(tmp_path, 2, own_attrs=False)
    whole = lower(load_trace(path, mini.num_dies), mini)
    cut = lower(load_trace(path, mini.num_dies), mini)
    nt = cut.num_trace_ops
    assert cut.num_ops > nt  # the collectives' internal ops
    engine = simulate(whole, build_fabric(mini), record_deliveries=whole.leading_trace_messages())
    cut.drop_engine_inputs()
    for name in ("op_kind", "op_lat_ps", "op_rank", "op_parent", "op_lane", "op_bytes", "succ_ptr", "msg_src"):
        assert np.array_equal(getattr(cut, name), getattr(whole, name)), name
    for name in Lowered.ENGINE_ONLY:
        assert np.array_equal(getattr(cut, name), getattr(whole, name)[:nt]), name
    result = run_trace(path, system="mini")  # which drops them
    start = engine.op_start_ps[:nt].copy()
    spans = np.flatnonzero(whole.op_report_start[:nt] >= 0)
    start[spans] = engine.op_start_ps[whole.op_report_start[spans]]
    assert np.array_equal(result.op_start_ps, start)
    assert np.array_equal(result.op_end_ps, engine.op_end_ps[:nt])


def test_endpoints_are_16_bit_ids(mini):
    from cmemu.lower.comm import MessageTable

    table = MessageTable()
    table.add_many(mini, [0, 1], [2, 3], 100, [0, 1], [-1, -1])
    assert table.arrays()["msg_src"].dtype == np.uint16
    with pytest.raises(ValueError, match="endpoint 70000: cmemu numbers endpoints from 0 to 65,535"):
        MessageTable().add_many(mini, [0, 70000], [2, 3], 100, [0, 1], [-1, -1])
    with pytest.raises(ValueError, match="endpoint -1"):
        MessageTable().add(mini, -1, 3, 100, "ub", 0, -1)


@pytest.mark.parametrize("model", ["packet", "message"])
def test_engine_table_of_placed_messages_equals_the_columns(tmp_path, mini, model):
    """The native engine keeps a collective's messages once however often it is placed
    (Lowered.msg_segments): the run is the same as read from the lowering's whole columns, and the
    lowering's may then be dropped (drop_inputs) with the results unchanged."""
    import dataclasses

    from cmemu.fabric import build_fabric
    from cmemu.run import simulate

    path = layered_trace(tmp_path, 3, own_attrs=False)
    fabric = build_fabric(mini, model=model)
    table = lower(load_trace(path, mini.num_dies), mini)
    flat = dataclasses.replace(table, msg_segments=None)
    whole = (table.num_messages, int(table.msg_bytes.sum()))
    a = simulate(table, fabric)
    b = simulate(flat, fabric)
    assert a.owns_messages and not b.owns_messages
    for name in ("op_start_ps", "op_end_ps", "msg_delivered_ps", "link_bytes", "link_busy_ps", "msg_packets"):
        assert np.array_equal(getattr(a, name), getattr(b, name)), name
    assert a.packets_total == b.packets_total == b.msg_packets.sum()
    assert all(a.message(m) == b.message(m) for m in range(0, table.num_messages, 7))
    keep = table.leading_trace_messages()
    c = simulate(table, fabric, record_deliveries=keep, drop_engine_inputs=True)
    assert table.msg_src.shape[0] == keep < whole[0] and (table.num_messages, table.message_bytes) == whole
    assert table.msg_segments is None and table.op_node_id.shape[0] == table.num_trace_ops
    assert np.array_equal(c.op_end_ps, a.op_end_ps) and np.array_equal(c.msg_delivered_ps, a.msg_delivered_ps[:keep])
    assert c.message(whole[0] - 1) == a.message(whole[0] - 1)


def test_engine_refuses_segments_that_do_not_cover_the_messages(tmp_path, mini):
    import dataclasses

    from cmemu.fabric import build_fabric
    from cmemu.run import simulate

    lowered = lower(load_trace(layered_trace(tmp_path, 2, own_attrs=False), mini.num_dies), mini)
    seg = lowered.msg_segments.copy()
    assert np.any(seg[:, 2] != seg[:, 0])  # copies, so the engine reads them
    gap = seg.copy()
    gap[1:, 0] += 1  # a message left out
    with pytest.raises(ValueError, match="do not cover the messages in order"):
        simulate(dataclasses.replace(lowered, msg_segments=gap), build_fabric(mini))
    orphan = seg.copy()
    orphan[-1, 2] = orphan[-1, 0] + 1  # a template that is no segment's start
    with pytest.raises(ValueError, match="template is not a segment of its own"):
        simulate(dataclasses.replace(lowered, msg_segments=orphan), build_fabric(mini))
    copy = int(np.flatnonzero(seg[:-1, 2] != seg[:-1, 0])[0])  # not the last segment
    short = seg.copy()
    short[copy, 1] -= 1  # a copy one message short of its template, the next one a message early
    short[copy + 1:, 0] -= 1
    short[short[:, 2] > seg[copy, 0], 2] -= 1  # the templates after it too
    short[-1, 1] += 1
    with pytest.raises(ValueError, match="not as long as its template"):
        simulate(dataclasses.replace(lowered, msg_segments=short), build_fabric(mini))


@pytest.mark.parametrize("model", ["packet", "message"])
def test_messages_left_unfilled_give_the_same_run(tmp_path, mini, model):
    """lower(fill_messages=False), as run_trace asks for the native engine: the copies of a
    template's messages are not written until fill_messages(); the byte total, the passes over
    every message (they read a copy's ops from its template), the engine's run (it reads the
    templates) and the columns once filled are those of a lowering that wrote them all."""
    import copy

    from cmemu.fabric import build_fabric
    from cmemu.run import simulate

    trace = load_trace(layered_trace(tmp_path, 3, own_attrs=False), mini.num_dies)
    whole = lower(trace, mini)
    lazy = lower(trace, mini, fill_messages=False)
    assert whole.msg_filled and not lazy.msg_filled
    assert lazy.message_bytes == whole.message_bytes == int(whole.msg_bytes.sum())
    assert lazy.prep_max() == int(whole.msg_prep.max())
    assert np.array_equal(lazy.op_msg, whole.op_msg)  # named through the segments
    assert lazy.leading_trace_messages() == whole.leading_trace_messages()
    for got, want in zip(op_message_lists(lazy), op_message_lists(whole)):
        assert np.array_equal(got, want)
    seg = lazy.msg_segments
    first_copy = int(seg[np.flatnonzero(seg[:, 2] != seg[:, 0])[0], 0])
    part = copy.deepcopy(lazy)
    part.fill_messages(first_copy + 3)  # the first copy's first three messages, and not all of them
    assert not part.msg_filled
    for name in Lowered.COPIED_MSG_COLUMNS + Lowered.SHIFTED_MSG_COLUMNS:
        assert np.array_equal(getattr(part, name)[:first_copy + 3], getattr(whole, name)[:first_copy + 3]), name

    fabric = build_fabric(mini, model=model)
    a = simulate(whole, fabric)
    keep = lazy.leading_trace_messages()
    b = simulate(lazy, fabric, record_deliveries=keep, drop_engine_inputs=True)
    assert lazy.msg_filled and lazy.msg_src.shape[0] == keep  # cut to the trace's own, those filled
    assert (lazy.num_messages, lazy.message_bytes) == (whole.num_messages, whole.message_bytes)
    for name in ("op_end_ps", "link_bytes", "link_busy_ps"):
        assert np.array_equal(getattr(a, name), getattr(b, name)), name
    assert np.array_equal(b.msg_delivered_ps, a.msg_delivered_ps[:keep])
    assert all(a.message(m) == b.message(m) for m in range(0, whole.num_messages, 5))

    # Whatever reads every row fills them first: the reference engine, and fill_messages() itself.
    again = lower(trace, mini, fill_messages=False)
    r = simulate(again, fabric, native=False)
    assert again.msg_filled and np.array_equal(r.op_end_ps, a.op_end_ps)
    for name in Lowered.COPIED_MSG_COLUMNS + Lowered.SHIFTED_MSG_COLUMNS:
        assert np.array_equal(getattr(again, name), getattr(whole, name)), name
