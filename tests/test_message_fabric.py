"""The message-level fabric (`--fabric message`): by hand, against the packet model, and the
invariants of its reservations. See docs/model.md, "Message-level fabric"."""
import json
import math

import numpy as np
import pytest

from cmemu._core import merge_link_series
from cmemu.errors import CmemuError
from cmemu.fabric import build_fabric
from cmemu.lower import lowered_from_parts
from cmemu.lower.comm import MessageTable
from cmemu.run import run_trace, simulate
from cmemu.spec import load_system
from cmemu.topology import build_topology
from cmemu.vocab import MSG_READ, OP_KIND_RECV, OP_KIND_SEND

ONE_PLANE = ["ub.sub_planes=1", "ub.die_ports=1", "ub.cpu_ports=1"]


def ser(nbytes, rate=28e9):
    return math.ceil(nbytes * 1e12 / rate)


def writes(topo, pairs, size, after=()):
    """One COMM_SEND and one COMM_RECV op per (src, dst) pair, each carrying one write; ``after``
    holds (i, j): pair j's send starts when pair i's send has ended."""
    table = MessageTable()
    kinds, rank, op_msg = [], [], []
    for i, (s, d) in enumerate(pairs):
        table.add(topo, s, d, size, "ub", send_op=2 * i, recv_op=2 * i + 1)
        kinds += [OP_KIND_SEND, OP_KIND_RECV]
        rank += [s, d]
        op_msg += [i, i]
    src = [2 * i for i, _ in after]
    dst = [2 * j for _, j in after]
    return lowered_from_parts(kinds, [0] * len(kinds), src, dst, table, op_msg=op_msg, rank=rank)


def both(topo, lowered, native=True, **kw):
    packet = simulate(lowered, build_fabric(topo), native=native, **kw)
    message = simulate(lowered, build_fabric(topo, model="message"), native=native, **kw)
    return packet, message


@pytest.fixture(scope="module")
def mini():
    return build_topology(load_system("mini", []))


def test_write_by_hand(mini):
    # One 512 B write, die 0 to die 2 (same node): die 0 -> L1 -> die 2, stored and forwarded,
    # as on the packet fabric; delivered one HBM write latency after its tail arrives.
    ub = mini.spec.ub
    wire, switch = round(ub.link_latency_ns * 1000), round(ub.switch_latency_ns * 1000)
    e = simulate(writes(mini, [(0, 2)], 512), build_fabric(mini, model="message"))
    pkt = ub.flit_wire_byte(512 + ub.header_write_byte)
    arrive = round(ub.initiator_startup_ns * 1000) + 2 * ser(pkt) + wire + (wire + switch)
    assert int(e.op_end_ps[1]) == arrive + round(203 * 1e6 / 1800)  # 203 cycles at 1.8 GHz
    assert e.events == 4  # two ops ready and done: the packet itself is no event


@pytest.mark.parametrize("size", [40, 4096, 10_000, 60_000])
@pytest.mark.parametrize("dst", [1, 2, 20])  # its NPU's other die (D2D), same node, other node
def test_alone_matches_packets(mini, size, dst):
    # Alone on the fabric, nothing waits: each packet's reserved path is its path on the packet
    # fabric, to the picosecond, sprayed over the same planes.
    packet, message = both(mini, writes(mini, [(0, dst)], size))
    assert np.array_equal(packet.op_end_ps, message.op_end_ps)
    assert np.array_equal(np.asarray(packet.link_bytes), np.asarray(message.link_bytes))
    assert message.events < packet.events


def test_idle_time_is_used(mini):
    # One plane. Die 20 (other node) writes to die 2 first, die 0 (same node) right after: the
    # remote packet has reserved die 2's link for when it gets there, three hops on, but the local
    # one gets there sooner and goes first, in the idle time before; it is delivered as if alone.
    topo = build_topology(load_system("mini", ONE_PLANE))
    L = writes(topo, [(20, 2), (0, 2)], 512)
    fab = build_fabric(topo, model="message")
    both_ = simulate(L, fab)
    alone = simulate(writes(topo, [(0, 2)], 512), fab)
    assert both_.op_end_ps[3] == alone.op_end_ps[1]
    remote_alone = simulate(writes(topo, [(20, 2)], 512), fab)
    assert both_.op_end_ps[1] == remote_alone.op_end_ps[1]


def test_reservations_never_overlap(mini):
    # Heavy incast, 60 KB writes from every die to three dies: every link carries one packet at a
    # time, each packet leaves a link only after it has arrived there (store and forward), the
    # same bytes cross the fabric as on the packet model, and the native kernel agrees exactly
    # with the pure-Python reference.
    pairs = [(s, d) for s in range(32) for d in (1, 5, 17) if s != d]
    L = writes(mini, pairs, 60_000)
    fab = build_fabric(mini, model="message")
    e = simulate(L, fab, record_packets=True, bin_ps=1_000_000)
    rec = e.packet_records()
    order = np.lexsort((rec["start_ps"], rec["link"]))
    link, start, end = rec["link"][order], rec["start_ps"][order], rec["end_ps"][order]
    same = link[1:] == link[:-1]
    assert np.all(start[1:][same] >= end[:-1][same])
    assert np.all(end - start == [ser(w, r) for w, r in zip(rec["wire_bytes"][order],
                                                          fab.link_rate_byte_per_s[link])])
    hop = np.lexsort((rec["start_ps"], rec["seq"], rec["msg"]))  # each packet's links in order
    m, q, st, en, lk = (rec[k][hop] for k in ("msg", "seq", "start_ps", "end_ps", "link"))
    nxt = (m[1:] == m[:-1]) & (q[1:] == q[:-1])
    assert np.all(st[1:][nxt] >= en[:-1][nxt] + fab.link_latency_ps[lk[:-1][nxt]])
    series = e.link_series()
    assert np.all(series["busy_ps"] <= series["bin_ps"])
    packet = simulate(L, build_fabric(mini))
    assert np.asarray(e.link_bytes).sum() == np.asarray(packet.link_bytes).sum()
    assert e.packets_sent == packet.packets_sent
    # The last delivery: bound by the three receivers' links in both models.
    assert abs(e.op_end_ps[1::2].max() / packet.op_end_ps[1::2].max() - 1) < 0.03
    ref = simulate(L, fab, native=False, record_packets=True, bin_ps=1_000_000)
    assert np.array_equal(ref.op_end_ps, e.op_end_ps)
    assert np.array_equal(np.asarray(ref.link_busy_ps), np.asarray(e.link_busy_ps))
    assert np.array_equal(np.asarray(ref.msg_delivered_ps), np.asarray(e.msg_delivered_ps))
    assert all(np.array_equal(ref.packet_records()[k], rec[k]) for k in rec)
    assert all(np.array_equal(ref.link_series()[k], series[k]) for k in series)


def test_window_holds_packets(mini):
    # A window of 8 packets: 16 writes of 4 packets from one die keep at most 8 in flight, as on
    # the packet fabric, and take longer than with the default window. The look-ahead lets a
    # packet take a slot whose ack is due soon, but not leave before that ack.
    pairs = [(0, d) for d in range(2, 18)]
    L = writes(mini, pairs, 4 * mini.spec.ub.transport_mtu_byte)
    small = build_topology(load_system("mini", ["ub.max_outstanding_packets=8"]))
    packet, message = both(small, L)
    wide = simulate(L, build_fabric(mini, model="message"))
    assert message.op_end_ps.max() > 1.5 * wide.op_end_ps.max()
    assert abs(message.op_end_ps.max() / packet.op_end_ps.max() - 1) < 0.05
    ref = simulate(L, build_fabric(small, model="message"), native=False)
    assert np.array_equal(ref.op_end_ps, message.op_end_ps)


def test_reads_stay_packets(mini):
    table = MessageTable()
    table.add(mini, 2, 0, 5000, "ub", send_op=-1, recv_op=0, kind=MSG_READ)
    L = lowered_from_parts([OP_KIND_RECV], [0], [], [], table, op_msg=[0], rank=[0])
    packet, message = both(mini, L)
    assert np.array_equal(packet.op_end_ps, message.op_end_ps)
    assert message.events == packet.events


def test_merged_link_series():
    # A link's rows may come back to a bin already written (a packet reserved in an idle stretch
    # before the last one's bin): rows of one (link, bin) are summed, and sorted.
    rows = np.array([[1, 3, 100, 50], [0, 2, 10, 5], [1, 3, 20, 7], [1, 1, 1, 1]], dtype=np.int64)
    out = merge_link_series(1000, rows)
    assert out["link"].tolist() == [0, 1, 1] and out["bin"].tolist() == [2, 1, 3]
    assert out["bytes"].tolist() == [10, 1, 120] and out["busy_ps"].tolist() == [5, 1, 57]


def _trace_with_timed_failure(tmp_path):
    doc = {"schema": "cmemu.trace", "version": 1, "time_unit": "ns", "system": "mini",
           "cmemu.faults": [{"fail": "link:0", "at_ns": 100}],
           "nodes": [{"id": 0, "name": "w", "type": "COMM_SEND", "rank": 0, "stream": 0,
                      "attrs": {"comm_size": 4096, "comm_dst": 2}},
                     {"id": 1, "name": "r", "type": "COMM_RECV", "rank": 2, "stream": 0,
                      "attrs": {"comm_size": 4096, "comm_src": 0}}]}
    path = tmp_path / "t.json"
    path.write_text(json.dumps(doc))
    return path


def test_failures_during_a_run_refused(tmp_path):
    trace = _trace_with_timed_failure(tmp_path)
    with pytest.raises(CmemuError, match="--fabric packet"):
        run_trace(trace, fabric_model="message", progress=False)
    with pytest.raises(CmemuError, match="--fabric must be one of"):
        run_trace(trace, fabric_model="flow", progress=False)
    with pytest.raises(ValueError, match="failures during a run"):
        topo = build_topology(load_system("mini", []))
        from cmemu.faults import parse_failures

        build_fabric(topo, None, [(100_000, parse_failures(["link:0"], topo))], model="message")


def test_decode_step_close_to_packets(tmp_path):
    # The shipped 2-layer decode step: the same step time within 1%, with far fewer events, and
    # the timeline says which fabric model ran.
    import h5py

    trace = "traces/deepseek_r1_decode_mini_2layers.json"
    packet = run_trace(trace, progress=False)
    message = run_trace(trace, progress=False, fabric_model="message", output=tmp_path / "m.h5")
    assert abs(message.sim_end_ps / packet.sim_end_ps - 1) < 0.01
    # The AIVs' remote writes wait for each other (one event per write on either fabric); the
    # packets' hops are the rest of the packet fabric's events.
    assert message.events * 2 < packet.events
    assert message.fabric_bytes == packet.fabric_bytes
    with h5py.File(tmp_path / "m.h5") as f:
        assert f.attrs["fabric_model"] == "message"


def test_release_keeps_the_results(mini):
    # run_trace frees the engine's run state once the op times are read: what it reads after
    # (deliveries, packets, link totals and series, HBM clock) is unchanged, and the engine
    # refuses to run or to give op times again.
    pairs = [(s, d) for s in range(0, 32, 5) for d in (1, 17) if s != d]
    e = simulate(writes(mini, pairs, 9000), build_fabric(mini, model="message"), bin_ps=1_000_000)
    before = (np.asarray(e.msg_delivered_ps).copy(), np.asarray(e.msg_packets), np.asarray(e.link_bytes),
              e.link_series(), e.hbm_clock())
    times = (e.op_start_ps, e.op_end_ps)
    e.release(keep_op_times=True)  # the op times can still be read, once the rest is freed
    assert np.array_equal(e.op_start_ps, times[0]) and np.array_equal(e.op_end_ps, times[1])
    assert e.packets_total == before[1].sum() and np.array_equal(e.message_packets(3), before[1][:3])
    e.release()
    assert np.array_equal(np.asarray(e.msg_delivered_ps), before[0])
    assert np.array_equal(np.asarray(e.msg_packets), before[1])
    assert np.array_equal(np.asarray(e.link_bytes), before[2])
    assert all(np.array_equal(np.asarray(e.link_series()[k]), np.asarray(before[3][k])) for k in before[3])
    assert all(np.array_equal(np.asarray(e.hbm_clock()[k]), np.asarray(before[4][k])) for k in before[4])
    with pytest.raises(RuntimeError):
        e.run()
    with pytest.raises(RuntimeError):
        e.op_start_ps


@pytest.mark.parametrize("skew_ps", [0, 1234])
def test_ack_times_with_asymmetric_ports(mini, skew_ps):
    # The native engine adds an ack's way back up as its packet goes (ports and L1-L2 links
    # alike on every endpoint: the way back costs what the way there does), else it routes it
    # (ack_trip). One endpoint's ports made slower one way: both must still agree with the
    # reference, which always routes it.
    import dataclasses

    fabric = build_fabric(mini, model="message")
    lat = fabric.link_latency_ps.copy()  # the topology's own array otherwise
    lat[np.asarray(fabric.ep_down).ravel()[2 * fabric.planes:3 * fabric.planes]] += skew_ps  # die 2's, every plane
    fabric = dataclasses.replace(fabric, link_latency_ps=lat)
    pairs = [(0, 2), (2, 0), (20, 2), (2, 21), (3, 2)]
    lowered = writes(mini, pairs, 10_000)
    native = simulate(lowered, fabric, native=True)
    reference = simulate(lowered, fabric, native=False)
    assert np.array_equal(np.asarray(native.op_end_ps), np.asarray(reference.op_end_ps))
    assert np.array_equal(np.asarray(native.msg_delivered_ps), np.asarray(reference.msg_delivered_ps))
    plain = simulate(lowered, build_fabric(mini, model="message"))
    assert np.array_equal(np.asarray(native.op_end_ps), np.asarray(plain.op_end_ps)) == (skew_ps == 0)


@pytest.mark.parametrize("native", [True, False])
@pytest.mark.parametrize("model", ["packet", "message"])
@pytest.mark.parametrize("gate", ["none", "middle", "after"])
def test_receive_of_many_writes_ends_at_the_last(mini, native, model, gate):
    """A receive waiting for three writes from three dies ends at the latest delivery, whether it
    starts before they land, between them (a COMP before it ends midway between the first and
    last delivery: those already in count with their times), or after them all. Only the first
    delivery time is kept when asked (record_deliveries=1), and the run is the same."""
    from cmemu.vocab import OP_KIND_COMP

    kinds = [OP_KIND_SEND] * 3 + [OP_KIND_RECV, OP_KIND_COMP]
    fabric = build_fabric(mini, model=model)

    def run(gate_ps, **kw):
        table = MessageTable()
        for k, (s, size) in enumerate(((0, 9000), (1, 3000), (3, 20000))):
            table.add(mini, s, 2, size, "ub", send_op=k, recv_op=3)
        lowered = lowered_from_parts(kinds, [0, 0, 0, 0, gate_ps], [4], [3], table, op_msg=[0, 1, 2, 0, -1],
                                     rank=[0, 1, 3, 2, 2])
        return simulate(lowered, fabric, native=native, **kw)

    free = np.asarray(run(0).msg_delivered_ps)
    assert free.shape == (3,) and len(set(free.tolist())) == 3 and free.min() > 0
    gate_ps = {"none": 0, "middle": (free.min() + free.max()) // 2, "after": 2 * free.max()}[gate]
    full = run(gate_ps)
    delivered = np.asarray(full.msg_delivered_ps)
    assert np.array_equal(delivered, free)  # the receive's start does not move the data
    assert full.op_end_ps[3] == max(gate_ps, free.max())
    assert full.messages_delivered == 3
    one = run(gate_ps, record_deliveries=1)
    assert np.array_equal(one.msg_delivered_ps, free[:1])
    assert np.array_equal(one.op_end_ps, full.op_end_ps) and one.messages_delivered == 3


def test_link_counters_of_a_wide_bin_past_32_bits(mini):
    """A bin's counters are kept in 32-bit parts (16-byte rows) and summed: one 5 GB write within
    a single 1 s bin, over the one die-to-die link between the two dies of an NPU, still gives
    the link its 5 GB (and headers) and its busy time (both past 2**32) in one row of
    /links/binned."""
    size = 5 * 10**9
    e = simulate(writes(mini, [(0, 1)], size), build_fabric(mini, model="message"), bin_ps=10**12)  # die to die
    series = e.link_series()
    used = np.flatnonzero(np.asarray(e.link_bytes) > 0)
    assert np.array_equal(series["link"], used) and not series["bin"].any()  # one row a link
    assert np.array_equal(series["bytes"], np.asarray(e.link_bytes)[used])
    assert np.array_equal(series["busy_ps"], np.asarray(e.link_busy_ps)[used])
    assert series["bytes"].size == 1 and series["bytes"][0] > size > 2**32 and series["busy_ps"][0] > 2**32  # + headers


@pytest.mark.parametrize("model", ["message", "message-bp"])
def test_acks_far_out_of_order_as_the_reference(model):
    """An all-to-all among 16 dies of mini, 128 KiB each, with a window of 64 packets (so that the
    acks' times hold the senders back: 26.1 us against 21.8 us with 1,024): a DMA's packets,
    reserved ahead over the seven planes, are acked far out of order (1,424 acks went more than
    16 places before the end of their initiator's list: ack_push's halving), and the engine and
    the pure-Python reference (a plain sorted list) finish every op and send every packet at
    the same times."""
    from conftest import all_to_all

    topo = build_topology(load_system("mini", ["ub.max_outstanding_packets=64"]))
    L = all_to_all(topo, list(range(0, 32, 2)), 1 << 17)
    F = build_fabric(topo, model=model)
    native = simulate(L, F, record_packets=True)
    ref = simulate(L, F, native=False, record_packets=True)
    assert np.array_equal(native.op_end_ps, ref.op_end_ps)
    rn, rr = native.packet_records(), ref.packet_records()
    assert all(np.array_equal(rn[k], rr[k]) for k in ("start_ps", "link", "msg", "seq"))
