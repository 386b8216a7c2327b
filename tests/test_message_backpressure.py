"""Back-pressure on the message-level fabric (`--fabric message-bp`): receive buffers bounded as
the packet fabric's credits bound them, by hand. See docs/model.md, "Back-pressure"."""
import math

import numpy as np
import pytest

from cmemu.fabric import FABRIC_MODELS, build_fabric
from cmemu.lower import lowered_from_parts
from cmemu.lower.comm import MessageTable
from cmemu.run import simulate
from cmemu.spec import load_system
from cmemu.topology import build_topology
from cmemu.vocab import OP_KIND_RECV, OP_KIND_SEND
from conftest import all_to_all

# One plane; the buffer at L1 of a die's port holds seven 4 KB packets and not eight (the least
# the die-to-die link's credits allow).
SMALL = ["ub.sub_planes=1", "ub.die_ports=1", "ub.cpu_ports=1", "ub.vl_buffer_byte=33000"]
N = 10  # packets each sender writes


def starts(e, msg):
    """Per link, the start times of the message's packets there, in packet order."""
    r = e.packet_records()
    out = {}
    for k in np.flatnonzero(r["msg"] == msg)[np.argsort(r["seq"][r["msg"] == msg], kind="stable")]:
        out.setdefault(int(r["link"][k]), []).append(int(r["start_ps"][k]))
    return out


def senders_into_one(topo, size, senders=(0, 4)):
    """Each of ``senders`` writes ``size`` bytes to die 2 (all in one node), at once."""
    table = MessageTable()
    for i, s in enumerate(senders):
        table.add(topo, s, 2, size, "ub", send_op=2 * i, recv_op=2 * i + 1)
    return lowered_from_parts([OP_KIND_SEND, OP_KIND_RECV] * len(senders), [0] * 2 * len(senders), [], [], table,
                              op_msg=np.repeat(np.arange(len(senders)), 2), rank=[r for s in senders for r in (s, 2)])


def small_case():
    """mini with SMALL: a packet's time on a link s, a link's latency w, the hop and write latency
    at the far end d, the initiator's start-up t0, and the look-ahead in packets: a sender
    reserves the packets that start on its port within 1 us (FABRIC_MODELS)."""
    topo = build_topology(load_system("mini", SMALL))
    ub = topo.spec.ub
    s = math.ceil(ub.flit_wire_byte(4096 + ub.header_write_byte) * 1e12 / 28e9)
    w, d = round(ub.link_latency_ns * 1000), round((ub.link_latency_ns + ub.switch_latency_ns) * 1000)
    t0 = round(ub.initiator_startup_ns * 1000)
    assert FABRIC_MODELS["message-bp"] == 1_000_000 and 6 * s < 1_000_000 < 7 * s and 2 * s < 1_000_000 - t0 < 3 * s
    return topo, s, w, d, t0


@pytest.mark.parametrize("native", [True, False])
def test_two_senders_into_one_by_hand(native):
    topo, s, w, d, t0 = small_case()
    ub = topo.spec.ub
    F = build_fabric(topo, model="message-bp")
    W = ub.flit_wire_byte(4096 + ub.header_write_byte)
    up_a, up_b, down = int(F.ep_up[0].max()), int(F.ep_up[4].max()), int(F.ep_down[2].max())
    C, m = int(F.link_credit_byte[up_b]), 7
    assert m * W <= C < (m + 1) * W and w < s
    e = simulate(senders_into_one(topo, N * 4096), F, native=native, record_packets=True)
    a, b = starts(e, 0), starts(e, 1)
    # Both ports send back to back. A sender reserves a packet's path once it starts on its port
    # within the look-ahead: at 0, the three that start by 1 us (t0 + 2s); at t0 + 3s, when its
    # fourth starts, the next seven (by t0 + 3s + 1 us). Die 0 goes first each time, so die 2's link
    # takes them in turns of those: die 0's 3, die 4's 3, die 0's 7, die 4's 7, one link time
    # after the other from when the first gets there.
    assert a[up_a] == [t0 + k * s for k in range(N)] and b[up_b] == a[up_a]
    assert a[down] == [t0 + k * s + w for k in [1, 2, 3] + list(range(7, 14))]
    assert b[down] == [t0 + k * s + w for k in [4, 5, 6] + list(range(14, 21))]
    # At most seven of die 4's packets wait at L1 at once (its 4th to 10th, for die 0's seven):
    # its buffer there holds them, so back-pressure changes nothing; unbounded, the same times.
    e2 = simulate(senders_into_one(topo, N * 4096), build_fabric(topo, model="message"), native=native,
                  record_packets=True)
    assert starts(e2, 0) == a and starts(e2, 1) == b
    # Delivered with its last packet: its tail at die 2 and the write.
    assert int(e.op_end_ps[3]) == t0 + (2 * N + 1) * s + w + d + round(203 * 1e6 / 1800)


@pytest.mark.parametrize("native", [True, False])
def test_three_senders_back_pressure_by_hand(native):
    # Dies 0, 4 and 6 write 12 packets each to die 2. The turns on die 2's link (as above): at 0
    # each sender's first 3 (die 2's link at 1-3, 4-6, 7-9 link times after t0 + w); at t0 + 3s each
    # one's next 7 (10-16, 17-23, 24-30); then the rest. Die 2's link is never idle.
    topo, s, w, d, t0 = small_case()
    n = 12
    F = build_fabric(topo, model="message-bp")
    ups, down = [int(F.ep_up[x].max()) for x in (0, 4, 6)], int(F.ep_down[2].max())
    e = simulate(senders_into_one(topo, n * 4096, (0, 4, 6)), F, native=native, record_packets=True)
    up = [starts(e, i)[ups[i]] for i in range(3)]
    dn = [starts(e, i)[down] for i in range(3)]
    assert sorted(dn[0] + dn[1] + dn[2]) == [t0 + k * s + w for k in range(1, 3 * n + 1)]
    assert dn[2][:3] == [t0 + k * s + w for k in (7, 8, 9)] and dn[1][3] == t0 + 17 * s + w
    # A port's buffer at L1 holds 7 packets. Die 6's first 7 are all there by t0 + 6s (its first
    # leaves at 7s + w): its 8th waits for that, and each next one for the one 7 before it to
    # leave. Die 4's 4th to 10th wait at L1 till 17s + w on: its 11th and 12th wait for room, and so
    # do die 0's (its 4th leaves at 10s + w).
    held = {0: [10, 11], 1: [10, 11], 2: [7, 8, 9, 10, 11]}
    for i in range(3):
        for k in range(n):
            if k in held[i]:
                assert up[i][k] == dn[i][k - 7], (i, k)  # starts as the credit comes back
            else:
                assert up[i][k] == t0 + k * s, (i, k)
    # Unbounded, no port is held back, and die 2's link takes them in the same turns.
    e2 = simulate(senders_into_one(topo, n * 4096, (0, 4, 6)), build_fabric(topo, model="message"), native=native,
                  record_packets=True)
    for i in range(3):
        assert starts(e2, i)[ups[i]] == [t0 + k * s for k in range(n)]
        assert starts(e2, i)[down] == dn[i]


def test_no_congestion_no_change():
    # Where no buffer fills, back-pressure changes nothing: the same times as without it.
    topo = build_topology(load_system("mini", []))
    L = senders_into_one(topo, 4096)
    a = simulate(L, build_fabric(topo, model="message"))
    b = simulate(L, build_fabric(topo, model="message-bp"))
    assert np.array_equal(a.op_end_ps, b.op_end_ps)
    assert a.events == b.events


def test_native_and_reference_agree_where_buffers_bind():
    # An all-to-all among 12 dies of both nodes of mini, 64 KiB each, with 32 KiB receive
    # buffers: they fill, so back-pressure holds senders back (the run is slower than unbounded),
    # and the engine and the pure-Python reference reserve every packet at the same times.
    topo = build_topology(load_system("mini", ["ub.vl_buffer_byte=33000"]))
    L = all_to_all(topo, [0, 2, 4, 6, 8, 10, 16, 18, 20, 22, 24, 26], 1 << 16)
    F = build_fabric(topo, model="message-bp")
    native = simulate(L, F, record_packets=True)
    ref = simulate(L, F, native=False, record_packets=True)
    assert np.array_equal(native.op_end_ps, ref.op_end_ps)
    rn, rr = native.packet_records(), ref.packet_records()
    assert all(np.array_equal(rn[k], rr[k]) for k in ("start_ps", "link", "msg", "seq"))
    unbounded = simulate(L, build_fabric(topo, model="message"))
    assert native.op_end_ps.max() > unbounded.op_end_ps.max()
