"""Pure-Python reference of the event kernel in ``engine.pyx``: the same loop, handler for
handler, with ``heapq`` for the heap. Slow (about 20x or more below the Cython kernel); it exists
so that tests can check the native kernel gives identical results, event for event.
"""
from __future__ import annotations

import heapq

import numpy as np

K_COMP, K_SEND, K_RECV, K_MEM = range(4)
EV_OP_READY, EV_OP_DONE, EV_CHUNK_HOP, EV_CHUNK_ARRIVE = range(4)
PS_PER_S = 10**12


def serialisation_time_ps(nbytes: int, rate_byte_per_s: int) -> int:
    """Time to put nbytes on a link of the given rate, rounded up to a whole picosecond."""
    return -(-int(nbytes) * PS_PER_S // int(rate_byte_per_s))


class Engine:
    def __init__(self, lowered):
        L = lowered
        self.n_ops = int(L.op_kind.shape[0])
        self.op_kind = L.op_kind.tolist()
        self.op_dur_ps = L.op_dur_ps.tolist()
        self.op_lat_ps = L.op_lat_ps.tolist()
        self.op_res = L.op_res.tolist()
        self.op_msg = L.op_msg.tolist()
        self.succ_ptr = L.succ_ptr.tolist()
        self.succ_idx = L.succ_idx.tolist()
        self.pending_deps = L.op_npred.tolist()
        self.op_start = [-1] * self.n_ops
        self.op_end = [-1] * self.n_ops
        n_msgs = int(L.msg_send_op.shape[0])
        self.msg_send_op = L.msg_send_op.tolist()
        self.msg_recv_op = L.msg_recv_op.tolist()
        self.msg_chunk_ptr = L.msg_chunk_ptr.tolist()
        self.chunk_msg = L.chunk_msg.tolist()
        self.chunk_bytes = L.chunk_bytes.tolist()
        self.chunk_route_lo = L.chunk_route_lo.tolist()
        self.chunk_route_hi = L.chunk_route_hi.tolist()
        self.route_links = L.route_links.tolist()
        self.msg_send_left = [0] * n_msgs
        self.msg_arrive_left = np.diff(L.msg_chunk_ptr).tolist()
        self.msg_send_end = [0] * n_msgs
        self.msg_delivered = [-1] * n_msgs
        self.recv_waiting = [False] * n_msgs
        self.link_rate = L.link_rate_byte_per_s.tolist()
        self.link_lat = L.link_latency_ps.tolist()
        n_links = len(self.link_rate)
        self.link_free = [0] * n_links
        self.lbytes = [0] * n_links
        self.lbusy = [0] * n_links
        self.res_free = [0] * int(L.n_resources)
        self.heap: list[tuple[int, int, int, int, int]] = []
        self.seq = 0
        self.now = 0
        self.events = 0
        self.ops_done = 0
        self.max_pending = 0
        self.past_event = False
        for i in range(self.n_ops):
            if self.pending_deps[i] == 0:
                self.push(0, EV_OP_READY, i, 0)

    def push(self, time, kind, a, b):
        if time < self.now:
            self.past_event = True
        heapq.heappush(self.heap, (time, self.seq, kind, a, b))
        self.seq += 1
        if len(self.heap) > self.max_pending:
            self.max_pending = len(self.heap)

    def on_op_ready(self, op):
        t = self.now
        kind = self.op_kind[op]
        self.op_start[op] = t
        if kind == K_COMP:
            self.push(t + self.op_dur_ps[op], EV_OP_DONE, op, 0)
        elif kind == K_MEM:
            r = self.op_res[op]
            start = max(t, self.res_free[r])
            self.res_free[r] = start + self.op_dur_ps[op]
            self.push(start + self.op_dur_ps[op] + self.op_lat_ps[op], EV_OP_DONE, op, 0)
        elif kind == K_SEND:
            msg = self.op_msg[op]
            lo, hi = self.msg_chunk_ptr[msg], self.msg_chunk_ptr[msg + 1]
            self.msg_send_left[msg] = hi - lo
            self.msg_send_end[msg] = t
            for c in range(lo, hi):
                self.push(t, EV_CHUNK_HOP, c, 0)
        else:
            msg = self.op_msg[op]
            if self.msg_delivered[msg] >= 0:
                self.push(t, EV_OP_DONE, op, 0)
            else:
                self.recv_waiting[msg] = True

    def on_chunk_hop(self, chunk, hop):
        t = self.now
        ptr = self.chunk_route_lo[chunk] + hop
        link = self.route_links[ptr]
        nbytes = self.chunk_bytes[chunk]
        start = max(t, self.link_free[link])
        ser = serialisation_time_ps(nbytes, self.link_rate[link])
        sent = start + ser
        self.link_free[link] = sent
        self.lbytes[link] += nbytes
        self.lbusy[link] += ser
        if hop == 0:
            msg = self.chunk_msg[chunk]
            self.msg_send_end[msg] = max(self.msg_send_end[msg], sent)
            self.msg_send_left[msg] -= 1
            if self.msg_send_left[msg] == 0:
                self.push(self.msg_send_end[msg], EV_OP_DONE, self.msg_send_op[msg], 0)
        kind = EV_CHUNK_HOP if ptr + 1 < self.chunk_route_hi[chunk] else EV_CHUNK_ARRIVE
        self.push(sent + self.link_lat[link], kind, chunk, hop + 1 if kind == EV_CHUNK_HOP else 0)

    def on_chunk_arrive(self, chunk):
        msg = self.chunk_msg[chunk]
        self.msg_arrive_left[msg] -= 1
        if self.msg_arrive_left[msg] == 0:
            self.msg_delivered[msg] = self.now
            if self.recv_waiting[msg]:
                self.recv_waiting[msg] = False
                self.push(self.now, EV_OP_DONE, self.msg_recv_op[msg], 0)

    def on_op_done(self, op):
        self.op_end[op] = self.now
        self.ops_done += 1
        for s in range(self.succ_ptr[op], self.succ_ptr[op + 1]):
            nxt = self.succ_idx[s]
            self.pending_deps[nxt] -= 1
            if self.pending_deps[nxt] == 0:
                self.push(self.now, EV_OP_READY, nxt, 0)

    def run(self, max_events=-1):
        heap = self.heap
        budget = max_events
        while heap and budget != 0:
            time, _seq, kind, a, b = heapq.heappop(heap)
            self.now = time
            self.events += 1
            if budget > 0:
                budget -= 1
            if kind == EV_CHUNK_HOP:
                self.on_chunk_hop(a, b)
            elif kind == EV_OP_DONE:
                self.on_op_done(a)
            elif kind == EV_OP_READY:
                self.on_op_ready(a)
            else:
                self.on_chunk_arrive(a)
        return not heap

    @property
    def pending(self):
        return len(self.heap)

    # Same result attributes as the native engine, as numpy arrays.
    @property
    def op_start_ps(self):
        return np.asarray(self.op_start, dtype=np.int64)

    @property
    def op_end_ps(self):
        return np.asarray(self.op_end, dtype=np.int64)

    @property
    def msg_delivered_ps(self):
        return np.asarray(self.msg_delivered, dtype=np.int64)

    @property
    def link_bytes(self):
        return np.asarray(self.lbytes, dtype=np.int64)

    @property
    def link_busy_ps(self):
        return np.asarray(self.lbusy, dtype=np.int64)
