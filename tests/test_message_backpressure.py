"""Back-pressure on the message-level fabric (`--fabric message-bp`): receive buffers bounded as
the packet fabric's credits bound them, by hand. See docs/model.md, "Back-pressure"."""
import math

import numpy as np
import pytest

from cmemu.fabric import build_fabric
from cmemu.lower import lowered_from_parts
from cmemu.lower.comm import MessageTable
from cmemu.run import simulate
from cmemu.spec import load_system
from cmemu.topology import build_topology
from cmemu.vocab import OP_KIND_RECV, OP_KIND_SEND

# One plane; the buffer at L1 of a die's port holds seven 4 KB packets and not eight (the least
# the die-to-die link's credits allow).
SMALL = ["ub.sub_planes=1", "ub.die_ports=1", "ub.cpu_ports=1", "ub.vl_buffer_byte=33000"]
N = 10  # packets each sender writes


def two_into_one(topo, size):
    """Dies 0 and 4 each write ``size`` bytes to die 2 (all three in one node), at once."""
    table = MessageTable()
    for i, s in enumerate((0, 4)):
        table.add(topo, s, 2, size, "ub", send_op=2 * i, recv_op=2 * i + 1)
    return lowered_from_parts([OP_KIND_SEND, OP_KIND_RECV] * 2, [0] * 4, [], [], table, op_msg=[0, 0, 1, 1],
                              rank=[0, 2, 4, 2])


def starts(e, msg):
    """Per link, the start times of the message's packets there, in packet order."""
    r = e.packet_records()
    out = {}
    for k in np.flatnonzero(r["msg"] == msg)[np.argsort(r["seq"][r["msg"] == msg], kind="stable")]:
        out.setdefault(int(r["link"][k]), []).append(int(r["start_ps"][k]))
    return out


@pytest.mark.parametrize("native", [True, False])
def test_two_senders_into_one_by_hand(native):
    topo = build_topology(load_system("mini", SMALL))
    ub = topo.spec.ub
    F = build_fabric(topo, model="message-bp")
    s = math.ceil(ub.flit_wire_byte(4096 + ub.header_write_byte) * 1e12 / 28e9)  # a packet's time on a link
    w, d = round(ub.link_latency_ns * 1000), round((ub.link_latency_ns + ub.switch_latency_ns) * 1000)
    W = ub.flit_wire_byte(4096 + ub.header_write_byte)
    t0 = round(ub.initiator_startup_ns * 1000)
    up_a, up_b, down = int(F.ep_up[0].max()), int(F.ep_up[4].max()), int(F.ep_down[2].max())
    C, m = int(F.link_credit_byte[up_b]), 7
    assert m * W <= C < (m + 1) * W and w < s
    e = simulate(two_into_one(topo, N * 4096), F, native=native, record_packets=True)
    a, b = starts(e, 0), starts(e, 1)
    # Die 0's packets are reserved first: back to back on its port, and on die 2's link as they
    # arrive there, one link time after the other.
    assert a[up_a] == [t0 + k * s for k in range(N)]
    assert a[down] == [t0 + k * s + w for k in range(1, N + 1)]
    # Die 4's wait at L1 for die 2's link until die 0's have gone, the k-th until t0 + (N + k)s + w.
    # Its first m fill its port's buffer there (full from the m-th's start to the first's
    # departure), so its port is blocked till then; from then on each packet that goes fills it
    # again until the next departure, one link time on: its (m + i)-th goes at t0 + (N + i)s + w.
    assert b[up_b] == [t0 + k * s for k in range(m)] + [t0 + (N + i) * s + w for i in range(1, N - m + 1)]
    assert b[down] == [t0 + (N + k) * s + w for k in range(1, N + 1)]
    # Unbounded buffers: the same times on die 2's link, but die 4's port is never held back.
    e = simulate(two_into_one(topo, N * 4096), build_fabric(topo, model="message"), native=native,
                 record_packets=True)
    assert starts(e, 1)[up_b] == [t0 + k * s for k in range(N)]
    assert starts(e, 1)[down] == b[down]
    # Delivered with its last packet, the same either way: its tail at die 2 and the write.
    assert int(e.op_end_ps[3]) == t0 + (2 * N + 1) * s + w + d + round(203 * 1e6 / 1800)


def test_no_congestion_no_change():
    # Where no buffer fills, back-pressure changes nothing: the same times as without it.
    topo = build_topology(load_system("mini", []))
    L = two_into_one(topo, 4096)
    a = simulate(L, build_fabric(topo, model="message"))
    b = simulate(L, build_fabric(topo, model="message-bp"))
    assert np.array_equal(a.op_end_ps, b.op_end_ps)
    assert a.events == b.events


def test_native_and_reference_agree_where_buffers_bind():
    # An all-to-all among 12 dies of both nodes of mini, 64 KiB each, with 32 KiB receive
    # buffers: they fill, so back-pressure holds senders back (the run is slower than unbounded),
    # and the engine and the pure-Python reference reserve every packet at the same times.
    topo = build_topology(load_system("mini", ["ub.vl_buffer_byte=33000"]))
    dies = [0, 2, 4, 6, 8, 10, 16, 18, 20, 22, 24, 26]
    table = MessageTable()
    kinds, rank, op_msg = [], [], []
    for s in dies:
        for d in dies:
            if s != d:
                i = len(op_msg) // 2
                table.add(topo, s, d, 1 << 16, "ub", send_op=2 * i, recv_op=2 * i + 1)
                kinds += [OP_KIND_SEND, OP_KIND_RECV]
                rank += [s, d]
                op_msg += [i, i]
    L = lowered_from_parts(kinds, [0] * len(kinds), [], [], table, op_msg=op_msg, rank=rank)
    F = build_fabric(topo, model="message-bp")
    native = simulate(L, F, record_packets=True)
    ref = simulate(L, F, native=False, record_packets=True)
    assert np.array_equal(native.op_end_ps, ref.op_end_ps)
    rn, rr = native.packet_records(), ref.packet_records()
    assert all(np.array_equal(rn[k], rr[k]) for k in ("start_ps", "link", "msg", "seq"))
    unbounded = simulate(L, build_fabric(topo, model="message"))
    assert native.op_end_ps.max() > unbounded.op_end_ps.max()
