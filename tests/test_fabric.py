"""The UB packet model: transactions by hand, credits, spraying, conservation."""
import math

import numpy as np
import pytest

from cmemu.errors import SpecError
from cmemu.fabric import build_fabric
from cmemu.lower import lowered_from_parts
from cmemu.lower.comm import MessageTable
from cmemu.run import simulate
from cmemu.scenarios.ub_p2p import all_to_all, bandwidth_byte_per_s, latency_ps
from cmemu.spec import load_system
from cmemu.topology import L_L1_UP, build_topology
from cmemu.vocab import MSG_ATOMIC, MSG_READ, MSG_WRITE, OP_KIND_RECV, OP_KIND_SEND


def fabric_for(*overrides):
    topo = build_topology(load_system("mini", list(overrides)))
    return topo, build_fabric(topo)


def one_message(topo, fabric, src, dst, size, kind=MSG_WRITE, bin_ps=0):
    table = MessageTable()
    if kind == MSG_WRITE:
        table.add(topo, src, dst, size, "ub", send_op=0, recv_op=1)
        L = lowered_from_parts([OP_KIND_SEND, OP_KIND_RECV], [0, 0], [], [], table, op_msg=[0, 0], rank=[0, 0])
    else:
        table.add(topo, src, dst, size, "ub", send_op=-1, recv_op=0, kind=MSG_READ)
        L = lowered_from_parts([OP_KIND_RECV], [0], [], [], table, op_msg=[0], rank=[0])
    return simulate(L, fabric, bin_ps=bin_ps)


def ser(nbytes, rate=28e9):
    return math.ceil(nbytes * 1e12 / rate)


def test_read_by_hand():
    # Die 0 reads 512 B from die 2 (same node): a 28 B request (two 20 B flits) goes
    # die 0 -> L1 -> die 2; after HBM's read latency a 540 B response (28 B header + 512 B, 27
    # flits) comes back on the same plane.
    topo, fabric = fabric_for()
    ub = topo.spec.ub
    wire, switch = round(ub.link_latency_ns * 1000), round(ub.switch_latency_ns * 1000)
    hop_lat = wire + (wire + switch)
    e = one_message(topo, fabric, src=2, dst=0, size=512, kind=MSG_READ)
    expected = (round(ub.initiator_startup_ns * 1000) + 2 * ser(40) + hop_lat + round(347 * 1e6 / 1800)
                + 2 * ser(540) + hop_lat)
    assert int(e.op_end_ps[0]) == expected
    assert e.packets_sent == 4  # request and response, two links each


def test_atomic_by_hand():
    # Die 0 atomically updates 8 B on die 2: the request carries the operand (28 + 8 B: two
    # flits), the target reads and writes HBM, the old value comes back (two flits).
    topo, fabric = fabric_for()
    ub = topo.spec.ub
    wire, switch = round(ub.link_latency_ns * 1000), round(ub.switch_latency_ns * 1000)
    hop_lat = wire + (wire + switch)
    table = MessageTable()
    table.add(topo, 2, 0, 8, "ub", send_op=-1, recv_op=0, kind=MSG_ATOMIC)
    e = simulate(lowered_from_parts([OP_KIND_RECV], [0], [], [], table, op_msg=[0], rank=[0]), fabric)
    hbm = round(347 * 1e6 / 1800) + round(203 * 1e6 / 1800)
    expected = round(ub.initiator_startup_ns * 1000) + 2 * ser(40) + hop_lat + hbm + 2 * ser(40) + hop_lat
    assert int(e.op_end_ps[0]) == expected


def test_write_to_cpu_by_hand():
    # A CPU is an endpoint too: 512 B from die 0 to CPU 0 of its node. The CPU's ports run at
    # 160 GB/s / 7; the CPU absorbs the write into DRAM at its sink rate, then acks.
    topo, fabric = fabric_for()
    ub = topo.spec.ub
    cpu = topo.cpu_endpoint(0)
    wire, switch = round(ub.link_latency_ns * 1000), round(ub.switch_latency_ns * 1000)
    cpu_rate = ub.cpu_link_rate_byte_per_s
    e = one_message(topo, fabric, 0, cpu, 512)
    arrive = round(ub.initiator_startup_ns * 1000) + ser(580) + wire + ser(580, cpu_rate) + wire + switch
    absorbed = arrive + ser(512, round(ub.cpu_memory_write_gbyte_per_s * 1e9))
    delivered = absorbed + round(ub.cpu_memory_write_latency_ns * 1000)
    assert int(e.op_end_ps[1]) == delivered
    ack = ser(40, cpu_rate) + wire + ser(40) + wire + switch
    assert int(e.op_end_ps[0]) == delivered + ack


def test_spraying_uses_every_plane_and_l2_chip():
    topo, fabric = fabric_for()
    e = one_message(topo, fabric, 0, 16, 2**20)  # 256 packets, die 0 (node 0) -> die 16 (node 1)
    up = np.asarray(e.link_bytes)[topo.ep_up[0]]
    assert np.all(up > 0) and up.max() - up.min() <= 4160  # even to within one packet
    uplinks = topo.l1_uplink[0].ravel()  # node 0's L1 -> L2 links, all planes
    assert np.all(np.asarray(e.link_bytes)[uplinks] > 0)  # all 7 x 16 paths carried data


def test_per_flow_hashing_keeps_a_message_on_one_path():
    topo, fabric = fabric_for("ub.load_balancing=hash")
    e = one_message(topo, fabric, 0, 16, 2**20)
    lb = np.asarray(e.link_bytes)
    assert np.count_nonzero(lb[topo.ep_up[0]]) == 1
    assert np.count_nonzero(lb[topo.link_kind == L_L1_UP]) == 1
    # One 28 GB/s path instead of seven: the message takes about 7 times as long.
    topo2, fabric2 = fabric_for()
    sprayed = one_message(topo2, fabric2, 0, 16, 2**20)
    assert 5 < int(e.op_end_ps[1]) / int(sprayed.op_end_ps[1]) < 8


def test_conservation_per_link():
    # Each packet crosses the 4 links of its path once: link bytes = wire bytes x 4, and the
    # binned counters add up to the totals.
    topo, fabric = fabric_for()
    size = 100_000
    e = one_message(topo, fabric, 3, 20, size, bin_ps=50_000)
    packets = math.ceil(size / 4096)
    last = size - (packets - 1) * 4096
    wire = (packets - 1) * math.ceil((4096 + 52) / 20) * 20 + math.ceil((last + 52) / 20) * 20
    assert int(np.asarray(e.link_bytes).sum()) == 4 * wire
    assert e.packets_sent == 4 * packets and e.packets_live == 0
    series = e.link_series()
    assert series["bytes"].sum() == 4 * wire
    assert series["busy_ps"].sum() == np.asarray(e.link_busy_ps).sum()
    assert np.all(series["busy_ps"] <= 50_000)


def test_slow_receiver_stalls_the_sender_through_credits():
    # A CPU that absorbs writes at 5 GB/s: its buffers fill, credits stop coming back, and the
    # die sending to it is held to the receiver's pace instead of finishing at its own rate.
    topo, fabric = fabric_for("ub.cpu_memory_write_gbyte_per_s=5")
    cpu = topo.cpu_endpoint(0)
    size = 8 * 2**20
    e = one_message(topo, fabric, 0, cpu, size, bin_ps=1_000_000)
    end = int(e.op_end_ps[1])
    assert size / (end / 1e12) == pytest.approx(5e9, rel=0.02)  # the sink's rate, end to end
    series = e.link_series()
    die_ports = np.isin(series["link"], topo.ep_up[0])
    last_busy_bin = series["bin"][die_ports].max()
    # Unthrottled, the die would have pushed 8 MiB out at ~170 GB/s within 50 us; stalled, its
    # ports are still sending at the end (after the buffers' worth that is left to drain).
    assert last_busy_bin * 1_000_000 > 0.9 * end
    assert np.all(e.credit_bytes >= 0)


def test_outstanding_limit_makes_bandwidth_window_bound():
    # With one outstanding packet, each 512 B write waits for the previous one's ack: the
    # bandwidth is one packet per round trip.
    topo, fabric = fabric_for("ub.max_outstanding_packets=1")
    lat = latency_ps(topo, fabric, 0, 2, 512, MSG_WRITE)
    bw = bandwidth_byte_per_s(topo, fabric, 0, 2, 512, MSG_WRITE)
    startup = round(topo.spec.ub.initiator_startup_ns * 1000)
    assert bw == pytest.approx(512 * 1e12 / (lat - startup), rel=0.01)


def test_read_bandwidth_to_cpu_comes_from_headers_and_flits():
    # Not calibrated: 512 B + 28 B header = 27 flits of 20 B on the CPU's 160 GB/s of ports.
    topo, fabric = fabric_for()
    bw = bandwidth_byte_per_s(topo, fabric, topo.cpu_endpoint(0), 0, 512, MSG_READ)
    assert bw == pytest.approx(160e9 * 512 / 540, rel=0.01)


def test_all_to_all_is_deterministic_and_bounded_by_die_ports():
    topo, fabric = fabric_for()
    a = all_to_all(topo, fabric, 16, 64 * 1024)
    b = all_to_all(topo, fabric, 16, 64 * 1024)
    assert a == b
    # Nobody beats its 7 x 28 GB/s of ports less header overhead (4096 B in 4160 on the wire).
    assert a["bandwidth_per_die_max_gbyte_per_s"] <= 196 * 4096 / 4160
    assert a["bandwidth_per_die_min_gbyte_per_s"] > 0.5 * 196 * 4096 / 4160


def test_buffer_smaller_than_a_packet_is_refused():
    # A buffer that cannot hold one packet would block forever; the spec refuses it up front.
    with pytest.raises(SpecError, match="vl_buffer_byte"):
        fabric_for("ub.vl_buffer_byte=1000")
