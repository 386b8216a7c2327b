"""A vector core as an initiator (AIV-Direct): its remote reads and writes are its own, issued one
after another as its kernel's waits allow (cmemu.lower.comm: prep and flow), by hand on mini."""
import math

import numpy as np
import pytest

from cmemu.fabric import AIV_MESSAGES_IN_FLIGHT, aiv_initiator, build_fabric
from cmemu.lower import lowered_from_parts
from cmemu.lower.comm import FLOW_BASE, MessageTable
from cmemu.run import simulate
from cmemu.spec import load_system
from cmemu.topology import build_topology
from cmemu.vocab import MSG_READ, MSG_WRITE, OP_KIND_RECV, OP_KIND_SEND


@pytest.fixture(scope="module")
def mini():
    topo = build_topology(load_system("mini", ["comm.aiv_remote_write_startup_ns=250", "comm.aiv_remote_read_startup_ns=250"]))
    return topo, build_fabric(topo), build_fabric(topo, model="message")


def stream(topo, n, size, dst=2, prep=0, flow=0, kind=MSG_WRITE, aiv=3):
    """One op on die 0 with n messages issued by die 0's AIV ``aiv``."""
    table = MessageTable()
    src, dst_ = (np.full(n, 0), np.full(n, dst)) if kind == MSG_WRITE else (np.full(n, dst), np.full(n, 0))
    op_kind = OP_KIND_SEND if kind == MSG_WRITE else OP_KIND_RECV
    table.add_many(topo, src, dst_, np.full(n, size), np.full(n, 0 if kind == MSG_WRITE else -1),
                   np.full(n, -1 if kind == MSG_WRITE else 0), kind=kind, ini=aiv_initiator(topo, 0, aiv),
                   prep=np.broadcast_to(prep, (n,)), flow=np.broadcast_to(flow, (n,)))
    return lowered_from_parts([op_kind], [0], [], [], table, op_msg=[0], rank=[0])


def run(L, fabric, native=True):
    return simulate(L, fabric, native=native)


def end(L, fabric, native=True):
    return int(run(L, fabric, native).op_end_ps[0])


def test_one_write_by_hand(mini):
    # 512 B from AIV 3 of die 0 to die 2 (same node): the AIV's start-up, one packet of 580 B
    # (52 B header, 29 flits) over die 0 -> L1 -> die 2, written to HBM, acked back.
    topo, fabric, _ = mini
    ub = topo.spec.ub
    wire, switch = round(ub.link_latency_ns * 1000), round(ub.switch_latency_ns * 1000)
    ser = lambda b: math.ceil(b * 1e12 / 28e9)  # noqa: E731
    there = 250_000 + ser(580) + wire + ser(580) + wire + switch + round(203 * 1e6 / 1800)
    back = ser(40) + wire + ser(40) + wire + switch
    assert end(stream(topo, 1, 512), fabric) == there + back


@pytest.mark.parametrize("model", [1, 2])
def test_writes_that_wait_for_the_one_before(mini, model):
    # flow 1: each write waits for the previous one's ack (as a fused MoE kernel's FillTriple
    # waits for its MTE3): n writes take n times one write's round trip, on an idle fabric.
    topo = mini[0]
    fabric = mini[model]
    one = end(stream(topo, 1, 7212), fabric)
    assert end(stream(topo, 3, 7212, flow=1), fabric) == 3 * one


def test_writes_that_do_not_wait_are_pipelined(mini):
    topo, fabric, _ = mini
    one = end(stream(topo, 1, 512), fabric)
    three = end(stream(topo, 3, 512), fabric)
    issue = int(fabric.ep_issue_ps[2 * aiv_initiator(topo, 0, 3)])  # one packet through the AIV's MTE3
    # The core issues the three stores back to back: each reaches the wire one packet's MTE3 time
    # after the one before (their start-ups overlap), on planes of their own.
    assert three == one + 2 * issue


@pytest.mark.parametrize("model", ["packet", "message"])
def test_the_ring_frees_at_a_message_s_ack(model):
    # An AIV has at most AIV_MESSAGES_IN_FLIGHT (32) messages incomplete. With an MTE start-up of
    # 2 us, one write's round trip R (start-up included) is longer than the 32 writes' issue
    # times, so the 33rd of writes that do not wait is held until the first is acked (R), then
    # takes R itself: 2R in all, the 32 before it done sooner (R + 31 issue times). Before, the
    # slot freed as the first write's last packet arrived (packet fabric: an ack's trip sooner)
    # or as it was reserved (message-level: long before).
    topo = build_topology(load_system("mini", ["comm.aiv_remote_write_startup_ns=2000"]))
    fabric = build_fabric(topo, model=model)
    n = AIV_MESSAGES_IN_FLIGHT
    one = end(stream(topo, 1, 512), fabric)
    issue = int(fabric.ep_issue_ps[2 * aiv_initiator(topo, 0, 3)])
    assert (n - 1) * issue < one
    assert end(stream(topo, n, 512), fabric) == one + (n - 1) * issue
    assert end(stream(topo, n + 1, 512), fabric) == 2 * one
    assert end(stream(topo, n + 1, 512), fabric, native=False) == 2 * one


def test_prep_overlaps_the_wait(mini):
    # Each write needs P of the core's own work (loading and quantising a token) after the
    # previous one was issued (FLOW_BASE), and the previous one's ack (flow 1). With P below the
    # round trip R the work hides behind the wait: P + R + R for two; above it, P + P + R.
    topo, fabric, _ = mini
    r = end(stream(topo, 1, 7212), fabric)
    bare = r - 250_000
    for p in (r // 4, 3 * r):
        got = end(stream(topo, 2, 7212, prep=p, flow=1 | FLOW_BASE), fabric)
        expected = p + max(p, r) + r if p < r else p + p + r
        assert got == expected, (p, r, bare)


def test_reads_two_in_flight(mini):
    # flow 2: a read waits for the one two places before it (a double-buffered pull): four reads
    # take two round trips of two reads each, about half of four in a row.
    topo, fabric, _ = mini
    one = end(stream(topo, 1, 7212, kind=MSG_READ), fabric)
    serial = end(stream(topo, 4, 7212, kind=MSG_READ, flow=1), fabric)
    two = end(stream(topo, 4, 7212, kind=MSG_READ, flow=2), fabric)
    assert serial == 4 * one
    assert 2 * one <= two < 2.2 * one


def test_cores_are_independent_initiators(mini):
    # Two AIVs of one die each with a chain of waiting writes run side by side.
    topo, fabric, _ = mini
    table = MessageTable()
    for aiv in (0, 1):
        table.add_many(topo, np.zeros(3), np.full(3, 2), np.full(3, 7212), np.full(3, 0), np.full(3, -1),
                       ini=aiv_initiator(topo, 0, aiv), flow=np.ones(3))
    L = lowered_from_parts([OP_KIND_SEND], [0], [], [], table, op_msg=[0], rank=[0])
    one_core = end(stream(topo, 3, 7212, flow=1), fabric)
    both = end(L, fabric)
    assert one_core <= both < one_core * 1.05


@pytest.mark.parametrize("model", [1, 2])
def test_native_equals_reference(mini, model):
    topo = mini[0]
    fabric = mini[model]
    rng = np.random.default_rng(7)
    table = MessageTable()
    n = 40
    table.add_many(topo, np.zeros(n), rng.integers(1, 32, n), rng.integers(32, 20000, n), np.zeros(n), np.full(n, -1),
                   ini=aiv_initiator(topo, 0, rng.integers(0, 4, n)), prep=rng.integers(0, 3_000_000, n),
                   flow=rng.choice([0, 1, 2, 1 | FLOW_BASE, FLOW_BASE], n))
    L = lowered_from_parts([OP_KIND_SEND], [0], [], [], table, op_msg=[0], rank=[0])
    a, b = run(L, fabric, True), run(L, fabric, False)
    assert np.array_equal(a.op_end_ps, b.op_end_ps)
    assert a.events == b.events
