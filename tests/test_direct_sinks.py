"""The packet fabric works out a write's arrival at a die when the packet starts on the die's link,
without an arrival event, where that changes nothing (cmemu.fabric.Fabric.direct_sinks): the die
takes the packet at once and the link's credits can never run out. Checked here against the
same run with every arrival an event (direct_sinks emptied), native and reference alike, and the
bound on the link's credits by hand."""
from __future__ import annotations

import numpy as np
import pytest
from conftest import all_to_all

from cmemu._core import make_engine
from cmemu.fabric import Fabric, build_fabric
from cmemu.spec import load_system
from cmemu.topology import build_topology


class _Events(Fabric):
    """The same fabric, every arrival an event (the engine before direct sinks)."""

    def direct_sinks(self):
        return np.full(self.link_dst_ep.shape[0], -1, dtype=np.int32)


def _runs(credit_to_die=None, dies=range(16), nbytes=64 * 1024):
    topo = build_topology(load_system("mini"))
    fabric = build_fabric(topo)
    if credit_to_die is not None:
        fabric.link_credit_byte[fabric.link_dst_ep >= 0] = credit_to_die
    events = _Events(**vars(fabric))
    L = all_to_all(topo, list(dies), nbytes)
    out = {}
    for name, F, native in (("direct", fabric, True), ("events", events, True), ("reference", fabric, False)):
        e = make_engine(L, F, native=native)
        assert e.run() is True
        out[name] = e
    return fabric, out


def test_an_all_to_all_keeps_every_time_with_no_arrival_events():
    # 16 dies of mini, each writing 64 KiB to every other: 240 messages of 16 packets, all SDMA
    # (a die's DMA initiator), every one into a die over a link whose credits cannot run out.
    fabric, r = _runs()
    direct, events, ref = r["direct"], r["events"], r["reference"]
    for e in (events, ref):
        np.testing.assert_array_equal(direct.op_start_ps, e.op_start_ps)
        np.testing.assert_array_equal(direct.op_end_ps, e.op_end_ps)
        np.testing.assert_array_equal(direct.msg_delivered_ps, e.msg_delivered_ps)
        assert direct.now == e.now and direct.packets_sent == e.packets_sent
    assert direct.events == ref.events and direct.max_pending == ref.max_pending
    packets = 240 * 16
    assert events.event_counts["packet_arrive"] == packets
    assert "packet_arrive" not in direct.event_counts
    assert events.events - direct.events == packets


def test_aiv_writes_keep_every_time_with_no_arrival_events():
    # Two vector cores on each of 8 dies of mini, each writing 42 messages of 7,212 B (2 packets)
    # round the other 7 dies: on even dies each write waits for the one before (flow 1), on odd
    # ones they go back to back, and the 33rd waits for the 1st's ack (the ring). An AIV's write
    # is absorbed, its ack and its ring slot worked out, when its last packet starts on the die's
    # link: the same times as with its arrival an event, as its waits take the ack's time.
    from cmemu.fabric import aiv_initiator
    from cmemu.lower import lowered_from_parts
    from cmemu.lower.comm import MessageTable
    from cmemu.vocab import OP_KIND_SEND

    topo = build_topology(load_system("mini", ["comm.aiv_remote_write_startup_ns=2000"]))
    fabric = build_fabric(topo)
    table, rank = MessageTable(), []
    for op, (die, aiv) in enumerate((d, a) for a in (3, 5) for d in range(8)):
        dst = np.array([d for d in range(8) if d != die] * 6)
        table.add_many(topo, np.full(dst.size, die), dst, np.full(dst.size, 7212), np.full(dst.size, op),
                       np.full(dst.size, -1), ini=aiv_initiator(topo, die, aiv), flow=1 - die % 2)
        rank.append(die)
    L = lowered_from_parts([OP_KIND_SEND] * len(rank), [0] * len(rank), [], [], table, op_msg=range(len(rank)),
                           rank=rank)
    runs = {}
    for name, F, native in (("direct", fabric, True), ("events", _Events(**vars(fabric)), True),
                            ("reference", fabric, False)):
        runs[name] = make_engine(L, F, native=native)
        assert runs[name].run() is True
    direct, events, ref = runs["direct"], runs["events"], runs["reference"]
    for e in (events, ref):
        np.testing.assert_array_equal(direct.op_end_ps, e.op_end_ps)
        np.testing.assert_array_equal(direct.msg_delivered_ps, e.msg_delivered_ps)
    packets = 16 * 42 * 2
    assert events.event_counts["packet_arrive"] == packets and "packet_arrive" not in direct.event_counts
    assert events.events - direct.events >= packets  # (and a core woken at its ack, not at the arrival too)


def test_a_link_whose_credits_can_run_out_keeps_its_arrival_events():
    # Credits of two 4 KB packets on the links into the dies: less than a link holds at once
    # (176.8 ns of latency and 148 ns of serialisation at 28 GB/s, 9.1 KB, and one packet more), so
    # senders wait for them: the arrivals that give them back stay events.
    fabric, r = _runs(credit_to_die=2 * 4160)
    assert (fabric.direct_sinks()[fabric.link_dst_ep >= 0] == -1).all()
    direct, events, ref = r["direct"], r["events"], r["reference"]
    assert direct.event_counts["packet_arrive"] == 240 * 16
    np.testing.assert_array_equal(direct.op_end_ps, events.op_end_ps)
    np.testing.assert_array_equal(direct.op_end_ps, ref.op_end_ps)
    assert direct.events == events.events == ref.events
    assert direct.now > _runs()[1]["direct"].now  # (the credits did hold senders back)


def test_the_credit_bound_by_hand():
    # A link holds its packets' credits from their start to their arrival: at most its latency
    # plus the longest packet's serialisation at line rate, and one packet more. Mini's link 1, into
    # a die: 28 GB/s, 176.8 ns; the longest packet 4,096 B + a VPC header of 78 B = 4,174 B, 149,072
    # ps (rounded up); 28 GB/s x 325.872 ns = 9,124.4 B, so 9,125 + 4,174 = 13,299 B.
    fabric = build_fabric(build_topology(load_system("mini")))
    link = 1
    assert fabric.link_dst_ep[link] >= 0
    assert (fabric.link_rate_byte_per_s[link], fabric.link_latency_ps[link]) == (28 * 10**9, 176_800)
    assert fabric.direct_sinks()[link] == fabric.link_dst_ep[link]  # (its credits: 60,585 B)
    for credit, direct in ((13_299, True), (13_298, False)):
        fabric.link_credit_byte[link] = credit
        assert fabric.direct_sinks()[link] == (fabric.link_dst_ep[link] if direct else -1)


@pytest.mark.parametrize("fabric_model", ["message", "message-bp"])
def test_none_on_the_message_level_fabrics(fabric_model):
    fabric = build_fabric(build_topology(load_system("mini")), model=fabric_model)
    assert (fabric.direct_sinks() == -1).all()
