"""The message-level fabric (``--fabric message``) on mixed traffic: the invariants of the
reservations (reads, CPU sinks, D2D, RDMA, VPC, zero-byte messages, failures from the start),
native == reference, the look-ahead, the link calendar (``cal_take``) against brute force,
op_message_lists' counting sort, and the packet model's results as digests. The last three tests
hold rules once broken: a CPU's sink and a packet-level read use idle time before reservations,
and the look-ahead waits while reads are outstanding."""
import dataclasses
import hashlib
from types import SimpleNamespace

import numpy as np
import pytest

from cmemu._core import op_message_lists
from cmemu.errors import SimulationError
from cmemu.fabric import build_fabric
from cmemu.faults import parse_failures
from cmemu.lower import lowered_from_parts
from cmemu.lower.comm import MessageTable
from cmemu.run import simulate
from cmemu.spec import load_system
from cmemu.topology import build_topology
from cmemu.vocab import MSG_READ, MSG_WRITE, OP_KIND_COMP, OP_KIND_RECV, OP_KIND_SEND

ONE_PLANE = ["ub.sub_planes=1", "ub.die_ports=1", "ub.cpu_ports=1"]


def lowered(topo, items):
    """items: (src, dst, bytes, plane, "w" | "r"). A write: a COMM_SEND on src and a COMM_RECV on
    dst; a read (dst reads src's memory): a COMM_RECV on dst only. No dependencies."""
    table = MessageTable()
    kinds, rank, op_msg = [], [], []
    for i, (s, d, size, plane, kind) in enumerate(items):
        if kind == "w":
            table.add(topo, s, d, size, plane, send_op=len(kinds), recv_op=len(kinds) + 1)
            kinds += [OP_KIND_SEND, OP_KIND_RECV]
            rank += [s, d]
            op_msg += [i, i]
        else:
            table.add(topo, s, d, size, plane, send_op=-1, recv_op=len(kinds), kind=MSG_READ)
            kinds += [OP_KIND_RECV]
            rank += [d]
            op_msg += [i]
    return lowered_from_parts(kinds, [0] * len(kinds), [], [], table, op_msg=op_msg, rank=rank)


def mixed_items(topo, seed=7, count=60):
    """Random reads and writes between dies, plus CPU endpoints (a sink rate), D2D twins, RDMA,
    VPC, zero-byte and one-byte messages and sizes around the MTU."""
    rng = np.random.default_rng(seed)
    D = topo.spec.dies
    cpu0, cpu1 = topo.cpu_endpoint(0), topo.cpu_endpoint(3)
    items = []
    for k in range(count):
        s, d = (int(x) for x in rng.choice(D, 2, replace=False))
        items.append((s, d, int(rng.integers(0, 20000)), "ub", "w" if k % 3 else "r"))
    items += [(0, cpu0, 9000, "ub", "w"), (5, cpu0, 20000, "ub", "w"), (cpu1, 3, 7000, "ub", "w"),
              (cpu0, 9, 5000, "ub", "r"), (2, 3, 30000, "ub", "w"), (4, 5, 0, "ub", "w"),
              (6, 25, 40000, "rdma", "w"), (25, 6, 10000, "rdma", "r"), (7, 30, 9000, "vpc", "w"),
              (0, 2, 0, "ub", "w"), (10, 11, 5000, "ub", "r"), (12, 13, 1, "ub", "w"),
              (14, 1, 4096, "ub", "w"), (15, 1, 4097, "ub", "w")]
    return items


@pytest.fixture(scope="module")
def mini():
    return build_topology(load_system("mini", []))


@pytest.fixture(scope="module")
def one_plane():
    return build_topology(load_system("mini", ONE_PLANE))


def check_records(e, fabric):
    """Every link carries one transmission at a time (packet-level reads and message-level writes
    together); each packet leaves a link only one link latency after it has left the one before
    (store and forward, per leg); each transmission lasts its serialisation time."""
    rec = e.packet_records()
    o = np.lexsort((rec["start_ps"], rec["link"]))
    link, start, end = rec["link"][o], rec["start_ps"][o], rec["end_ps"][o]
    same = link[1:] == link[:-1]
    assert np.all(start[1:][same] >= end[:-1][same]), "two transmissions overlap on a link"
    rate = np.asarray(fabric.link_rate_byte_per_s)[rec["link"]]
    ser = -(-rec["wire_bytes"].astype(np.int64) * 10**12 // rate)
    assert np.array_equal(rec["end_ps"] - rec["start_ps"], ser)
    # A read's request and its response are two legs (two ptypes) of one (msg, seq).
    hop = np.lexsort((rec["start_ps"], rec["ptype"], rec["seq"], rec["msg"]))
    m, q, pt, st, en, lk = (rec[k][hop] for k in ("msg", "seq", "ptype", "start_ps", "end_ps", "link"))
    nxt = (m[1:] == m[:-1]) & (q[1:] == q[:-1]) & (pt[1:] == pt[:-1])
    lat = np.asarray(fabric.link_latency_ps)[lk[:-1][nxt]]
    assert np.all(st[1:][nxt] >= en[:-1][nxt] + lat), "a packet left a link before it had arrived"
    return rec


def check_series(e, bin_ps):
    """The binned counters: no bin busier than its width, one row per (link, bin), and they add
    up to the links' totals."""
    s = e.link_series()
    assert s["bin_ps"] == bin_ps
    assert np.all(s["busy_ps"] <= bin_ps)
    key = s["link"].astype(np.int64) * (1 << 32) + s["bin"]
    assert np.all(np.diff(key) > 0)
    n = len(np.asarray(e.link_busy_ps))
    assert np.array_equal(np.bincount(s["link"], weights=s["busy_ps"], minlength=n).astype(np.int64),
                          np.asarray(e.link_busy_ps))
    assert np.array_equal(np.bincount(s["link"], weights=s["bytes"], minlength=n).astype(np.int64),
                          np.asarray(e.link_bytes))
    return s


def same_runs(a, b, records=True):
    assert np.array_equal(a.op_start_ps, b.op_start_ps)
    assert np.array_equal(a.op_end_ps, b.op_end_ps)
    assert np.array_equal(np.asarray(a.msg_delivered_ps), np.asarray(b.msg_delivered_ps))
    assert np.array_equal(np.asarray(a.link_bytes), np.asarray(b.link_bytes))
    assert np.array_equal(np.asarray(a.link_busy_ps), np.asarray(b.link_busy_ps))
    assert np.array_equal(np.asarray(a.msg_packets), np.asarray(b.msg_packets))
    assert a.events == b.events and a.packets_sent == b.packets_sent
    if records:
        ra, rb = a.packet_records(), b.packet_records()
        assert all(np.array_equal(ra[k], rb[k]) for k in ra)
        sa, sb = a.link_series(), b.link_series()
        assert all(np.array_equal(sa[k], sb[k]) for k in ("link", "bin", "bytes", "busy_ps"))


# -- the packet model, unchanged ----------------------------------------------------------------

def _digest(e):
    """Results of a packet-level run: op ends, deliveries, per-link totals, binned counters and
    every transmission (in a canonical order), hashed."""
    h = hashlib.sha256()
    for a in (e.op_start_ps, e.op_end_ps, e.msg_delivered_ps, e.link_bytes, e.link_busy_ps):
        h.update(np.ascontiguousarray(np.asarray(a, dtype=np.int64)).tobytes())
    s = e.link_series()
    for k in ("link", "bin", "bytes", "busy_ps"):
        h.update(np.asarray(s[k], dtype=np.int64).tobytes())
    r = e.packet_records()
    o = np.lexsort((r["ptype"], r["seq"], r["msg"], r["link"], r["start_ps"]))
    for k in ("start_ps", "end_ps", "msg", "seq", "link", "wire_bytes", "ptype"):
        h.update(np.asarray(r[k], dtype=np.int64)[o].tobytes())
    h.update(str(e.packets_sent).encode())
    return h.hexdigest()[:16]


def _packet_digests():
    """Packet-level runs that only use what the engine had before the message-level fabric, so
    that the same function runs on the old tree."""
    mini = build_topology(load_system("mini", []))
    small = build_topology(load_system("mini", ["ub.max_outstanding_packets=8"]))
    incast = [(s, d, 60_000, "ub", "w") for s in range(32) for d in (1, 5, 17) if s != d]
    mixed = mixed_items(mini)
    fail = parse_failures(["l2:2.4", "l1:0.0", "die:9"], mini)
    cases = {
        "incast": (mini, incast, build_fabric(mini)),
        "mixed": (mini, mixed, build_fabric(mini)),
        "failed_from_start": (mini, [it for it in mixed if 9 not in it[:2]], build_fabric(mini, fail)),
        "window": (small, [(0, d, 16384, "ub", "w") for d in range(2, 18)] + [(3, 0, 9000, "ub", "r")],
                   build_fabric(small)),
        "failure_during_run": (mini, mixed,
                               build_fabric(mini, schedule=[(1_000_000, parse_failures(["l1:1.3"], mini))])),
    }
    for _, _, F in cases.values():
        F.ep_read_byte_per_s[:] = 0  # a CPU's DRAM read rate came later (EMS, issue 21): not limiting, as before
    return {name: _digest(simulate(lowered(topo, items), F, record_packets=True, bin_ps=500_000))
            for name, (topo, items, F) in cases.items()}


# Computed with _packet_digests() on commit 3dc256e (the parent of 5d34f60, the first commit of
# the message-level fabric), built in a separate clone: the packet model gives the same results
# to the picosecond, the same per-link counters and the same transmissions.
PACKET_DIGESTS_BEFORE = {
    "incast": "30436c1200cc7132",
    "mixed": "71d494f30664b4fc",
    "failed_from_start": "defff8867c42ae77",  # the lost paths' share spread evenly (choose_path)
    "window": "08b7e168f8f97d57",
    "failure_during_run": "aff9435399f0862c",
}


def test_packet_model_bit_identical_to_before():
    assert _packet_digests() == PACKET_DIGESTS_BEFORE


def test_packet_model_reference_agrees(mini):
    # Packet level, mixed traffic with a small window: the native kernel and the reference
    # agree exactly (the ring of open bins against the reference's single open bin included).
    small = build_topology(load_system("mini", ["ub.max_outstanding_packets=8"]))
    L = lowered(small, mixed_items(small, seed=11, count=40)
                + [(0, d, 16384, "ub", "w") for d in range(2, 10)])
    F = build_fabric(small)
    e = simulate(L, F, record_packets=True, bin_ps=3_000)
    same_runs(e, simulate(L, F, native=False, record_packets=True, bin_ps=3_000))
    check_records(e, F)
    check_series(e, 3_000)


# -- the message-level fabric: invariants -------------------------------------------------------

@pytest.mark.parametrize("bin_ps", [3_000, 1_000_000])
def test_mixed_traffic_invariants(mini, bin_ps):
    # Reads (packets) and writes (reserved) share links; CPU sinks, D2D, RDMA and VPC paths,
    # zero-byte messages. 3 ns bins: a 4 KB packet spans ~50 bins, more than the 16 a link keeps
    # open, and the look-ahead reserves up to 1 us ahead: out-of-order counting.
    items = mixed_items(mini)
    L = lowered(mini, items)
    F = build_fabric(mini, model="message")
    e = simulate(L, F, record_packets=True, bin_ps=bin_ps)
    rec = check_records(e, F)
    check_series(e, bin_ps)
    same_runs(e, simulate(L, F, native=False, record_packets=True, bin_ps=bin_ps))
    p = simulate(L, build_fabric(mini))
    # Same paths (sprayed alike), so the same bytes and busy time on every link.
    assert np.array_equal(np.asarray(e.link_bytes), np.asarray(p.link_bytes))
    assert np.array_equal(np.asarray(e.link_busy_ps), np.asarray(p.link_busy_ps))
    assert e.packets_sent == p.packets_sent == rec["link"].size
    assert np.array_equal(np.asarray(e.msg_packets), np.asarray(p.msg_packets))
    assert np.all(np.asarray(e.msg_delivered_ps) >= 0) and np.all(e.op_end_ps >= 0)
    assert e.events < p.events
    # Writes are reserved as writes, reads stay request and response packets.
    kinds = np.asarray(L.msg_kind)[rec["msg"]]
    assert np.all((kinds == MSG_WRITE) == (rec["ptype"] == 0))


def test_failures_from_the_start_routed_around(mini):
    # L1 and L2 chips and a die down from the start: writes and reads go around them on the
    # message-level fabric as on the packet one (the same paths), nothing crosses a dead link.
    fail = parse_failures(["l2:2.4", "l1:0.0", "l2:5.1", "die:9"], mini)
    items = [it for it in mixed_items(mini, seed=3, count=80) if 9 not in it[:2]]
    L = lowered(mini, items)
    F = build_fabric(mini, fail, model="message")
    e = simulate(L, F, record_packets=True, bin_ps=100_000)
    assert np.asarray(e.link_bytes)[sorted(fail.links)].sum() == 0
    check_records(e, F)
    same_runs(e, simulate(L, F, native=False, record_packets=True, bin_ps=100_000))
    p = simulate(L, build_fabric(mini, fail))
    assert np.array_equal(np.asarray(e.link_bytes), np.asarray(p.link_bytes))
    # A write to its NPU's twin over a dead D2D link goes over UB instead, on both models alike;
    # with the die's UB ports down too it has no way left.
    d2d = parse_failures([f"link:{int(F.d2d[0])}"], mini)
    one = lowered(mini, [(0, 1, 4096, "ub", "w")])
    ends = [int(simulate(one, build_fabric(mini, d2d, model=model)).op_end_ps.max()) for model in ("message", "packet")]
    assert ends[0] == ends[1]
    cut = parse_failures([f"link:{int(F.d2d[0])}"] + [f"link:{int(k)}" for k in np.asarray(F.ep_up)[:mini.spec.ub.sub_planes]],
                         mini)
    for model in ("message", "packet"):
        with pytest.raises(SimulationError, match="no path left"):
            simulate(one, build_fabric(mini, cut, model=model))


def test_zero_and_one_byte_writes_match_packets(one_plane):
    # A zero-byte write is one header-only packet, on either fabric; alone, to the picosecond.
    for size in (0, 1):
        for dst in (1, 2, 20, one_plane.cpu_endpoint(0), one_plane.cpu_endpoint(5)):
            L = lowered(one_plane, [(0, dst, size, "ub", "w")])
            p = simulate(L, build_fabric(one_plane))
            m = simulate(L, build_fabric(one_plane, model="message"), record_packets=True)
            assert np.array_equal(p.op_end_ps, m.op_end_ps)
            assert int(np.asarray(m.msg_packets)[0]) == 1
            wire = one_plane.spec.ub.flit_wire_byte(size + one_plane.spec.ub.header_write_byte)
            assert np.all(m.packet_records()["wire_bytes"] == wire)


def test_lookahead_does_not_change_one_initiator(mini):
    # One initiator with a window of 8 packets: taking a slot whose ack is due within 1 us, and
    # leaving no earlier than that ack, gives the same times as waking up at each ack (a 1 ps
    # look-ahead), with fewer events.
    small = build_topology(load_system("mini", ["ub.max_outstanding_packets=8"]))
    items = ([(0, d, 16384, "ub", "w") for d in range(2, 30)]
             + [(0, small.cpu_endpoint(1), 9000, "ub", "w"), (0, 1, 20000, "ub", "w"), (0, 7, 0, "ub", "w")])
    L = lowered(small, items)
    F = build_fabric(small, model="message")
    wide = simulate(L, F)
    narrow = simulate(L, dataclasses.replace(F, message_lookahead_ps=1))
    assert np.array_equal(wide.op_end_ps, narrow.op_end_ps)
    assert np.array_equal(np.asarray(wide.msg_delivered_ps), np.asarray(narrow.msg_delivered_ps))
    assert wide.events < narrow.events
    same_runs(wide, simulate(L, F, native=False), records=False)


def test_window_with_reads_in_the_queue(mini):
    # A window of 4: an initiator's queue mixes writes (look-ahead) and reads (which wait for a
    # slot without look-ahead); everything completes, the native kernel and the reference agree.
    small = build_topology(load_system("mini", ["ub.max_outstanding_packets=4"]))
    items = []
    for k, d in enumerate(range(2, 20)):
        items.append((0, d, 9000, "ub", "w") if k % 3 else (d, 0, 6000, "ub", "r"))
    items += [(20, 0, 30000, "ub", "w"), (0, 1, 12000, "ub", "w")]
    against_packets(small, items, 50_000)


def against_packets(topo, items, bin_ps):
    """Both fabrics on the same traffic: the message-level run's records and series are sound,
    native == reference, and each link carries the bytes it carries on the packet fabric.
    Returns (message-level engine, packet engine)."""
    L = lowered(topo, items)
    F = build_fabric(topo, model="message")
    e = simulate(L, F, record_packets=True, bin_ps=bin_ps)
    check_records(e, F)
    check_series(e, bin_ps)
    same_runs(e, simulate(L, F, native=False, record_packets=True, bin_ps=bin_ps))
    p = simulate(L, build_fabric(topo))
    assert np.array_equal(np.asarray(e.link_bytes), np.asarray(p.link_bytes))
    return e, p


def test_cloudmatrix384_incast():
    # The full preset: writes from every 37th die to three dies (one on another node) and to a
    # CPU; native == reference, no overlaps, the same bytes per link as the packet model.
    topo = build_topology(load_system("cloudmatrix384", []))
    cpu = topo.cpu_endpoint(0)
    items = [(s, d, 20000, "ub", "w") for s in range(0, 768, 37) for d in (1, 100, 700) if s != d]
    items += [(5, cpu, 20000, "ub", "w"), (700, cpu, 20000, "ub", "w"), (100, 3, 8000, "ub", "r"),
              (10, 11, 5000, "ub", "w"), (20, 500, 9000, "rdma", "w")]
    e, p = against_packets(topo, items, 200_000)
    # The writes' ops end within 3% of the packet fabric's.
    ops = np.arange(2 * items.index((100, 3, 8000, "ub", "r")))  # the writes before the read
    assert abs(e.op_end_ps[ops].max() / p.op_end_ps[ops].max() - 1) < 0.03


# -- the link calendar, against brute force -----------------------------------------------------

def _first_fit(busy, t, need):
    """The earliest s >= t with [s, s + need) clear of every (start, end) in busy."""
    for s in sorted({t} | {e for _, e in busy if e >= t}):
        if all(s + need <= a or s >= b for a, b in busy):
            return s
    raise AssertionError


def test_cal_take_first_fit():
    # The reference's cal_take (which the native kernel is checked against, run by run): random
    # calendars with gaps that fit exactly, intervals touching on either side, the prune of
    # intervals that ended by now. Each take is the first fit; the calendar stays sorted,
    # disjoint and merged (no two intervals touch), and covers what was taken.
    from cmemu._core.reference import Engine as Reference

    topo = build_topology(load_system("mini", ONE_PLANE))
    eng = Reference(lowered(topo, [(0, 2, 64, "ub", "w")]), build_fabric(topo, model="message"))
    rng = np.random.default_rng(5)
    link = 3
    for trial in range(300):
        eng.cal[link] = []
        eng.cal_lo[link] = 0
        eng.now = 0
        taken = []
        for _ in range(int(rng.integers(1, 40))):
            eng.now += int(rng.integers(0, 30))
            t = eng.now + int(rng.integers(0, 60))
            need = int(rng.choice([1, 2, 3, 5, 8, 13]))
            live = [(a, b) for a, b in taken if b > eng.now]
            want = _first_fit(live, t, need)
            got = eng.cal_take(link, t, need, 1) - need
            assert got == want, (trial, live, t, need)
            taken.append((got, got + need))
            c = eng.cal[link][2 * eng.cal_lo[link]:]
            starts, ends = np.asarray(c[0::2]), np.asarray(c[1::2])
            assert np.all(ends > starts) and np.all(starts[1:] > ends[:-1])  # disjoint, never touching
            # The calendar lies within what was taken, and holds all of it from now on.
            cover = np.zeros(4000, dtype=bool)
            for a, b in zip(starts, ends):
                cover[a:b] = True
            union = np.zeros(4000, dtype=bool)
            for a, b in taken:
                union[a:b] = True
            assert not np.any(cover & ~union)
            assert np.all(cover[eng.now:] == union[eng.now:])


# -- op_message_lists' counting sort -------------------------------------------------------------

def _op_message_lists_simple(kind, send_op, recv_op):
    lists = [[] for _ in kind]
    for part, want in ((send_op, OP_KIND_SEND), (recv_op, OP_KIND_RECV)):
        for m, op in enumerate(part):
            if op >= 0 and kind[op] == want:
                lists[op].append(m)
    ptr = np.zeros(len(kind) + 1, dtype=np.int64)
    ptr[1:] = np.cumsum([len(x) for x in lists])
    return ptr, np.asarray([m for x in lists for m in x], dtype=np.int32)


@pytest.mark.parametrize("seed", range(6))
def test_op_message_lists_counting_sort(seed):
    # Unsorted send and receive parts, messages whose op is -1 or of the other kind (a read's
    # holder), ops without messages: each op's messages, in id order.
    rng = np.random.default_rng(seed)
    n_ops, n_msgs = int(rng.integers(1, 40)), int(rng.integers(0, 200))
    kind = rng.choice([OP_KIND_COMP, OP_KIND_SEND, OP_KIND_RECV], n_ops).astype(np.uint8)
    send = rng.integers(-1, n_ops, n_msgs).astype(np.int32)
    recv = rng.integers(-1, n_ops, n_msgs).astype(np.int32)
    if seed % 2:
        send.sort()  # the lowering's send part comes sorted
        send[send >= 0] = np.where(kind[send[send >= 0]] == OP_KIND_SEND, send[send >= 0], -1)
    L = SimpleNamespace(op_kind=kind, msg_send_op=send, msg_recv_op=recv, op_msg=np.full(n_ops, -1),
                        message_segments=lambda: None)  # its columns whole (Lowered.message_segments)
    ptr, idx = op_message_lists(L)
    want_ptr, want_idx = _op_message_lists_simple(kind, send, recv)
    assert np.array_equal(ptr, want_ptr)
    assert np.array_equal(idx, want_idx) and idx.dtype == np.int32


# -- rules once broken ------------------------------------------------------------------------------

def test_cpu_sink_uses_idle_time(one_plane):
    # As test_message_fabric.test_idle_time_is_used, but into a CPU (a sink rate): die 20 (other
    # node) writes first, die 0 (same node) right after; the local write gets there first.
    cpu = one_plane.cpu_endpoint(0)
    F = build_fabric(one_plane, model="message")
    both = simulate(lowered(one_plane, [(20, cpu, 512, "ub", "w"), (0, cpu, 512, "ub", "w")]), F)
    alone = simulate(lowered(one_plane, [(0, cpu, 512, "ub", "w")]), F)
    packet = simulate(lowered(one_plane, [(20, cpu, 512, "ub", "w"), (0, cpu, 512, "ub", "w")]),
                      build_fabric(one_plane))
    assert packet.op_end_ps[3] == alone.op_end_ps[1]  # (holds: the packet fabric)
    assert both.op_end_ps[3] == alone.op_end_ps[1]


def test_read_uses_idle_time_before_reservations(one_plane):
    items = [(20, 2, 60_000, "ub", "w"), (4, 2, 512, "ub", "r")]
    L = lowered(one_plane, items)
    packet = simulate(L, build_fabric(one_plane))
    alone = simulate(lowered(one_plane, items[1:]), build_fabric(one_plane, model="message"))
    assert packet.op_end_ps[2] == alone.op_end_ps[0]  # (holds: the packet fabric)
    F = build_fabric(one_plane, model="message")
    message = simulate(L, F, record_packets=True)
    check_records(message, F)  # (holds: no overlap, only a needless wait)
    assert message.op_end_ps[2] == alone.op_end_ps[0]


def test_lookahead_with_reads_outstanding():
    small = build_topology(load_system("mini", ["ub.max_outstanding_packets=4"]))
    items = [(0, d, 9000, "ub", "w") if k % 3 else (d, 0, 6000, "ub", "r") for k, d in enumerate(range(2, 20))]
    L = lowered(small, items + [(0, 1, 12000, "ub", "w")])
    F = build_fabric(small, model="message")
    narrow = simulate(L, dataclasses.replace(F, message_lookahead_ps=1))
    assert np.array_equal(narrow.op_end_ps, simulate(L, build_fabric(small)).op_end_ps)  # (holds)
    assert np.array_equal(simulate(L, F).op_end_ps, narrow.op_end_ps)
