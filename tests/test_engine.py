"""The Cython event kernel against its pure-Python reference, and the kernel's own rules."""
import numpy as np
import pytest

from cmemu._core import make_engine
from cmemu._core.engine import serialisation_time_ps as native_serialisation
from cmemu._core.reference import serialisation_time_ps as reference_serialisation
from cmemu._core.synthetic import hold_workload, traffic_workload
from cmemu.fabric import build_fabric
from cmemu.spec import load_system
from cmemu.topology import build_topology


FABRIC = None


def _fabric():
    global FABRIC
    if FABRIC is None:
        FABRIC = build_fabric(build_topology(load_system("mini")))
    return FABRIC


def _run(lowered, native, bin_ps=0):
    e = make_engine(lowered, _fabric(), native=native, bin_ps=bin_ps)
    assert e.run() is True
    return e


def _same(a, b):
    assert a.events == b.events
    assert a.ops_done == b.ops_done
    assert a.now == b.now
    assert a.max_pending == b.max_pending
    assert a.packets_sent == b.packets_sent
    for attr in ("op_start_ps", "op_end_ps", "msg_delivered_ps", "link_bytes", "link_busy_ps", "credit_bytes"):
        np.testing.assert_array_equal(getattr(a, attr), getattr(b, attr), err_msg=attr)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_native_matches_reference_on_hold(seed):
    L = hold_workload(chains=50, ops_per_chain=40, seed=seed)
    _same(_run(L, True), _run(L, False))


@pytest.mark.parametrize("seed", [0, 1])
def test_native_matches_reference_on_traffic(seed):
    topo = build_topology(load_system("mini"))
    L = traffic_workload(topo, messages=300, seed=seed)
    a, b = _run(L, True, bin_ps=1_000_000), _run(L, False, bin_ps=1_000_000)
    _same(a, b)
    assert a.ops_done == 600
    sa, sb = a.link_series(), b.link_series()
    for k in ("link", "bin", "bytes", "busy_ps"):
        np.testing.assert_array_equal(sa[k], sb[k], err_msg=k)
    # Conservation: the binned counters add up to the totals, every credit came back, and no
    # packet is left anywhere.
    np.testing.assert_array_equal(np.bincount(sa["link"], weights=sa["bytes"], minlength=a.link_bytes.size),
                                  a.link_bytes)
    np.testing.assert_array_equal(np.bincount(sa["link"], weights=sa["busy_ps"], minlength=a.link_bytes.size),
                                  a.link_busy_ps)
    np.testing.assert_array_equal(a.credit_bytes, np.repeat(_fabric().link_credit_byte[:, None], 2, axis=1))
    assert a.packets_live == 0


def test_run_in_slices_gives_the_same_result():
    L = hold_workload(chains=20, ops_per_chain=30, seed=4)
    whole = _run(L, True)
    sliced = make_engine(L, _fabric(), native=True)
    calls = 1
    while not sliced.run(7):
        calls += 1
    assert calls > 10
    _same(whole, sliced)


def test_hold_keeps_chains_pending():
    L = hold_workload(chains=100, ops_per_chain=10)
    e = _run(L, True)
    assert e.events == 2 * 100 * 10  # one ready and one done event per op
    assert e.max_pending == 100
    # Each chain ends at the sum of its durations.
    ends = e.op_end_ps.reshape(100, 10)[:, -1]
    np.testing.assert_array_equal(ends, L.op_dur_ps.reshape(100, 10).sum(axis=1))


@pytest.mark.parametrize(
    "nbytes, rate, ps",
    [(512, 28_000_000_000, 18_286), (28, 28_000_000_000, 1_000), (1, 3, 333_333_333_334),
     (0, 1, 0), (10**10, 28_000_000_000, 357_142_857_143)],
)
def test_serialisation_rounds_up_to_a_picosecond(nbytes, rate, ps):
    # 512 B at 28 GB/s = 18285.71 ps -> 18286; 10 GB needs more than 64-bit intermediates.
    assert native_serialisation(nbytes, rate) == reference_serialisation(nbytes, rate) == ps


def _grouped_workload(grouped: bool):
    """Die 0 writes 3 messages (to dies 2, 3, 4) and dies 2..4 each write one back to die 0.
    Grouped: one send op carries die 0's three writes and one receive op waits for the three
    replies; otherwise one send / receive op per message (the same traffic)."""
    from cmemu.lower import lowered_from_parts
    from cmemu.vocab import OP_KIND_RECV, OP_KIND_SEND
    from cmemu.lower.comm import MessageTable

    topo = build_topology(load_system("mini"))
    table = MessageTable()
    if grouped:
        # ops: 0 send (die 0), 1..3 receives (dies 2..4), 4..6 sends back (dies 2..4), 7 receive (die 0)
        kinds = [OP_KIND_SEND] + [OP_KIND_RECV] * 3 + [OP_KIND_SEND] * 3 + [OP_KIND_RECV]
        rank = [0, 2, 3, 4, 2, 3, 4, 0]
        for k, d in enumerate((2, 3, 4)):
            table.add(topo, 0, d, 5000 * (k + 1), "ub", send_op=0, recv_op=1 + k)
        for k, d in enumerate((2, 3, 4)):
            table.add(topo, d, 0, 700 * (k + 1), "ub", send_op=4 + k, recv_op=7)
        op_msg = [0, 0, 1, 2, 3, 4, 5, 3]
        succ = ([1, 2, 3], [4, 5, 6])
    else:
        # ops: 0..2 sends (die 0), 3..5 receives, 6..8 sends back, 9..11 receives (die 0)
        kinds = [OP_KIND_SEND] * 3 + [OP_KIND_RECV] * 3 + [OP_KIND_SEND] * 3 + [OP_KIND_RECV] * 3
        rank = [0, 0, 0, 2, 3, 4, 2, 3, 4, 0, 0, 0]
        for k, d in enumerate((2, 3, 4)):
            table.add(topo, 0, d, 5000 * (k + 1), "ub", send_op=k, recv_op=3 + k)
        for k, d in enumerate((2, 3, 4)):
            table.add(topo, d, 0, 700 * (k + 1), "ub", send_op=6 + k, recv_op=9 + k)
        op_msg = [0, 1, 2, 0, 1, 2, 3, 4, 5, 3, 4, 5]
        succ = ([3, 4, 5], [6, 7, 8])
    return lowered_from_parts(kinds, np.zeros(len(kinds)), *succ, table, op_msg=op_msg, rank=rank)


@pytest.mark.parametrize("native", [True, False])
def test_one_op_can_carry_many_messages(native):
    g = _run(_grouped_workload(True), native)
    s = _run(_grouped_workload(False), native)
    # The same traffic: the same deliveries, and the same bytes on every link.
    np.testing.assert_array_equal(g.msg_delivered_ps, s.msg_delivered_ps)
    np.testing.assert_array_equal(g.link_bytes, s.link_bytes)
    # The grouped send ends when the last of its writes is acknowledged, as the last single send
    # does; the grouped receive when the last reply is delivered.
    assert g.op_end_ps[0] == max(s.op_end_ps[0:3])
    assert g.op_end_ps[7] == max(s.op_end_ps[9:12]) == max(s.msg_delivered_ps[3:6])
    assert g.ops_done == 8 and s.ops_done == 12


def test_many_message_ops_native_matches_reference():
    _same(_run(_grouped_workload(True), True), _run(_grouped_workload(True), False))


def test_packet_records_match_the_link_counters_and_the_reference():
    L = traffic_workload(build_topology(load_system("mini")), messages=60, seed=3)
    recs = []
    for native in (True, False):
        e = make_engine(L, _fabric(), native=native, record_packets=True)
        assert e.run() is True
        r = e.packet_records()
        assert r["start_ps"].size == e.packets_sent
        # Per link, the recorded wire bytes are the link's byte counter, and busy time its busy.
        np.testing.assert_array_equal(np.bincount(r["link"], weights=r["wire_bytes"], minlength=len(e.link_bytes)),
                                      e.link_bytes)
        np.testing.assert_array_equal(np.bincount(r["link"], weights=r["end_ps"] - r["start_ps"],
                                                  minlength=len(e.link_bytes)), e.link_busy_ps)
        assert np.all(np.diff(r["start_ps"]) >= 0)  # in the order they started
        recs.append(r)
    for k in recs[0]:
        np.testing.assert_array_equal(recs[0][k], recs[1][k], err_msg=k)
    # Off by default: nothing kept.
    e = make_engine(L, _fabric())
    e.run()
    assert e.packet_records()["start_ps"].size == 0


def _plane_workload(plane, messages, seed):
    from cmemu.lower import lowered_from_parts
    from cmemu.vocab import OP_KIND_RECV, OP_KIND_SEND
    from cmemu.lower.comm import MessageTable

    topo = build_topology(load_system("mini"))
    rng = np.random.default_rng(seed)
    table, kind, op_msg, rank = MessageTable(), [], [], []
    for _ in range(messages):
        src, dst = (int(x) for x in rng.choice(topo.num_dies, size=2, replace=False))
        s = len(kind)
        m = table.add(topo, src, dst, int(rng.integers(1, 64 * 1024)), plane, send_op=s, recv_op=s + 1)
        kind += [OP_KIND_SEND, OP_KIND_RECV]
        op_msg += [m, m]
        rank += [src, dst]
    return lowered_from_parts(kind, np.zeros(len(kind)), [], [], table, op_msg=op_msg, rank=rank)


@pytest.mark.parametrize("plane", ["ub", "rdma", "vpc"])
def test_a_failure_that_fails_nothing_changes_no_result(plane):
    # Packets join their next queue when sent (no event per switch hop); a failure during the run
    # turns the ones still on the wire back into arrivals. A failure of nothing, after the run,
    # must leave every time as it was.
    from cmemu.faults import NONE

    topo = build_topology(load_system("mini"))
    L = _plane_workload(plane, 150, 4)
    late = build_fabric(topo, schedule=[(10**17, NONE)])
    for native in (True, False):
        a = make_engine(L, _fabric(), native=native)
        b = make_engine(L, late, native=native)
        assert a.run() and b.run()
        np.testing.assert_array_equal(a.op_end_ps, b.op_end_ps)
        np.testing.assert_array_equal(a.msg_delivered_ps, b.msg_delivered_ps)
        assert b.events == a.events + 1  # the failure's own event


@pytest.mark.parametrize("plane", ["rdma", "vpc"])
def test_a_shared_fifo_switch_serves_packets_in_order_of_arrival(plane):
    # The RDMA switch and the DPUs keep one FIFO for all inputs. Die 2's 1-B write reaches the
    # switch before die 0's 4 KB one (still on the wire): it must not wait behind it.
    from cmemu.lower import lowered_from_parts
    from cmemu.vocab import OP_KIND_RECV, OP_KIND_SEND
    from cmemu.lower.comm import MessageTable

    topo = build_topology(load_system("mini"))

    def run(pairs):
        t = MessageTable()
        rank, op_msg = [], []
        for k, (src, nbytes) in enumerate(pairs):
            t.add(topo, src, 4, nbytes, plane, send_op=2 * k, recv_op=2 * k + 1)
            rank += [src, 4]
            op_msg += [k, k]
        e = make_engine(lowered_from_parts([OP_KIND_SEND, OP_KIND_RECV] * len(pairs), [0] * 2 * len(pairs), [], [],
                                           t, op_msg=op_msg, rank=rank), _fabric())
        e.run()
        return e.msg_delivered_ps

    alone = run([(2, 1)])[0]
    both = run([(0, 4096), (2, 1)])
    assert both[1] == alone


@pytest.mark.parametrize("dt", [-1, 0, 1])
def test_a_link_failing_as_a_packet_arrives_loses_it_as_without_queueing_ahead(dt):
    # A packet queued ahead at an L1 switch arrives at t; its link fails at t - 1, t or t + 1 ps.
    # A failure is handled before the arrivals of its time, so at t the packet is lost, as it is
    # when every arrival is an event (link_own_queue all 0).
    import dataclasses

    from cmemu.faults import parse_failures
    from cmemu.lower import lowered_from_parts
    from cmemu.vocab import OP_KIND_RECV, OP_KIND_SEND
    from cmemu.lower.comm import MessageTable

    topo = build_topology(load_system("mini"))
    t = MessageTable()
    t.add(topo, 0, 16, 20_000, "ub", send_op=0, recv_op=1)
    L = lowered_from_parts([OP_KIND_SEND, OP_KIND_RECV], [0, 0], [], [], t, op_msg=[0, 0], rank=[0, 16])
    e = make_engine(L, _fabric(), record_packets=True)
    e.run()
    r = e.packet_records()
    link = int(r["link"][0])
    arrive = int(r["end_ps"][0] + _fabric().link_latency_ps[link])
    F = build_fabric(topo, schedule=[(arrive + dt, parse_failures([f"link:{link}"], topo))])
    events_only = dataclasses.replace(F, link_own_queue=np.zeros_like(F.link_own_queue))
    runs = [make_engine(L, f, native=native) for f in (F, events_only) for native in (True, False)]
    for run in runs:
        assert run.run()
    assert len({(x.packets_lost, tuple(x.op_end_ps)) for x in runs}) == 1
    assert runs[0].packets_lost == (1 if dt <= 0 else 0)
