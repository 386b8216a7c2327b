"""Message-bp: an AIV's write to another node has its first link reserved when it is issued and the
rest of its path (its tail) later, by the time its two extra hops take, so that at the die's link,
where it meets the writes from the die's own node, it is reserved in the order the packets arrive
there, as the packet fabric serves them (docs/model.md, "Back-pressure", the order of arrival).
By hand on mini, and the engine against the pure-Python reference."""
import math

import numpy as np
import pytest

from cmemu.fabric import aiv_initiator, build_fabric
from cmemu.lower import lowered_from_parts
from cmemu.lower.comm import FLOW_BASE, MessageTable
from cmemu.run import simulate
from cmemu.spec import load_system
from cmemu.topology import build_topology
from cmemu.vocab import OP_KIND_SEND

# One sub-plane, one port per die: every packet's path is known. An AIV's MTE start-up of 1 us.
ONE_PLANE = ["ub.sub_planes=1", "ub.die_ports=1", "ub.cpu_ports=1", "comm.aiv_remote_write_startup_ns=1000"]
REMOTE, LOCAL, DST = 16, 4, 2  # die 16 is in node 1; dies 4 and 2 in node 0


def two_writes(topo, t_remote, t_local):
    """One 4 KiB write (one packet) from an AIV of die 16 and one from an AIV of die 4, both to
    die 2, whose first packets leave their dies at t_remote and t_local ps (their kernels' work
    before them, prep, sets when)."""
    startup = round(topo.spec.comm.aiv_remote_write_startup_ns * 1000)
    table = MessageTable()
    table.add_many(topo, np.array([REMOTE, LOCAL]), np.full(2, DST), np.full(2, 4096), np.array([0, 1]),
                   np.full(2, -1), ini=aiv_initiator(topo, np.array([REMOTE, LOCAL]), 0),
                   prep=np.array([t_remote - startup, t_local - startup]), flow=np.zeros(2, dtype=np.int64))
    return lowered_from_parts([OP_KIND_SEND] * 2, [0, 0], [], [], table, op_msg=[0, 1], rank=[REMOTE, LOCAL])


def last_link_starts(e, down):
    """Start time, ps, of each message's packet on the link into die 2."""
    r = e.packet_records()
    on = r["link"] == down
    return {int(m): int(t) for m, t in zip(r["msg"][on], r["start_ps"][on])}


@pytest.mark.parametrize("native", [True, False])
def test_local_write_arriving_first_goes_first(native):
    # Die 16's write leaves at 3,000 ns and crosses L1 -> L2 -> L1; die 4's leaves 600 ns later
    # and reaches the L1 chip of node 0 first, by 2 s + 2 w + 2 sw - 600 ns (50.8 ns), while the
    # other's is still on its way: the packet fabric sends it first, and the other after it.
    # Each AIV reserves its write when it issues its MTE instruction, its start-up (1 us) before
    # the packet leaves: die 16's at 2,000 ns, die 4's at 2,600 ns. With the whole path reserved
    # then (message), die 16's write takes the link first and die 4's waits behind it. On
    # message-bp die 16's tail is reserved 2 (s + w + sw) later, rounded up to the event
    # wheel's 16.384 ns: at 2,655.36 ns, after die 4's write.
    topo = build_topology(load_system("mini", ONE_PLANE))
    ub = topo.spec.ub
    s = math.ceil(ub.flit_wire_byte(4096 + ub.header_write_byte) * 1e12 / 28e9)
    w, sw = round(ub.link_latency_ns * 1000), round(ub.switch_latency_ns * 1000)
    t_remote, t_local = 3_000_000, 3_600_000
    remote_at = t_remote + 3 * s + 3 * w + 2 * sw  # at node 0's L1 chip
    local_at = t_local + s + w
    assert local_at < remote_at < local_at + s  # they meet there, die 4's first
    L = two_writes(topo, t_remote, t_local)
    arrival_order = {1: local_at, 0: local_at + s}
    for model, want in (("packet", arrival_order), ("message-bp", arrival_order),
                        ("message", {0: remote_at, 1: remote_at + s})):
        F = build_fabric(topo, model=model)
        down = int(F.ep_down[DST].max())
        e = simulate(L, F, native=native or model == "packet", record_packets=True)
        assert last_link_starts(e, down) == want, model


def test_tails_within_a_node_change_nothing():
    # Writes within a node have no tail: on message-bp with buffers that never fill they are
    # reserved exactly as on message, with the same events.
    topo = build_topology(load_system("mini", ["comm.aiv_remote_write_startup_ns=250"]))
    rng = np.random.default_rng(3)
    n = 60
    table = MessageTable()
    table.add_many(topo, np.zeros(n), rng.integers(2, 16, n), rng.integers(32, 20000, n), np.zeros(n), np.full(n, -1),
                   ini=aiv_initiator(topo, 0, rng.integers(0, 8, n)), flow=rng.choice([0, 1, FLOW_BASE], n))
    L = lowered_from_parts([OP_KIND_SEND], [0], [], [], table, op_msg=[0], rank=[0])
    a = simulate(L, build_fabric(topo, model="message"))
    b = simulate(L, build_fabric(topo, model="message-bp"))
    assert np.array_equal(a.op_end_ps, b.op_end_ps)
    assert a.events == b.events


@pytest.mark.parametrize("buffer", [65536, 33000])
def test_native_equals_reference(buffer):
    # AIVs of dies of both nodes write to dies of both nodes, some waiting for the write before,
    # with the default buffers and with buffers of seven packets (they fill, so the tails' holds
    # at the L1 chips block links): every packet on every link at the same time, the same
    # events, and the tails counted as events of their own.
    topo = build_topology(load_system("mini", [f"ub.vl_buffer_byte={buffer}"]))
    rng = np.random.default_rng(11)
    n = 400
    senders = np.array([0, 2, 5, 16, 19, 24])
    ops = np.sort(rng.integers(0, senders.size, n))  # each sender's writes, one op each
    ops[:senders.size] = np.arange(senders.size)
    ops.sort()
    src = senders[ops]
    dst = (src + rng.integers(1, 31, n)) % 32
    dst = np.where(dst // 2 == src // 2, (dst + 2) % 32, dst)  # not the die itself or its twin
    table = MessageTable()
    table.add_many(topo, src, dst, rng.integers(32, 30000, n), ops, np.full(n, -1),
                   ini=aiv_initiator(topo, src, rng.integers(0, 6, n)), prep=rng.integers(0, 500_000, n),
                   flow=rng.choice([0, 1, 2, 1 | FLOW_BASE], n))
    first = np.searchsorted(ops, np.arange(senders.size))  # an op names one of its messages
    L = lowered_from_parts([OP_KIND_SEND] * senders.size, [0] * senders.size, [], [], table, op_msg=first,
                           rank=senders)
    F = build_fabric(topo, model="message-bp")
    a = simulate(L, F, record_packets=True)
    b = simulate(L, F, native=False, record_packets=True)
    assert np.array_equal(a.op_end_ps, b.op_end_ps)
    ra, rb = a.packet_records(), b.packet_records()
    assert all(np.array_equal(ra[k], rb[k]) for k in ("start_ps", "end_ps", "link", "msg", "seq"))
    assert a.events == b.events
    assert a.event_counts.get("tail", 0) > 0
