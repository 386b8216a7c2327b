"""Property-based tests: random valid traces on `mini` replay to the end and keep the run
invariants (docs/architecture.md); random dependency graphs either replay or are refused as
cycles, never hang.

The invariants are checked here from the trace document itself (dependencies, stream order,
message pairs), not from the lowering's arrays, so that a lowering bug cannot hide itself.
"""
from __future__ import annotations

import json
import signal
import tempfile
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from cmemu.errors import TraceError
from cmemu.run import run_trace

DIES = 32  # the `mini` preset
STREAMS = 3

BASE = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# Sizes around the packet boundaries (UB MTU 4096 B, see the preset) and a few multi-packet ones.
SIZES = st.one_of(st.sampled_from([0, 1, 511, 512, 4095, 4096, 4097, 8192]), st.integers(0, 40_000))


def _comp_attrs():
    fixed = st.fixed_dictionaries(
        {"cmemu.duration_ns": st.one_of(st.integers(0, 5_000), st.floats(0, 5_000, allow_nan=False))},
        optional={"cmemu.unit": st.sampled_from(["aic", "aiv"]), "cmemu.cores": st.integers(1, 8)},
    )
    work = st.fixed_dictionaries(
        {"num_ops": st.one_of(st.integers(0, 10**12), st.floats(0, 1e12, allow_nan=False))},
        optional={
            "tensor_size": st.integers(0, 10**8),
            "cmemu.dtype": st.sampled_from(["bf16", "fp16", "int8"]),
            "cmemu.cores": st.integers(1, 8),
        },
    )
    return st.one_of(fixed, work)


@st.composite
def valid_traces(draw, max_items=24):
    """A valid trace: deps only to earlier nodes, every receive after its send in file order.

    Every edge (dependency, stream order, receive -> send) then points back in the file, so no
    cycle can arise. Receives of one channel (src, dst, tag) end up in the order of their sends
    or not: the k-th receive of a channel is always after the k-th send, and sizes and planes are
    given to each receive from the send it is matched with (docs/trace-format.md, Messages).
    """
    n_items = draw(st.integers(1, max_items))
    nodes = []
    waiting = []  # receives not yet placed: (rank, stream, src, tag)

    def place(node):
        node["id"] = len(nodes) * 3 + 1  # ids need not be dense or start at 0
        if nodes and draw(st.booleans()):
            earlier = [n["id"] for n in nodes]
            key = draw(st.sampled_from(["data_deps", "ctrl_deps"]))
            node[key] = draw(st.lists(st.sampled_from(earlier), max_size=3))
        nodes.append(node)

    for _ in range(n_items):
        rank = draw(st.integers(0, DIES - 1))
        stream = draw(st.integers(0, STREAMS - 1))
        kind = draw(st.sampled_from(["COMP", "MEM_LOAD", "MEM_STORE", "SEND", "SEND", "RECV"]))
        if kind == "RECV" and waiting:
            r_rank, r_stream, src, tag = waiting.pop(draw(st.integers(0, len(waiting) - 1)))
            place({"type": "COMM_RECV", "rank": r_rank, "stream": r_stream,
                   "attrs": {"comm_src": src, "comm_tag": tag}})
        elif kind in ("SEND", "RECV"):
            dst = draw(st.integers(0, DIES - 2))
            dst += dst >= rank  # any die but its own (the twin die too: die-to-die)
            tag = draw(st.integers(0, 1))
            attrs = {"comm_dst": dst, "comm_size": draw(SIZES), "comm_tag": tag}
            if draw(st.integers(0, 4)) == 0:
                attrs["cmemu.plane"] = "rdma"
            place({"type": "COMM_SEND", "rank": rank, "stream": stream, "attrs": attrs})
            waiting.append((dst, draw(st.integers(0, STREAMS - 1)), rank, tag))
        elif kind == "COMP":
            place({"type": "COMP", "rank": rank, "stream": stream, "attrs": draw(_comp_attrs())})
        else:
            place({"type": kind, "rank": rank, "stream": stream,
                   "attrs": {"tensor_size": draw(st.integers(0, 10**7))}})
    for r_rank, r_stream, src, tag in waiting:
        place({"type": "COMM_RECV", "rank": r_rank, "stream": r_stream,
               "attrs": {"comm_src": src, "comm_tag": tag}})
    _give_receives_their_sizes(nodes)
    return {"schema": "cmemu.trace", "version": 1, "time_unit": "ns", "system": "mini", "nodes": nodes}


def _channel_pairs(nodes):
    """(send index, recv index) pairs by the matching rule, k-th send with k-th receive."""
    sends, recvs = {}, {}
    for i, n in enumerate(nodes):
        a = n["attrs"]
        if n["type"] == "COMM_SEND":
            sends.setdefault((n["rank"], a["comm_dst"], a.get("comm_tag", 0)), []).append(i)
        elif n["type"] == "COMM_RECV":
            recvs.setdefault((a["comm_src"], n["rank"], a.get("comm_tag", 0)), []).append(i)
    pairs = []
    for ch, s in sends.items():
        pairs.extend(zip(s, recvs.get(ch, [])))
    return pairs


def _give_receives_their_sizes(nodes):
    for s, r in _channel_pairs(nodes):
        sa, ra = nodes[s]["attrs"], nodes[r]["attrs"]
        ra["comm_size"] = sa["comm_size"]
        if "cmemu.plane" in sa:
            ra["cmemu.plane"] = sa["cmemu.plane"]


def _write(doc, folder, name="t.json"):
    path = Path(folder) / name
    path.write_text(json.dumps(doc))
    return path


@contextmanager
def _terminates_within(seconds):
    """Fail, instead of hanging the suite, if a run does not end (it returns to Python between
    slices of events, where the alarm's exception lands)."""

    def alarm(signum, frame):
        raise AssertionError(f"the run did not terminate within {seconds} s")

    old = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _replay(doc, native=True):
    with tempfile.TemporaryDirectory() as d, _terminates_within(60):
        return run_trace(_write(doc, d), progress=False, native=native)


def check_link_bytes(r) -> None:
    """Link bytes = the sum over packets of their bytes on the wire times the links they cross."""
    L = r.lowered
    if hasattr(L, "chunk_bytes"):  # store-and-forward stand-in: packets and routes are lowered
        expected = np.zeros(r.link_bytes.shape[0], dtype=np.int64)
        for c in range(L.num_packets):
            np.add.at(expected, L.route_links[L.chunk_route_lo[c]:L.chunk_route_hi[c]], L.chunk_bytes[c])
        np.testing.assert_array_equal(r.link_bytes, expected)
        return
    # Packet model: the engine cuts messages into packets and routes them hop by hop, so only
    # totals are known without replaying it: hops from the path kind, wire bytes from the format.
    from cmemu.fabric import build_fabric
    from cmemu.vocab import MSG_READ, PATH_D2D, PATH_RDMA, PKT_READ_REQ, PKT_READ_RESP, PKT_WRITE

    F = build_fabric(r.topology)
    total = hops_total = 0
    for m in range(L.num_messages):
        path, size = int(L.msg_path[m]), int(L.msg_bytes[m])
        src, dst = int(L.msg_src[m]), int(L.msg_dst[m])
        if path == PATH_D2D:
            hops = 1
        elif path == PATH_RDMA or F.ep_node[src] == F.ep_node[dst]:
            hops = 2
        else:
            hops = 4
        mtu = int(F.path_mtu_byte[path])
        n = max(1, -(-size // mtu))
        payloads = [mtu] * (n - 1) + [size - (n - 1) * mtu]
        if L.msg_kind[m] == MSG_READ:
            wire = sum(F.wire_bytes(path, PKT_READ_REQ, 0) + F.wire_bytes(path, PKT_READ_RESP, b) for b in payloads)
            hops_total += 2 * n * hops
        else:
            wire = sum(F.wire_bytes(path, PKT_WRITE, b) for b in payloads)
            hops_total += n * hops
        total += wire * hops
    assert int(r.link_bytes.sum()) == total
    assert r.packets_sent == hops_total


def check_invariants(doc, r) -> None:
    """the invariants of docs/architecture.md, from the trace document and the run's results."""
    nodes = doc["nodes"]
    row = {int(nid): i for i, nid in enumerate(r.lowered.op_node_id)}
    assert len(row) == len(nodes)
    start = {n["id"]: int(r.op_start_ps[row[n["id"]]]) for n in nodes}
    end = {n["id"]: int(r.op_end_ps[row[n["id"]]]) for n in nodes}
    for n in nodes:  # every op ends, and not before it starts
        assert 0 <= start[n["id"]] <= end[n["id"]], n
    for n in nodes:  # starts no earlier than the end of each dependency
        for d in n.get("data_deps", []) + n.get("ctrl_deps", []):
            assert start[n["id"]] >= end[d], (n, d)
    last = {}
    for n in nodes:  # one stream: file order, no overlap
        key = (n["rank"], n.get("stream", 0))
        if key in last:
            assert start[n["id"]] >= end[last[key]], (n, last[key])
        last[key] = n["id"]
    for s, rcv in _channel_pairs(nodes):  # a receive ends no earlier than its send starts
        assert end[nodes[rcv]["id"]] >= start[nodes[s]["id"]]
    assert r.sim_end_ps == max(end.values())
    check_link_bytes(r)
    assert np.all(r.link_busy_ps >= 0) and np.all((r.link_bytes > 0) <= (r.link_busy_ps > 0))


def _same_results(a, b) -> None:
    np.testing.assert_array_equal(a.op_start_ps, b.op_start_ps)
    np.testing.assert_array_equal(a.op_end_ps, b.op_end_ps)
    np.testing.assert_array_equal(a.link_bytes, b.link_bytes)
    np.testing.assert_array_equal(a.link_busy_ps, b.link_busy_ps)
    assert a.events == b.events and a.max_pending_events == b.max_pending_events


@settings(BASE, max_examples=500)
@given(valid_traces(max_items=40))
def test_valid_traces_replay_with_invariants_and_determinism(doc):
    a = _replay(doc)
    event(f"messages: {min(a.lowered.num_messages, 10) // 5 * 5}+")
    check_invariants(doc, a)
    _same_results(a, _replay(doc))  # determinism: the same trace twice, the same run


@settings(BASE, max_examples=250)
@given(valid_traces(max_items=12))
def test_native_engine_matches_reference(doc):
    _same_results(_replay(doc, native=True), _replay(doc, native=False))


@st.composite
def any_graphs(draw, max_nodes=12):
    """Random graphs: deps anywhere (forward, backward), receives anywhere relative to sends.

    Messages are paired up front so every send has its receive; cycles are allowed.
    """
    n = draw(st.integers(1, max_nodes))
    nodes = []
    for i in range(n):
        rank = draw(st.integers(0, 3))
        nodes.append({"id": i, "type": "COMP", "rank": rank, "stream": draw(st.integers(0, 1)),
                      "attrs": {"cmemu.duration_ns": draw(st.integers(0, 100))}})
    ids = list(range(n))
    for nd in nodes:
        deps = draw(st.lists(st.sampled_from(ids), max_size=2))
        deps = [d for d in deps if d != nd["id"]]
        if deps:
            nd["data_deps"] = deps
    # Turn disjoint pairs of nodes on different ranks into send/receive pairs (either order).
    order = draw(st.permutations(ids))
    for a, b in zip(order[::2], order[1::2]):
        if nodes[a]["rank"] == nodes[b]["rank"] or not draw(st.booleans()):
            continue
        size = draw(st.integers(0, 9000))
        sa, ra = nodes[a], nodes[b]
        sa["type"], ra["type"] = "COMM_SEND", "COMM_RECV"
        sa["attrs"] = {"comm_dst": ra["rank"], "comm_size": size, "comm_tag": a}
        ra["attrs"] = {"comm_src": sa["rank"], "comm_size": size, "comm_tag": a}
    return {"schema": "cmemu.trace", "version": 1, "time_unit": "ns", "system": "mini", "nodes": nodes}


@settings(BASE, max_examples=500)
@given(any_graphs())
def test_any_graph_replays_or_is_refused_as_a_cycle(doc):
    # What the checker accepts, the engine runs to the end: no deadlock passes validation.
    try:
        r = _replay(doc)
    except TraceError as exc:
        event("refused: a cycle")
        assert "dependency cycle" in str(exc), str(exc)
        assert exc.node_id is not None and exc.field in ("data_deps", "ctrl_deps", "stream", "comm_src")
        return
    event("replayed")
    check_invariants(doc, r)


def test_generator_makes_messages_and_all_node_types():
    # The strategy must reach what the invariants are about: messages on both planes, the
    # die-to-die link, dependencies, several streams and every node type.
    seen = set()

    @settings(max_examples=80, deadline=None, database=None)
    @given(valid_traces())
    def collect(doc):
        for n in doc["nodes"]:
            seen.add(n["type"])
            if n["type"] == "COMM_SEND":
                seen.add(n["attrs"].get("cmemu.plane", "ub"))
                if n["rank"] // 2 == n["attrs"]["comm_dst"] // 2:
                    seen.add("d2d")
            if n.get("data_deps") or n.get("ctrl_deps"):
                seen.add("deps")
            if n.get("stream", 0) > 0:
                seen.add("stream")

    collect()
    assert seen >= {"COMP", "MEM_LOAD", "MEM_STORE", "COMM_SEND", "COMM_RECV", "ub", "rdma", "deps",
                    "stream"}, seen


@pytest.mark.parametrize("native", [True, False])
def test_invariant_checks_can_fail(native):
    # The checks above are not vacuous: a result tampered with in each way is caught.
    doc = {"schema": "cmemu.trace", "version": 1, "time_unit": "ns", "system": "mini", "nodes": [
        {"id": 0, "type": "COMP", "rank": 0, "attrs": {"cmemu.duration_ns": 10}},
        {"id": 1, "type": "COMM_SEND", "rank": 0, "data_deps": [0], "attrs": {"comm_dst": 16, "comm_size": 9000}},
        {"id": 2, "type": "COMM_RECV", "rank": 16, "attrs": {"comm_src": 0, "comm_size": 9000}},
        {"id": 3, "type": "COMP", "rank": 16, "attrs": {"cmemu.duration_ns": 5}},
    ]}
    r = _replay(doc, native=native)
    check_invariants(doc, r)
    for field, index, value in [("op_start_ps", 1, 0), ("op_end_ps", 2, 0), ("op_start_ps", 3, 0)]:
        bad = _replay(doc, native=native)
        getattr(bad, field)[index] = value
        with pytest.raises(AssertionError):
            check_invariants(doc, bad)
    bad = _replay(doc, native=native)
    bad.link_bytes[np.flatnonzero(bad.link_bytes)[0]] += 1
    with pytest.raises(AssertionError):
        check_invariants(doc, bad)
