"""Pure-Python reference of the event kernel in ``engine.pyx``: the same model, handler for
handler, with one plain ``heapq`` heap. Slow (20x or more below the Cython kernel); it exists so
that tests can check the native kernel gives identical results, event for event. Keep the two in
step: a change to a handler there is a change here.
"""
from __future__ import annotations

import bisect
import heapq

import numpy as np

from cmemu.errors import DieFailedError, UnroutableError
from cmemu._core import hbm_sharing, merge_link_series, op_message_lists

from cmemu.fabric import AIV_MESSAGES_IN_FLIGHT as AIV_RING, NUM_VLS, path_hashes
from cmemu.lower.comm import FLOW_AFTER_MASK, FLOW_BASE
from cmemu.vocab import (
    LB_SPRAY,
    MSG_ATOMIC,
    MSG_READ,
    MSG_WRITE,
    OP_KIND_COMP,
    OP_KIND_MEM,
    OP_KIND_SEND,
    PATH_D2D,
    PATH_RDMA,
    PATH_UB,
    PATH_VPC,
    PKT_ACK,
    PKT_READ_REQ,
    PKT_READ_RESP,
    PKT_WRITE,
)

(EV_OP_READY, EV_OP_DONE, EV_LINK_FREE, EV_PKT_ARRIVE, EV_SINK_DONE, EV_RESP_INJECT, EV_WAKE, EV_FAIL,
 EV_RETRANSMIT, EV_HBM_DONE) = range(10)
PS_PER_S = 10**12
HBM_SCALE = 1024  # units of a die's HBM share clock: 1/HBM_SCALE ps of capacity-time (engine.pyx)


def serialisation_time_ps(nbytes: int, rate_byte_per_s: int) -> int:
    """Time to put nbytes on a link of the given rate, rounded up to a whole picosecond."""
    return -(-int(nbytes) * PS_PER_S // int(rate_byte_per_s))


# Engine's HELD_PORTS: ports an endpoint's writes may be held at by the horizon at once.
HELD_PORTS = 16


# The event wheel's bucket, 2**14 ps (the engine's BUCKET_BITS): the tails of AIV writes across
# nodes on the message-bp fabric are due at its boundaries (Engine.tail_due).
TAIL_BUCKET_BITS = 14


class _Packet:
    __slots__ = ("ready", "msg", "payload", "wire", "link", "in_link", "hop", "seq", "leg", "ptype", "vl", "plane", "uplink",
                 "iseq", "held")


class Engine:
    def __init__(self, lowered, fabric, bin_ps=0, record_packets=False, record_deliveries=-1):
        L, F = lowered, fabric
        L.fill_messages()  # it reads every message's row
        self.n_ops = int(L.op_kind.shape[0])
        self.op_kind = L.op_kind.tolist()
        self.op_dur_ps = L.op_dur_ps.tolist()
        self.op_lat_ps = L.op_lat_ps.tolist()
        self.op_res = L.op_res.tolist()
        self.op_msg = L.op_msg.tolist()
        ptr, idx = op_message_lists(L)
        self.op_msgs = [idx[ptr[i]:ptr[i + 1]].tolist() for i in range(self.n_ops)]
        self.op_left = [0] * self.n_ops
        self.op_tmax = [0] * self.n_ops
        self.succ_ptr = L.succ_ptr.tolist()
        self.succ_idx = L.succ_idx.tolist()
        self.pending_deps = L.op_npred.tolist()
        self.record_packets = record_packets
        self.recs = []
        cap, rate = hbm_sharing(L)
        self.hbm_cap = cap.tolist()
        self.op_rate = rate.tolist()
        n_dies = len(self.hbm_cap)
        self.hbm_sum = [0] * n_dies
        self.hbm_share = [(0, 0)] * n_dies  # (bytes/s shared, by how many ops); 0 ops: all fit
        self.hbm_last = [(0, 0)] * n_dies  # the share of the die's last record
        self.hbm_k = [0] * n_dies  # the share clock, 1/HBM_SCALE ps of capacity-time
        self.hbm_t = [0] * n_dies
        self.hbm_running = [[] for _ in range(n_dies)]  # by (demand, op)
        self.hbm_next_op = [-1] * n_dies
        self.op_at = [0] * self.n_ops  # uncapped: its end at full speed; capped: its target on the share clock
        self.op_hend = [-1] * self.n_ops
        self.hrec = []
        self.op_start = [-1] * self.n_ops
        self.op_end = [-1] * self.n_ops
        self.res_free = [0] * max(int(L.n_resources), 1)
        self.op_aic = L.op_aic.tolist()
        self.op_aiv = L.op_aiv.tolist()
        self.op_die = L.op_rank.tolist()
        self.free_aic = L.die_aic_cores.tolist()
        self.free_aiv = L.die_aiv_cores.tolist()
        self.core_wait = [[] for _ in range(len(self.free_aic))]  # FIFO of waiting ops per die

        n_msgs = int(L.msg_src.shape[0])
        self.msg_src = L.msg_src.tolist()
        self.msg_dst = L.msg_dst.tolist()
        self.msg_bytes = L.msg_bytes.tolist()
        self.msg_kind = L.msg_kind.tolist()
        self.msg_path = L.msg_path.tolist()
        self.msg_hash = path_hashes(L.msg_src, L.msg_dst).tolist()
        self.msg_send_op = L.msg_send_op.tolist()
        self.msg_recv_op = L.msg_recv_op.tolist()
        self.msg_ini = L.msg_ini.tolist()
        self.msg_prep = L.msg_prep.tolist()
        self.msg_flow = L.msg_flow.tolist()
        self.msg_seq = [0] * n_msgs
        npkts = np.maximum(1, -(-L.msg_bytes // F.path_mtu_byte[L.msg_path])).astype(np.int32)
        self.msg_npkts = npkts.tolist()
        self.msg_left = npkts.tolist()
        self.msg_qnext = [-1] * n_msgs
        self.recv_waiting = [False] * n_msgs
        self.msg_delivered = [-1] * n_msgs
        self.n_record = n_msgs if record_deliveries < 0 else min(record_deliveries, n_msgs)
        self.messages_delivered = 0

        n_eps = int(F.ep_node.shape[0])
        n_ini = int(F.ep_startup_ps.shape[0])
        self.n_eps = n_eps
        self.ep_startup = F.ep_startup_ps.tolist()
        self.ep_write_lat = F.ep_write_latency_ps.tolist()
        self.ep_read_lat = F.ep_read_latency_ps.tolist()
        self.ep_sink_rate = F.ep_sink_byte_per_s.tolist()
        self.ep_read_rate = F.ep_read_byte_per_s.tolist()
        self.ep_max_out = F.ep_max_outstanding.tolist()
        self.ep_issue = F.ep_issue_ps.tolist()
        self.ep_node = F.ep_node.tolist()
        self.ep_qhead = [-1] * n_ini
        self.held_ports = [[] for _ in range(n_ini)]  # Engine.hold_at, release_held
        self.held_count = [0] * n_ini
        self.ep_qtail = [-1] * n_ini
        self.ep_outstanding = [0] * n_ini
        self.ep_issue_free = [0] * n_ini
        self.ep_sink_free = [0] * n_eps
        self.ep_read_free = [0] * n_eps
        self.ack_heap = [[] for _ in range(n_ini)]
        self.ep_wake_pending = [False] * n_ini
        self.ep_wake_at = [0] * n_ini
        # AIV initiators (the engine's aiv_ready / aiv_done): messages issued, the last base,
        # the message waited for, and per message number its completion so far and packets left.
        self.ini_msg_startup = F.ini_msg_startup_ps.tolist()
        self.ini_tracked = F.ini_tracked.tolist()
        self.ini_seq = [0] * n_ini
        self.ini_base = [0] * n_ini
        self.ini_wait = [-1] * n_ini
        self.ring_t = [[0] * AIV_RING for _ in range(n_ini - n_eps)]
        self.ring_left = [[0] * AIV_RING for _ in range(n_ini - n_eps)]

        self.path_mtu = F.path_mtu_byte.tolist()
        self.path_flit = F.path_flit_byte.tolist()
        self.path_header = F.path_header_byte.tolist()

        n_links = int(F.link_rate_byte_per_s.shape[0])
        self.link_rate = F.link_rate_byte_per_s.tolist()
        self.link_lat = F.link_latency_ps.tolist()
        self.link_in_slot = F.link_in_slot.tolist()
        self.link_alive = F.link_alive.tolist()
        self.links_down = 0 in self.link_alive
        self.fail_time = F.fail_time_ps.tolist()
        self.fail_ptr = F.fail_ptr.tolist()
        self.fail_links = F.fail_links.tolist()
        self.fail_die = F.fail_die.tolist()
        self.die_failed = [False] * int(F.d2d.shape[0])
        self.rto_ps = int(F.retransmit_timeout_ps)
        self.packets_lost = 0
        self.voq_base = F.link_voq_base.tolist()
        self.voq_slots = F.link_voq_slots.tolist()
        self.credits = np.repeat(F.link_credit_byte, NUM_VLS).tolist()
        self.busy_until = [0] * n_links
        self.free_at = [-1] * n_links
        self.link_own_queue = F.link_own_queue.tolist()
        self.sink_ep = F.direct_sinks().tolist()  # a write's arrival worked out when it starts
        self.queued = [0] * n_links
        self.rr = [0] * n_links
        self.voq_head = [-1] * F.num_voqs
        self.voq_tail = [-1] * F.num_voqs
        self.pkt_next = {}
        self.lbytes = [0] * n_links
        self.lbusy = [0] * n_links

        self.t_ep_up = F.ep_up.tolist()
        self.t_ep_down = F.ep_down.tolist()
        self.t_l1_uplink = F.l1_uplink.tolist()
        self.t_l1_uplink_chip = F.l1_uplink_chip.tolist()
        self.t_l2_down = F.l2_down.tolist()
        self.t_l2_down_count = F.l2_down_count.tolist()
        self.t_d2d = F.d2d.tolist()
        self.t_rdma_up = F.rdma_up.tolist()
        self.t_rdma_down = F.rdma_down.tolist()
        self.t_vpc_host_up = F.vpc_host_up.tolist()
        self.t_vpc_host_down = F.vpc_host_down.tolist()
        self.t_vpc_dpu_up = F.vpc_dpu_up.tolist()
        self.t_vpc_dpu_down = F.vpc_dpu_down.tolist()
        self.P, self.U, self.C, self.M, self.N = F.planes, F.uplinks, F.l2_chips, F.l2_mult, F.num_nodes
        self.lb = F.load_balancing

        self.lookahead = int(getattr(F, "message_lookahead_ps", 0))
        self.aiv_lookahead = int(getattr(F, "aiv_lookahead_ps", self.lookahead))
        # Flat (start, end) pairs, sorted and disjoint: links', then the endpoints' sinks'.
        self.cal = [[] for _ in range(n_links + n_eps)]
        self.cal_lo = [0] * (n_links + n_eps)
        if self.lookahead > 0 and self.fail_time:
            raise ValueError("the message-level fabric does not model failures during a run")
        # Back-pressure ("message-bp"): per link, its receive buffer's credits (None: not
        # flow-controlled) and the bytes it holds over time, as (time, bytes from then on) pairs.
        bp = self.lookahead > 0 and getattr(F, "message_backpressure", False)
        self.buf_limit = [c if bp and c < 1 << 50 else None for c in F.link_credit_byte.tolist()]
        self.buf = [[] for _ in range(n_links)]
        self.split_tails = bp  # an AIV's writes across nodes: first link now, the rest later (Engine.aiv_write)
        self.tails = []  # heap of (due, seq, packets of one message)
        self.tail_seq = 0
        self.tail_msg = {}  # message -> its packets whose first link is reserved, their tails not queued yet (queue_tails)
        self.bin_ps = int(bin_ps)
        self.cur_bin = [-1] * n_links
        self.cur_bytes = [0] * n_links
        self.cur_busy = [0] * n_links
        self.series = []

        self.pkts: list[_Packet] = []
        self.pkt_free: list[int] = []
        self.packets_sent = 0
        self.packets_live = 0

        self.heap: list[tuple[int, int, int, int]] = []
        self.seq = 0
        self.now = 0
        self.events = 0
        self.ops_done = 0
        self.max_pending = 0
        self.past_event = False
        for i, t in enumerate(self.fail_time):
            self.push(t, EV_FAIL, i)
        for i in range(self.n_ops):
            if self.pending_deps[i] == 0:
                self.push(0, EV_OP_READY, i)

    # -- the event queue -------------------------------------------------------------------
    def push(self, time, kind, a):
        if time < self.now:
            self.past_event = True
        heapq.heappush(self.heap, (time, self.seq, kind, a))
        self.seq += 1
        if len(self.heap) > self.max_pending:
            self.max_pending = len(self.heap)

    # -- packets ---------------------------------------------------------------------------
    def packet_new(self):
        # Reuse slots in the same order as the native pool (a LIFO free list).
        if self.pkt_free:
            p = self.pkt_free.pop()
        else:
            p = len(self.pkts)
            self.pkts.append(_Packet())
        self.packets_live += 1
        return p

    def packet_release(self, p):
        self.pkt_free.append(p)
        self.packets_live -= 1

    def wire_bytes(self, path, ptype, payload):
        flit = self.path_flit[path]
        raw = payload + self.path_header[path * 4 + ptype]
        return -(-raw // flit) * flit

    def route(self, path, s, d, plane, uplink) -> list:
        """Engine.route: the links of a message's path, hop by hop (for tests)."""
        out, hop = [], 0
        link = self.route_link(path, s, d, plane, uplink, 0)
        while link >= 0:
            out.append(link)
            hop += 1
            link = self.route_link(path, s, d, plane, uplink, hop)
        return out

    def route_link(self, path, s, d, plane, uplink, hop):
        if path == PATH_D2D:
            if self.link_alive[self.t_d2d[s]]:
                return self.t_d2d[s] if hop == 0 else -1
            path = PATH_UB
        if path == PATH_RDMA:
            if hop == 0:
                return self.t_rdma_up[s]
            return self.t_rdma_down[d] if hop == 1 else -1
        ns, nd = self.ep_node[s], self.ep_node[d]
        if path == PATH_VPC:
            if hop == 0:
                return self.t_vpc_host_up[s]
            if ns == nd:
                return self.t_vpc_host_down[d] if hop == 1 else -1
            if hop == 1:
                return self.t_vpc_dpu_up[ns]
            if hop == 2:
                return self.t_vpc_dpu_down[nd]
            return self.t_vpc_host_down[d] if hop == 3 else -1
        if hop == 0:
            return self.t_ep_up[s * self.P + plane]
        if ns == nd:
            return self.t_ep_down[d * self.P + plane] if hop == 1 else -1
        if hop == 1:
            return self.t_l1_uplink[(ns * self.P + plane) * self.U + uplink]
        if hop == 2:
            chip = self.t_l1_uplink_chip[(ns * self.P + plane) * self.U + uplink]
            count = self.t_l2_down_count[(plane * self.C + chip) * self.N + nd]
            return self.t_l2_down[((plane * self.C + chip) * self.N + nd) * self.M + (uplink // self.C) % count]
        return self.t_ep_down[d * self.P + plane] if hop == 3 else -1

    def choose_path(self, m, seq, p):
        """Engine.choose_path: with links down, over the message's live paths alone."""
        pu = self.P * self.U
        h = self.msg_hash[m]
        k = (h + seq) % pu if self.lb == LB_SPRAY else h % pu
        if not self.links_down:
            return k
        path = self.msg_path[m]
        one = path in (PATH_RDMA, PATH_VPC)
        live = [i for i in range(pu) if (i == 0 or not one) and self.path_alive(m, i % self.P, i // self.P)]
        if one and live:
            live = list(range(pu))
        if len(live) == pu:
            return k
        if not live:
            if p >= 0:
                self.packet_release(p)
            raise UnroutableError(m)
        return live[(h + seq) % len(live) if self.lb == LB_SPRAY else h % len(live)]

    def lose(self, p):
        self.packets_lost += 1
        self.push(self.now + self.rto_ps, EV_RETRANSMIT, p)

    def on_fail(self, k):
        lo, hi = self.fail_ptr[k], self.fail_ptr[k + 1]
        for i in range(lo, hi):
            self.link_alive[self.fail_links[i]] = 0
            self.links_down = True
        if self.fail_die[k] >= 0:
            self.die_failed[self.fail_die[k]] = True
        self.revert_in_flight()
        for i in range(lo, hi):
            link = self.fail_links[i]
            base = self.voq_base[link]
            for q in range(base, base + self.voq_slots[link] * NUM_VLS):
                while self.voq_head[q] >= 0:
                    p = self.voq_head[q]
                    self.voq_head[q] = self.pkt_next[p]
                    pk = self.pkts[p]
                    if pk.in_link >= 0:
                        self.credits[pk.in_link * NUM_VLS + pk.vl] += pk.wire
                        self.try_transmit(pk.in_link)
                    self.lose(p)
                self.voq_tail[q] = -1
            self.queued[link] = 0

    def revert_in_flight(self):
        for n in range(len(self.queued)):
            if self.queued[n] == 0:
                continue
            base = self.voq_base[n]
            for q in range(base, base + self.voq_slots[n] * NUM_VLS):
                p, prev = self.voq_head[q], -1
                while p >= 0:
                    nx = self.pkt_next[p]
                    pk = self.pkts[p]
                    came = pk.in_link
                    if came >= 0 and pk.ready >= self.now and (not self.link_alive[came] or not self.link_alive[n]):
                        if prev < 0:
                            self.voq_head[q] = nx
                        else:
                            self.pkt_next[prev] = nx
                        if self.voq_tail[q] == p:
                            self.voq_tail[q] = prev
                        self.queued[n] -= 1
                        pk.hop -= 1
                        pk.link = came
                        self.push(pk.ready, EV_PKT_ARRIVE, p)
                    else:
                        prev = p
                    p = nx

    def on_retransmit(self, p):
        pk = self.pkts[p]
        m = pk.msg
        idx = self.choose_path(m, pk.seq, -1)
        pk.plane = idx % self.P
        pk.uplink = idx // self.P
        pk.hop = 0
        pk.in_link = -1
        pk.ready = self.now
        s, d = self.leg_ends(p)
        first = self.route_link(self.msg_path[m], s, d, pk.plane, pk.uplink, 0)
        self.voq_append(first, 0, p)
        self.try_transmit(first)

    def path_alive(self, m, plane, uplink):
        path = self.msg_path[m]
        for leg in range(2 if self.msg_kind[m] != MSG_WRITE else 1):
            if leg == 0 and self.msg_kind[m] != MSG_WRITE:
                s, d = self.msg_dst[m], self.msg_src[m]
            else:
                s, d = self.msg_src[m], self.msg_dst[m]
            hop = 0
            while True:
                link = self.route_link(path, s, d, plane, uplink, hop)
                if link < 0:
                    break
                if not self.link_alive[link]:
                    return False
                hop += 1
        return True

    def leg_ends(self, p):
        pk = self.pkts[p]
        m = pk.msg
        if self.msg_kind[m] != MSG_WRITE and pk.leg == 0:
            return self.msg_dst[m], self.msg_src[m]
        return self.msg_src[m], self.msg_dst[m]

    def voq_append(self, link, slot, p):
        pk = self.pkts[p]
        q = self.voq_base[link] + slot * NUM_VLS + pk.vl
        self.pkt_next[p] = -1
        pk.link = link
        if self.voq_tail[q] < 0:
            self.voq_head[q] = p
        else:
            self.pkt_next[self.voq_tail[q]] = p
        self.voq_tail[q] = p
        self.queued[link] += 1

    # -- counters --------------------------------------------------------------------------
    def series_flush(self, link):
        if self.cur_bin[link] >= 0:
            self.series.append((link, self.cur_bin[link], self.cur_bytes[link], self.cur_busy[link]))

    def count_transmission(self, link, start, ser, nbytes):
        self.lbytes[link] += nbytes
        self.lbusy[link] += ser
        if self.bin_ps <= 0:
            return
        t, end = start, start + ser
        while True:
            b = t // self.bin_ps
            seg_end = min((b + 1) * self.bin_ps, end)
            if self.cur_bin[link] != b:
                self.series_flush(link)
                self.cur_bin[link] = b
                self.cur_bytes[link] = 0
                self.cur_busy[link] = 0
            self.cur_bytes[link] += nbytes
            self.cur_busy[link] += seg_end - t
            nbytes = 0
            t = seg_end
            if t >= end:
                break

    def hbm_clock(self):
        out = np.asarray(self.hrec, dtype=np.int64).reshape(-1, 4)
        return {"die": out[:, 0].astype(np.int32), "t_ps": out[:, 1].copy(), "shared_byte_per_s": out[:, 2].copy(),
                "sharers": out[:, 3].copy(), "capacity": np.asarray(self.hbm_cap, dtype=np.int64)}

    def packet_records(self):
        cols = list(zip(*self.recs)) if self.recs else [()] * 7
        types = (np.int64, np.int64, np.int32, np.int32, np.int32, np.int32, np.uint8)
        names = ("start_ps", "end_ps", "msg", "seq", "link", "wire_bytes", "ptype")
        return {n: np.asarray(c, dtype=t) for n, c, t in zip(names, cols, types)}

    @property
    def series_rows(self):
        """Rows of the binned link counters closed so far (as the native engine's)."""
        return len(self.series)

    def link_series(self):
        for link in range(len(self.cur_bin)):
            self.series_flush(link)
            self.cur_bin[link] = -1
        return merge_link_series(self.bin_ps, np.asarray(self.series, dtype=np.int64).reshape(-1, 4))

    # -- link arbitration ------------------------------------------------------------------
    def port_start(self, p, link):
        pk = self.pkts[p]
        return self.cal_find(link, max(pk.ready, self.now), serialisation_time_ps(pk.wire, self.link_rate[link]))

    def held_writes(self, link, wake):
        """Engine.held_writes: the writes held at their port by the horizon."""
        q = self.voq_base[link]
        while True:
            p = self.voq_head[q]
            if p < 0 or self.pkts[p].ptype != PKT_WRITE:
                return -1
            start = self.port_start(p, link)
            if start > self.now + self.lookahead:
                if wake >= 0:
                    self.wake_link(link, start - wake)
                return start
            self.voq_head[q] = self.pkt_next[p]
            if self.voq_head[q] < 0:
                self.voq_tail[q] = -1
            self.queued[link] -= 1
            self.held_count[self.msg_ini[self.pkts[p].msg]] -= 1
            self.path_reserve(p, link, max(self.pkts[p].ready, self.now))

    def try_transmit(self, link):
        if self.queued[link] == 0 or not self.link_alive[link]:
            return
        if self.lookahead == 0 and self.busy_until[link] > self.now:
            self.wake_link(link, self.busy_until[link])
            return
        if self.lookahead > 0:
            self.held_writes(link, self.lookahead)
            if self.queued[link] == 0:
                return
        base = self.voq_base[link]
        n = self.voq_slots[link] * NUM_VLS
        p = -1
        wake = -1
        for k in range(n):
            pos = (self.rr[link] + k) % n
            q = base + pos
            head = self.voq_head[q]
            if head < 0:
                continue
            if self.lookahead > 0 and self.pkts[head].ptype == PKT_WRITE:
                pass  # held by the horizon
            elif self.pkts[head].ready > self.now:
                wake = self.pkts[head].ready if wake < 0 else min(wake, self.pkts[head].ready)
            elif self.credits[link * NUM_VLS + self.pkts[head].vl] >= self.pkts[head].wire:
                p = head
                break
        if p < 0:
            if wake >= 0:
                self.wake_link(link, wake)
            return
        pk = self.pkts[p]
        ser = serialisation_time_ps(pk.wire, self.link_rate[link])
        if self.lookahead > 0:
            start = self.cal_find(link, self.now, ser)
            if start > self.now:
                self.wake_link(link, start)
                return
        self.voq_head[q] = self.pkt_next[p]
        if self.voq_head[q] < 0:
            self.voq_tail[q] = -1
        self.queued[link] -= 1
        self.rr[link] = (pos + 1) % n
        vl = pk.vl
        self.credits[link * NUM_VLS + vl] -= pk.wire
        if self.lookahead > 0:
            self.cal_take(link, self.now, ser, pk.wire)
        else:
            self.busy_until[link] = self.now + ser
            self.count_transmission(link, self.now, ser, pk.wire)
        if self.record_packets:
            self.recs.append((self.now, self.now + ser, pk.msg, pk.seq, link, pk.wire, pk.ptype))
        self.packets_sent += 1
        prev = pk.in_link
        pk.in_link = link
        arrive = self.now + ser + self.link_lat[link]
        nxt = -1
        if self.link_own_queue[link]:
            s, d = self.leg_ends(p)
            nxt = self.route_link(self.msg_path[pk.msg], s, d, pk.plane, pk.uplink, pk.hop + 1)
            if nxt >= 0 and not self.link_alive[nxt]:
                nxt = -1
        if nxt >= 0:
            pk.hop += 1
            pk.ready = arrive
            self.voq_append(nxt, self.link_in_slot[link], p)
            self.wake_link(nxt, arrive if self.lookahead > 0 else max(arrive, self.busy_until[nxt]))
        elif self.sink_ep[link] >= 0 and pk.ptype == PKT_WRITE:
            nxt = -2  # (Engine.try_transmit)
        else:
            self.push(arrive, EV_PKT_ARRIVE, p)
        if self.queued[link] > 0:
            self.wake_link(link, self.now + ser)
        if prev >= 0:
            self.credits[prev * NUM_VLS + vl] += pk.wire
            self.try_transmit(prev)
        if nxt == -2:
            self.credits[link * NUM_VLS + vl] += pk.wire
            self.write_absorbed(p, arrive + self.ep_write_lat[self.sink_ep[link]])

    # -- handlers --------------------------------------------------------------------------
    def on_op_ready(self, op):
        if self.op_die[op] < len(self.die_failed) and self.die_failed[self.op_die[op]]:
            raise DieFailedError(op)
        if self.op_aic[op] > 0 or self.op_aiv[op] > 0:
            die = self.op_die[op]
            if self.core_wait[die] or self.free_aic[die] < self.op_aic[op] or self.free_aiv[die] < self.op_aiv[op]:
                self.core_wait[die].append(op)
                return
            self.free_aic[die] -= self.op_aic[op]
            self.free_aiv[die] -= self.op_aiv[op]
        self.start_op(op)

    def start_op(self, op):
        t = self.now
        kind = self.op_kind[op]
        self.op_start[op] = t
        if kind == OP_KIND_COMP:
            if self.op_rate[op] > 0:
                self.hbm_join(op)
            else:
                self.push(t + self.op_dur_ps[op], EV_OP_DONE, op)
        elif kind == OP_KIND_MEM and self.op_rate[op] > 0:
            self.hbm_join(op)
        elif kind == OP_KIND_MEM:
            r = self.op_res[op]
            start = max(t, self.res_free[r])
            self.res_free[r] = start + self.op_dur_ps[op]
            self.push(start + self.op_dur_ps[op] + self.op_lat_ps[op], EV_OP_DONE, op)
        elif kind == OP_KIND_SEND:
            msgs = self.op_msgs[op]
            left = sum(1 for m in msgs if self.msg_kind[m] == MSG_WRITE)
            self.op_left[op] = left
            self.op_tmax[op] = t
            if left == 0:
                self.push(t, EV_OP_DONE, op)
            for m in msgs:
                if self.msg_kind[m] == MSG_WRITE:
                    self.message_start(m)
        else:
            msgs = self.op_msgs[op]
            self.op_tmax[op] = t
            left = 0
            for m in msgs:
                if self.msg_left[m] == 0:
                    self.op_tmax[op] = max(self.op_tmax[op], self.msg_delivered[m])
                else:
                    self.recv_waiting[m] = True
                    left += 1
            self.op_left[op] = left
            if left == 0:
                self.push(self.op_tmax[op], EV_OP_DONE, op)
            for m in msgs:
                if self.msg_kind[m] != MSG_WRITE:
                    self.message_start(m)

    # HBM shared by a die's running ops: the native engine's max-min share and its arithmetic
    # (engine.pyx, hbm_change), in Python ints. (Python ints do not overflow: the share clock
    # is never rebased.)
    def hbm_level(self, d):
        running = self.hbm_running[d]
        left, m = self.hbm_cap[d], len(running)
        if self.hbm_sum[d] <= left:
            self.hbm_share[d] = (0, 0)
            return
        for op in running:  # lightest first
            if self.op_rate[op] * m > left:
                break
            left -= self.op_rate[op]
            m -= 1
        self.hbm_share[d] = (left, m)

    def hbm_change(self, d, joiner):
        (onum, oden), cap = self.hbm_share[d], self.hbm_cap[d]
        dt = self.now - self.hbm_t[d]
        if oden > 0 and dt > 0:
            self.hbm_k[d] += dt * HBM_SCALE * onum // (oden * cap)
        self.hbm_t[d] = self.now
        self.hbm_level(d)
        num, den = self.hbm_share[d]
        k = self.hbm_k[d]
        at = self.op_at
        uncapped, capped = [], []
        for op in self.hbm_running[d]:
            q = self.op_rate[op]
            now_capped = den > 0 and q * den > num
            if op == joiner:
                left = self.op_dur_ps[op]
                at[op] = k + -(-left * q * HBM_SCALE // cap) if now_capped else self.now + left
            else:
                was = oden > 0 and q * oden > onum
                if was and not now_capped:
                    at[op] = self.now + -(-max(0, at[op] - k) * cap // (q * HBM_SCALE))
                elif now_capped and not was:
                    at[op] = k + -(-max(0, at[op] - self.now) * q * HBM_SCALE // cap)
            (capped if now_capped else uncapped).append((at[op], op))
        if den == 0:
            self.hbm_k[d] = 0
        self.hbm_record(d)
        best = min(uncapped) if uncapped else None
        if capped:
            t, op = min(capped)
            fin = self.now + -(-max(0, t - k) * den * cap // (num * HBM_SCALE))
            if best is None or (fin, op) < best:
                best = (fin, op)
        self.hbm_next_op[d] = best[1] if best else -1
        if best is not None and self.op_hend[best[1]] != best[0]:
            self.op_hend[best[1]] = best[0]
            self.push(best[0], EV_HBM_DONE, best[1])

    def hbm_record(self, d):
        # As the native engine: only a share that differs from the die's last record.
        if self.hbm_share[d] == self.hbm_last[d]:
            return
        self.hbm_last[d] = self.hbm_share[d]
        self.hrec.append((d, self.now, *self.hbm_share[d]))

    def hbm_join(self, op):
        d = self.op_die[op]
        self.hbm_sum[d] += self.op_rate[op]
        bisect.insort(self.hbm_running[d], op, key=lambda o: (self.op_rate[o], o))
        self.hbm_change(d, op)

    def on_hbm_done(self, op):
        d = self.op_die[op]
        if self.hbm_next_op[d] != op or self.op_hend[op] != self.now:
            if self.op_hend[op] == self.now and self.hbm_next_op[d] != op:
                self.op_hend[op] = -1
            return
        self.hbm_sum[d] -= self.op_rate[op]
        self.hbm_running[d].remove(op)
        self.hbm_change(d, -1)
        if self.op_kind[op] == OP_KIND_MEM:
            self.push(self.now + self.op_lat_ps[op], EV_OP_DONE, op)
            return
        self.on_op_done(op)

    def deliver(self, m, t):
        self.msg_delivered[m] = t
        self.messages_delivered += 1
        if self.recv_waiting[m]:
            self.recv_waiting[m] = False
            r = self.msg_recv_op[m]
            self.op_tmax[r] = max(self.op_tmax[r], t)
            self.op_left[r] -= 1
            if self.op_left[r] == 0:
                self.push(self.op_tmax[r], EV_OP_DONE, r)

    def ack_back(self, m, t):
        op = self.msg_send_op[m]
        if op >= 0 and self.op_kind[op] == OP_KIND_SEND:
            self.op_tmax[op] = max(self.op_tmax[op], t)

    def acked(self, m):
        op = self.msg_send_op[m]
        if op < 0 or self.op_kind[op] != OP_KIND_SEND:
            return
        self.op_left[op] -= 1
        if self.op_left[op] == 0:
            self.push(self.op_tmax[op], EV_OP_DONE, op)

    def message_start(self, msg):
        ini = self.msg_ini[msg]
        self.msg_qnext[msg] = -1
        if self.ep_qtail[ini] < 0:
            self.ep_qhead[ini] = msg
        else:
            self.msg_qnext[self.ep_qtail[ini]] = msg
        self.ep_qtail[ini] = msg
        self.inject(ini)

    def path_reserve(self, p, link, t, hop=0, prev=-1, held=-1):
        pk = self.pkts[p]
        m = pk.msg
        s, d = self.msg_src[m], self.msg_dst[m]
        # Engine.aiv_write with back-pressure: an AIV's write to another node has its first link
        # reserved now, its tail later (queue_tails).
        split = (hop == 0 and self.split_tails and self.ini_tracked[self.msg_ini[m]] and self.msg_path[m] == PATH_UB
                 and not self.links_down and self.ep_node[s] != self.ep_node[d])
        while link >= 0:
            ser = serialisation_time_ps(pk.wire, self.link_rate[link])
            t = self.cal_take(link, t, ser, pk.wire)
            if prev >= 0 and self.buf_limit[prev] is not None:
                self.buf_hold(prev, held, t - ser, pk.wire)
            prev, held = link, t - ser
            if self.record_packets:
                self.recs.append((t - ser, t, m, pk.seq, link, pk.wire, PKT_WRITE))
            self.packets_sent += 1
            t += self.link_lat[link]
            if split:
                pk.in_link, pk.held, pk.ready = link, held, t
                self.queue_tails(p)
                return
            hop += 1
            link = self.route_link(self.msg_path[m], s, d, pk.plane, pk.uplink, hop)
        rate = self.ep_sink_rate[d]
        if rate > 0:
            ser = serialisation_time_ps(pk.payload, rate)
            t = self.cal_reserve(len(self.busy_until) + d, t, ser) + ser
        self.write_absorbed(p, t + self.ep_write_lat[d])

    def queue_tails(self, p):
        """Engine.tail_due and tq_add: once the last packet of p's message has its first link
        reserved, the message's tails are queued, due the time of the hops L1 -> L2 -> L1 from
        now, rounded up to the wheel's bucket, no later than its first packet at its L1 chip."""
        m = self.pkts[p].msg
        pkts = self.tail_msg.setdefault(m, [])
        pkts.append(p)
        if len(pkts) < self.msg_npkts[m]:
            return
        del self.tail_msg[m]
        first = self.pkts[pkts[0]]
        due = self.now
        for hop in (1, 2):
            k = self.route_link(PATH_UB, self.msg_src[m], self.msg_dst[m], first.plane, first.uplink, hop)
            due += serialisation_time_ps(first.wire, self.link_rate[k]) + self.link_lat[k]
        due = ((due >> TAIL_BUCKET_BITS) + 1) << TAIL_BUCKET_BITS
        due = min(due, min(self.pkts[q].ready for q in pkts))
        heapq.heappush(self.tails, (due, self.tail_seq, pkts))
        self.tail_seq += 1

    def run_tails(self, due):
        """Engine.run_tails: every message's tails due at ``due``, in the order they were queued."""
        self.now = max(self.now, due)
        self.events += 1
        while self.tails and self.tails[0][0] == due:
            for p in heapq.heappop(self.tails)[2]:
                pk = self.pkts[p]
                m = pk.msg
                link = self.route_link(PATH_UB, self.msg_src[m], self.msg_dst[m], pk.plane, pk.uplink, 1)
                self.path_reserve(p, link, pk.ready, 1, pk.in_link, pk.held)

    def write_absorbed(self, p, t):
        pk = self.pkts[p]
        m = pk.msg
        s = self.msg_ini[m]
        self.msg_delivered[m] = max(self.msg_delivered[m], t)
        if self.msg_left[m] == 1:
            self.deliver(m, self.msg_delivered[m])
        t += self.ack_trip(m, pk.plane, pk.uplink)
        if not self.ini_tracked[s] or self.lookahead == 0:
            heapq.heappush(self.ack_heap[s], t)
        if self.ini_tracked[s]:
            self.aiv_done(s, pk.iseq, t)
        if (self.ep_qhead[s] >= 0 and self.ep_outstanding[s] >= self.ep_max_out[s]
                and not (self.ini_tracked[s] and self.lookahead > 0)):
            self.wake_at(s, t)
        self.ack_back(m, t)
        self.packet_release(p)
        self.msg_left[m] -= 1
        if self.msg_left[m] == 0:
            self.acked(m)

    def cal_gap(self, k, lo, t, need):
        c = self.cal[k]
        n = i = len(c) // 2
        while i > lo and c[2 * i - 1] > t:
            i -= 1
        while i < n and c[2 * i] < t + need:
            t = max(t, c[2 * i + 1])
            i += 1
        return i, t

    def buf_hold(self, link, a, b, w):
        """engine.pyx buf_hold: w bytes in link's receive buffer over [a, b); where it then has
        no room for another w, the link is blocked."""
        if b <= a:
            return
        e = self.buf[link]
        n = len(e) // 2
        i = n
        while i > 0 and e[2 * i - 2] >= a:
            i -= 1
        if i == n or e[2 * i] != a:
            e[2 * i:2 * i] = [a, e[2 * i - 1] if i > 0 else 0]
            n += 1
        j = i
        while j < n and e[2 * j] < b:
            e[2 * j + 1] += w
            j += 1
        if j == n or e[2 * j] != b:
            e[2 * j:2 * j] = [b, e[2 * j - 1] - w]
        room = self.buf_limit[link] - w
        k = i
        while k < j:
            if e[2 * k + 1] > room:
                x1 = e[2 * k]
                while k < j and e[2 * k + 1] > room:
                    k += 1
                self.cal_block(link, x1, e[2 * k])
            else:
                k += 1

    def cal_block(self, k, x1, x2):
        """engine.pyx cal_block: [x1, x2) busy in calendar k, joining the intervals it meets."""
        c = self.cal[k]
        n = len(c) // 2
        i = self.cal_lo[k]
        while i < n and c[2 * i + 1] < x1:
            i += 1
        j = i
        while j < n and c[2 * j] <= x2:
            j += 1
        if j > i:
            c[2 * i:2 * j] = [min(c[2 * i], x1), max(c[2 * j - 1], x2)]
        else:
            c[2 * i:2 * i] = [x1, x2]

    def cal_find(self, k, t, need):
        return self.cal_gap(k, self.cal_lo[k], t, need)[1]

    def cal_reserve(self, k, t, need):
        """engine.pyx cal_reserve, on calendar k (a link's, or n_links + an endpoint's sink)."""
        c = self.cal[k]
        lo, n = self.cal_lo[k], len(c) // 2
        while lo < n and c[2 * lo + 1] <= self.now:
            lo += 1
        if lo > 0 and 2 * lo >= n:
            del c[:2 * lo]
            n -= lo
            lo = 0
        i, t = self.cal_gap(k, lo, t, need)
        if i > lo and c[2 * i - 1] == t:
            c[2 * i - 1] = t + need
            if i < n and c[2 * i] == t + need:
                c[2 * i - 1] = c[2 * i + 1]
                del c[2 * i:2 * i + 2]
        elif i < n and c[2 * i] == t + need:
            c[2 * i] = t
        else:
            c[2 * i:2 * i] = [t, t + need]
        self.cal_lo[k] = lo
        return t

    def cal_take(self, link, t, need, nbytes):
        t = self.cal_reserve(link, t, need)
        self.count_transmission(link, t, need, nbytes)
        self.busy_until[link] = max(self.busy_until[link], t + need)
        return t + need

    def collect_acks(self, ep):
        h = self.ack_heap[ep]
        while h and h[0] <= self.now:
            heapq.heappop(h)
            self.ep_outstanding[ep] -= 1

    def inject(self, ep):
        self.collect_acks(ep)
        if self.held_ports[ep]:
            self.release_held(ep)
        while self.ep_qhead[ep] >= 0:
            m = self.ep_qhead[ep]
            kind = self.msg_kind[m]
            h = self.ack_heap[ep]
            tracked = self.ini_tracked[ep]
            if tracked and self.msg_seq[m] == 0:
                t = self.aiv_ready(ep, m)
                if t < 0:
                    break
            if self.ep_outstanding[ep] >= self.ep_max_out[ep] and not (tracked and self.lookahead > 0):
                if (self.lookahead == 0 or kind != MSG_WRITE or not h
                        or len(h) + self.held_count[ep] != self.ep_outstanding[ep] or h[0] > self.now + self.lookahead):
                    break
                self.ep_issue_free[ep] = max(self.ep_issue_free[ep], heapq.heappop(h))
                self.ep_outstanding[ep] -= 1
            if tracked:
                if self.msg_seq[m] == 0:
                    t = max(t, self.ep_issue_free[ep])
                    self.ep_issue_free[ep] = t
                    r = self.ini_seq[ep] % AIV_RING
                    self.ini_seq[ep] += 1
                    self.ring_t[ep - self.n_eps][r] = 0
                    self.ring_left[ep - self.n_eps][r] = self.msg_npkts[m]
                    if self.msg_flow[m] & FLOW_BASE:
                        self.ini_base[ep] = t - self.ini_msg_startup[2 * ep + min(kind, 1)]
                elif self.lookahead == 0 and self.ep_issue_free[ep] > self.now:
                    self.wake_at(ep, self.ep_issue_free[ep])
                    break
            path = self.msg_path[m]
            payload = min(self.msg_bytes[m] - self.msg_seq[m] * self.path_mtu[path], self.path_mtu[path])
            p = self.packet_new()
            pk = self.pkts[p]
            pk.msg = m
            pk.payload = payload
            pk.seq = self.msg_seq[m]
            pk.leg = 0
            pk.hop = 0
            pk.iseq = self.ini_seq[ep] - 1
            pk.in_link = -1
            pk.vl = 0
            pk.ptype = PKT_WRITE if kind == MSG_WRITE else PKT_READ_REQ
            pk.wire = self.wire_bytes(path, pk.ptype, 0 if kind == MSG_READ else payload)
            idx = self.choose_path(m, self.msg_seq[m], p)
            pk.plane = idx % self.P
            pk.uplink = idx // self.P
            self.msg_seq[m] += 1
            if self.msg_seq[m] == self.msg_npkts[m]:
                self.ep_qhead[ep] = self.msg_qnext[m]
                if self.ep_qhead[ep] < 0:
                    self.ep_qtail[ep] = -1
            if not tracked or self.lookahead == 0 or kind != MSG_WRITE:
                self.ep_outstanding[ep] += 1
            op = self.msg_send_op[m] if kind == MSG_WRITE else self.msg_recv_op[m]
            self.ep_issue_free[ep] = max(self.ep_issue_free[ep], self.now, self.op_start[op] + self.ep_startup[ep])
            pk.ready = self.ep_issue_free[ep]
            self.ep_issue_free[ep] += self.ep_issue[ep * 2 + (kind if kind < 2 else 1)]
            s, d = self.leg_ends(p)
            first = self.route_link(path, s, d, pk.plane, pk.uplink, 0)
            if self.lookahead > 0 and kind == MSG_WRITE:
                if not tracked and (self.queued[first] > 0 or self.port_start(p, first) > self.now + self.lookahead):
                    self.voq_append(first, 0, p)  # the horizon (Engine.held_writes)
                    self.held_count[ep] += 1
                    if first not in self.held_ports[ep]:
                        if len(self.held_ports[ep]) < HELD_PORTS:
                            self.held_ports[ep].append(first)
                        else:
                            self.held_writes(first, self.lookahead)
                    continue
                self.path_reserve(p, first, pk.ready)
                continue
            self.voq_append(first, 0, p)
            self.try_transmit(first)
        if (self.ep_qhead[ep] >= 0 and self.ack_heap[ep] and self.ep_outstanding[ep] >= self.ep_max_out[ep]
                and not (self.ini_tracked[ep] and self.lookahead > 0)):
            self.wake_at(ep, self.ack_heap[ep][0])
        if self.held_ports[ep]:
            self.release_held(ep)

    def release_held(self, ep):
        """Engine.release_held."""
        ports = self.held_ports[ep]
        first = None
        k = 0
        while k < len(ports):
            link = ports[k]
            start = self.held_writes(link, -1)
            if start < 0:
                ports[k] = ports[-1]  # (the engine's swap with the last)
                ports.pop()
                continue
            first = start if first is None else min(first, start)
            k += 1
        if ports:
            self.wake_at(ep, first)

    def aiv_ready(self, ep, m):
        """When AIV initiator ep may issue message m's first packet, or -1 (Engine.aiv_ready)."""
        s = self.ini_seq[ep]
        k0 = ep - self.n_eps
        if s >= AIV_RING and self.ring_left[k0][s % AIV_RING] > 0:
            self.ini_wait[ep] = s - AIV_RING
            return -1
        kind = self.msg_kind[m]
        op = self.msg_send_op[m] if kind == MSG_WRITE else self.msg_recv_op[m]
        t = max(self.op_start[op] + self.ep_startup[ep], self.ini_base[ep]) + self.msg_prep[m]
        if s >= AIV_RING:  # its slot frees at the completion of the message AIV_RING before
            t = max(t, self.ring_t[k0][s % AIV_RING])
        k = self.msg_flow[m] & FLOW_AFTER_MASK
        if k > 0 and s >= k:
            e = (s - k) % AIV_RING
            if self.ring_left[k0][e] > 0:
                self.ini_wait[ep] = s - k
                return -1
            t = max(t, self.ring_t[k0][e])
        t = max(t + self.ini_msg_startup[2 * ep + min(kind, 1)], self.ep_issue_free[ep], self.now)
        la = (self.aiv_lookahead + self.ini_msg_startup[2 * ep + min(kind, 1)]
              if kind == MSG_WRITE and self.lookahead > 0 else 0)
        if t > self.now + la:
            self.wake_at(ep, t - la + self.aiv_lookahead if la > 0 else t)
            return -1
        return t

    def aiv_done(self, ep, iseq, t):
        k0 = ep - self.n_eps
        e = iseq % AIV_RING
        self.ring_t[k0][e] = max(self.ring_t[k0][e], t)
        self.ring_left[k0][e] -= 1
        if self.ring_left[k0][e] == 0 and self.ini_wait[ep] == iseq:
            self.ini_wait[ep] = -1
            self.wake_at(ep, max(self.ring_t[k0][e], self.now))

    def wake_at(self, ep, t):
        if not self.ep_wake_pending[ep] or t < self.ep_wake_at[ep]:
            self.ep_wake_pending[ep] = True
            self.ep_wake_at[ep] = t
            self.push(t, EV_WAKE, ep)

    def on_wake(self, ep):
        if self.now == self.ep_wake_at[ep]:
            self.ep_wake_pending[ep] = False
        self.inject(ep)

    def wake_link(self, link, t):
        if self.free_at[link] < 0 or t < self.free_at[link]:
            self.free_at[link] = t
            self.push(t, EV_LINK_FREE, link)

    def on_link_free(self, link):
        if self.now != self.free_at[link]:
            return
        self.free_at[link] = -1
        self.try_transmit(link)

    def on_packet_arrive(self, p):
        pk = self.pkts[p]
        link = pk.link
        m = pk.msg
        if not self.link_alive[link]:
            self.credits[link * NUM_VLS + pk.vl] += pk.wire
            return self.lose(p)
        s, d = self.leg_ends(p)
        nxt = self.route_link(self.msg_path[m], s, d, pk.plane, pk.uplink, pk.hop + 1)
        if nxt >= 0 and not self.link_alive[nxt]:
            self.credits[link * NUM_VLS + pk.vl] += pk.wire
            self.try_transmit(link)
            return self.lose(p)
        if nxt >= 0:
            pk.hop += 1
            self.voq_append(nxt, self.link_in_slot[link], p)
            self.try_transmit(nxt)
            return
        rate = self.ep_sink_rate[d]
        if rate > 0 and pk.ptype == PKT_WRITE:
            start = max(self.now, self.ep_sink_free[d])
            self.ep_sink_free[d] = start + serialisation_time_ps(pk.payload, rate)
            self.push(self.ep_sink_free[d], EV_SINK_DONE, p)
        else:
            self.on_sink_done(p)

    def ack_trip(self, m, plane, uplink):
        path = self.msg_path[m]
        wire = self.wire_bytes(path, PKT_ACK, 0)
        total, hop = 0, 0
        while True:
            link = self.route_link(path, self.msg_dst[m], self.msg_src[m], plane, uplink, hop)
            if link < 0:
                return total
            total += serialisation_time_ps(wire, self.link_rate[link]) + self.link_lat[link]
            hop += 1

    def on_sink_done(self, p):
        pk = self.pkts[p]
        m = pk.msg
        link = pk.in_link
        self.credits[link * NUM_VLS + pk.vl] += pk.wire
        self.try_transmit(link)
        if pk.ptype == PKT_WRITE:
            self.write_absorbed(p, self.now + self.ep_write_lat[self.msg_dst[m]])
        elif pk.ptype == PKT_READ_REQ:
            src = self.msg_src[m]
            t = self.now
            if self.ep_read_rate[src] > 0:  # the target's memory serves reads one after the other
                t = max(t, self.ep_read_free[src]) + serialisation_time_ps(pk.payload, self.ep_read_rate[src])
                self.ep_read_free[src] = t
            t += self.ep_read_lat[src]
            if self.msg_kind[m] == MSG_ATOMIC:
                t += self.ep_write_lat[self.msg_src[m]]
            self.push(t, EV_RESP_INJECT, p)
        else:
            d = self.msg_ini[m]
            self.ep_outstanding[d] -= 1
            if self.ini_tracked[d]:
                self.aiv_done(d, pk.iseq, self.now)
            self.packet_release(p)
            self.msg_left[m] -= 1
            if self.msg_left[m] == 0:
                self.deliver(m, self.now)
            self.inject(d)

    def on_response_inject(self, p):
        pk = self.pkts[p]
        m = pk.msg
        path = self.msg_path[m]
        pk.leg = 1
        pk.ptype = PKT_READ_RESP
        pk.vl = 1
        pk.hop = 0
        pk.in_link = -1
        pk.ready = self.now
        pk.wire = self.wire_bytes(path, PKT_READ_RESP, pk.payload)
        first = self.route_link(path, self.msg_src[m], self.msg_dst[m], pk.plane, pk.uplink, 0)
        if not self.link_alive[first]:
            return self.lose(p)
        self.voq_append(first, 0, p)
        self.try_transmit(first)

    def on_op_done(self, op):
        self.op_end[op] = self.now
        self.ops_done += 1
        if self.op_aic[op] > 0 or self.op_aiv[op] > 0:
            die = self.op_die[op]
            self.free_aic[die] += self.op_aic[op]
            self.free_aiv[die] += self.op_aiv[op]
            wait = self.core_wait[die]
            while wait and self.free_aic[die] >= self.op_aic[wait[0]] and self.free_aiv[die] >= self.op_aiv[wait[0]]:
                w = wait.pop(0)
                self.free_aic[die] -= self.op_aic[w]
                self.free_aiv[die] -= self.op_aiv[w]
                self.start_op(w)
        for s in range(self.succ_ptr[op], self.succ_ptr[op + 1]):
            nxt = self.succ_idx[s]
            self.pending_deps[nxt] -= 1
            if self.pending_deps[nxt] == 0:
                self.push(self.now, EV_OP_READY, nxt)

    _HANDLERS = {
        EV_OP_READY: on_op_ready, EV_OP_DONE: on_op_done,
        EV_LINK_FREE: on_link_free, EV_PKT_ARRIVE: on_packet_arrive, EV_SINK_DONE: on_sink_done,
        EV_RESP_INJECT: on_response_inject,
        EV_FAIL: on_fail, EV_RETRANSMIT: on_retransmit, EV_WAKE: on_wake, EV_HBM_DONE: on_hbm_done,
    }

    def run(self, max_events=-1, max_series_rows=-1):
        heap = self.heap
        handlers = self._HANDLERS
        budget = max_events
        while (heap or self.tails) and budget != 0 and (max_series_rows < 0 or len(self.series) <= max_series_rows):
            if self.tails and (not heap or self.tails[0][0] <= heap[0][0]):
                self.run_tails(self.tails[0][0])  # before the events at their time
                continue
            time, _seq, kind, a = heapq.heappop(heap)
            self.now = time
            self.events += 1
            if budget > 0:
                budget -= 1
            handlers[kind](self, a)
        return not heap and not self.tails

    def release(self, keep_op_times=False):
        """Engine.release: the reference keeps its state (it is for small runs)."""

    @property
    def pending(self):
        return len(self.heap) + len(self.tails)

    @property
    def op_start_ps(self):
        return np.asarray(self.op_start, dtype=np.int64)

    @property
    def op_end_ps(self):
        return np.asarray(self.op_end, dtype=np.int64)

    @property
    def msg_delivered_ps(self):
        return np.asarray(self.msg_delivered[:self.n_record], dtype=np.int64)

    @property
    def hbm_shared_ops(self):
        return np.flatnonzero(np.asarray(self.op_rate) > 0).astype(np.int32)

    @property
    def hbm_shared_demand(self):
        rate = np.asarray(self.op_rate, dtype=np.int64)
        return rate[rate > 0]

    def op_messages(self, op):
        return np.asarray(self.op_msgs[op], dtype=np.int32)

    def message(self, m):
        return (self.msg_src[m], self.msg_dst[m], self.msg_bytes[m], self.msg_kind[m], self.msg_path[m],
                self.msg_send_op[m], self.msg_recv_op[m])

    @property
    def packets_total(self):
        return sum(self.msg_npkts)

    @property
    def msg_pending(self):
        return np.asarray(self.msg_left, dtype=np.int32)

    @property
    def msg_packets(self):
        return np.asarray(self.msg_npkts, dtype=np.int32)

    def message_packets(self, n=-1):
        return np.asarray(self.msg_npkts[:None if n < 0 else n], dtype=np.int64)


    @property
    def link_bytes(self):
        return np.asarray(self.lbytes, dtype=np.int64)

    @property
    def link_busy_ps(self):
        return np.asarray(self.lbusy, dtype=np.int64)

    @property
    def credit_bytes(self):
        return np.asarray(self.credits, dtype=np.int64).reshape(-1, NUM_VLS)
