# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The discrete-event kernel: one loop, integer picoseconds, C handlers.

Events are ordered by (time, sequence); the sequence number is the order in which events were
scheduled, so ties break first-scheduled-first and every run is deterministic. Handlers are C
functions named after the hardware action they model; nothing calls back into Python per event.
``cmemu._core.reference`` is the same loop in pure Python; tests check that both agree exactly.

What an event means (the stand-in models of the foundation slice):

- ``on_op_ready``: an op's dependencies (data, control, and the previous op of its stream) have
  all ended. COMP runs for its precomputed duration; MEM_LOAD/MEM_STORE queue FIFO on their die's
  HBM server (serialisation at the HBM rate, then the access latency); COMM_SEND injects its
  message's chunks at hop 0; COMM_RECV completes when its message has been delivered.
- ``on_chunk_hop``: store-and-forward: a chunk waits until the link is free, is serialised at
  the link rate, and reaches the next hop after the link's latency.
- ``on_chunk_arrive``: the chunk reached its destination; the last chunk delivers the message.
- ``on_op_done``: an op ends; successors whose last dependency this was become ready.
"""
cimport cython
from libc.stdlib cimport malloc, realloc, free
from libc.stdint cimport int64_t, int32_t, uint8_t

import numpy as np
cimport numpy as cnp

cnp.import_array()

cdef extern from *:
    """
    typedef __int128 cm_int128;
    """
    ctypedef long long cm_int128

# Op kinds (must match cmemu.lower.OP_KIND_*).
cdef enum:
    K_COMP = 0
    K_SEND = 1
    K_RECV = 2
    K_MEM = 3

# Event types. Ties at equal time break by sequence number, not by type.
cdef enum:
    EV_OP_READY = 0
    EV_OP_DONE = 1
    EV_CHUNK_HOP = 2
    EV_CHUNK_ARRIVE = 3

cdef int64_t PS_PER_S = 1000000000000

cdef struct Event:
    int64_t time
    int64_t seq
    int32_t kind
    int32_t a
    int32_t b


cdef inline bint ev_less(Event* x, Event* y) noexcept nogil:
    if x.time != y.time:
        return x.time < y.time
    return x.seq < y.seq


cdef inline int64_t serialisation_ps(int64_t nbytes, int64_t rate_byte_per_s) noexcept nogil:
    """Time to put nbytes on a link of the given rate, rounded up to a whole picosecond."""
    cdef cm_int128 num = <cm_int128>nbytes * PS_PER_S + rate_byte_per_s - 1
    return <int64_t>(num / rate_byte_per_s)


def serialisation_time_ps(nbytes, rate_byte_per_s):
    """Python access to the kernel's serialisation rule (used by the reference and tests)."""
    return serialisation_ps(nbytes, rate_byte_per_s)


@cython.final
cdef class Engine:
    """Replays lowered arrays (see ``cmemu.lower.Lowered``) to op start/end times."""

    # Event heap, plus a FIFO for events scheduled at the current time (see `push`).
    cdef Event* heap
    cdef int64_t heap_len, heap_cap, seq
    cdef Event* fifo
    cdef int64_t fifo_head, fifo_len, fifo_cap
    cdef readonly int64_t now, events, n_ops, ops_done, max_pending
    cdef readonly bint past_event  # invariant: nothing scheduled before `now`
    # Ops.
    cdef const uint8_t[::1] op_kind
    cdef const int64_t[::1] op_dur_ps
    cdef const int64_t[::1] op_lat_ps
    cdef const int32_t[::1] op_res
    cdef const int32_t[::1] op_msg
    cdef const int64_t[::1] succ_ptr
    cdef const int32_t[::1] succ_idx
    cdef int32_t[::1] pending_deps
    cdef readonly cnp.ndarray op_start_ps, op_end_ps
    cdef int64_t[::1] op_start, op_end
    # Messages and chunks.
    cdef const int32_t[::1] msg_send_op
    cdef const int32_t[::1] msg_recv_op
    cdef const int64_t[::1] msg_chunk_ptr
    cdef const int32_t[::1] chunk_msg
    cdef const int64_t[::1] chunk_bytes
    cdef const int64_t[::1] chunk_route_lo
    cdef const int64_t[::1] chunk_route_hi
    cdef const int32_t[::1] route_links
    cdef int32_t[::1] msg_send_left, msg_arrive_left
    cdef int64_t[::1] msg_send_end
    cdef readonly cnp.ndarray msg_delivered_ps
    cdef int64_t[::1] msg_delivered
    cdef uint8_t[::1] recv_waiting
    # Links and servers.
    cdef const int64_t[::1] link_rate
    cdef const int64_t[::1] link_lat
    cdef int64_t[::1] link_free
    cdef readonly cnp.ndarray link_bytes, link_busy_ps
    cdef int64_t[::1] lbytes, lbusy
    cdef int64_t[::1] res_free

    def __cinit__(self):
        self.heap = NULL
        self.fifo = NULL

    def __init__(self, lowered):
        cdef int64_t i
        L = lowered
        self.n_ops = L.op_kind.shape[0]
        self.op_kind = L.op_kind
        self.op_dur_ps = L.op_dur_ps
        self.op_lat_ps = L.op_lat_ps
        self.op_res = L.op_res
        self.op_msg = L.op_msg
        self.succ_ptr = L.succ_ptr
        self.succ_idx = L.succ_idx
        self.pending_deps = L.op_npred.copy()
        self.op_start_ps = np.full(self.n_ops, -1, dtype=np.int64)
        self.op_end_ps = np.full(self.n_ops, -1, dtype=np.int64)
        self.op_start = self.op_start_ps
        self.op_end = self.op_end_ps
        n_msgs = L.msg_send_op.shape[0]
        self.msg_send_op = L.msg_send_op
        self.msg_recv_op = L.msg_recv_op
        self.msg_chunk_ptr = L.msg_chunk_ptr
        self.chunk_msg = L.chunk_msg
        self.chunk_bytes = L.chunk_bytes
        self.chunk_route_lo = L.chunk_route_lo
        self.chunk_route_hi = L.chunk_route_hi
        self.route_links = L.route_links
        self.msg_send_left = np.zeros(n_msgs, dtype=np.int32)
        self.msg_arrive_left = np.diff(L.msg_chunk_ptr).astype(np.int32)
        self.msg_send_end = np.zeros(n_msgs, dtype=np.int64)
        self.msg_delivered_ps = np.full(n_msgs, -1, dtype=np.int64)
        self.msg_delivered = self.msg_delivered_ps
        self.recv_waiting = np.zeros(n_msgs, dtype=np.uint8)
        self.link_rate = L.link_rate_byte_per_s
        self.link_lat = L.link_latency_ps
        n_links = L.link_rate_byte_per_s.shape[0]
        self.link_free = np.zeros(n_links, dtype=np.int64)
        self.link_bytes = np.zeros(n_links, dtype=np.int64)
        self.link_busy_ps = np.zeros(n_links, dtype=np.int64)
        self.lbytes = self.link_bytes
        self.lbusy = self.link_busy_ps
        self.res_free = np.zeros(L.n_resources, dtype=np.int64)
        self.heap_cap = 1024
        self.heap = <Event*>malloc(self.heap_cap * sizeof(Event))
        self.fifo_cap = 1024
        self.fifo = <Event*>malloc(self.fifo_cap * sizeof(Event))
        if self.heap == NULL or self.fifo == NULL:
            raise MemoryError("event heap")
        self.fifo_head = 0
        self.fifo_len = 0
        self.heap_len = 0
        self.seq = 0
        self.now = 0
        self.events = 0
        self.ops_done = 0
        self.max_pending = 0
        self.past_event = False
        for i in range(self.n_ops):
            if self.pending_deps[i] == 0:
                self.push(0, EV_OP_READY, <int32_t>i, 0)

    def __dealloc__(self):
        if self.heap != NULL:
            free(self.heap)
        if self.fifo != NULL:
            free(self.fifo)

    # -- the heap ------------------------------------------------------------------------
    cdef int push(self, int64_t time, int32_t kind, int32_t a, int32_t b) except -1:
        """Schedule an event. Order is (time, seq) exactly as one heap would give it; events
        for the current time go to a FIFO instead, which is the same order because every
        event already in the heap for this time was scheduled earlier (smaller seq)."""
        cdef Event ev
        cdef int64_t total
        if time < self.now:
            self.past_event = True
        ev.time = time
        ev.seq = self.seq
        ev.kind = kind
        ev.a = a
        ev.b = b
        self.seq += 1
        if time == self.now:
            self.fifo_push(ev)
        else:
            self.heap_push(ev)
        total = self.heap_len + self.fifo_len
        if total > self.max_pending:
            self.max_pending = total
        return 0

    cdef int fifo_push(self, Event ev) except -1:
        cdef Event* grown
        cdef int64_t k
        if self.fifo_len == self.fifo_cap:
            grown = <Event*>malloc(2 * self.fifo_cap * sizeof(Event))
            if grown == NULL:
                raise MemoryError("event FIFO")
            for k in range(self.fifo_len):
                grown[k] = self.fifo[(self.fifo_head + k) % self.fifo_cap]
            free(self.fifo)
            self.fifo = grown
            self.fifo_head = 0
            self.fifo_cap *= 2
        self.fifo[(self.fifo_head + self.fifo_len) % self.fifo_cap] = ev
        self.fifo_len += 1
        return 0

    cdef int heap_push(self, Event ev) except -1:
        cdef Event* grown
        cdef int64_t i, parent
        if self.heap_len == self.heap_cap:
            grown = <Event*>realloc(self.heap, 2 * self.heap_cap * sizeof(Event))
            if grown == NULL:
                raise MemoryError("event heap")
            self.heap = grown
            self.heap_cap *= 2
        i = self.heap_len
        self.heap_len += 1
        while i > 0:
            parent = (i - 1) >> 2
            if not ev_less(&ev, &self.heap[parent]):
                break
            self.heap[i] = self.heap[parent]
            i = parent
        self.heap[i] = ev
        return 0

    cdef inline Event next_event(self) noexcept nogil:
        """The earliest event: heap events for the current time precede the FIFO's."""
        cdef Event ev
        if self.fifo_len > 0 and (self.heap_len == 0 or self.heap[0].time > self.fifo[self.fifo_head].time):
            ev = self.fifo[self.fifo_head]
            self.fifo_head += 1
            if self.fifo_head == self.fifo_cap:
                self.fifo_head = 0
            self.fifo_len -= 1
            return ev
        return self.pop()

    cdef inline Event pop(self) noexcept nogil:
        # A 4-ary heap (half the depth of a binary one, children share cache lines), popped
        # Floyd's way: walk the hole down to a leaf along the smallest children, then sift the
        # last element up from there (usually zero or one step).
        cdef Event top = self.heap[0]
        cdef Event last
        cdef int64_t i = 0, child, best, k, end, parent, n
        self.heap_len -= 1
        n = self.heap_len
        if n > 0:
            last = self.heap[n]
            child = 1
            while child < n:
                best = child
                end = child + 4 if child + 4 < n else n
                for k in range(child + 1, end):
                    if ev_less(&self.heap[k], &self.heap[best]):
                        best = k
                self.heap[i] = self.heap[best]
                i = best
                child = 4 * i + 1
            while i > 0:
                parent = (i - 1) >> 2
                if not ev_less(&last, &self.heap[parent]):
                    break
                self.heap[i] = self.heap[parent]
                i = parent
            self.heap[i] = last
        return top

    # -- handlers ------------------------------------------------------------------------
    cdef int on_op_ready(self, int32_t op) except -1:
        cdef int64_t t = self.now, start
        cdef int32_t msg, r
        cdef int64_t c
        cdef uint8_t kind = self.op_kind[op]
        self.op_start[op] = t
        if kind == K_COMP:
            self.push(t + self.op_dur_ps[op], EV_OP_DONE, op, 0)
        elif kind == K_MEM:
            r = self.op_res[op]
            start = t if t > self.res_free[r] else self.res_free[r]
            self.res_free[r] = start + self.op_dur_ps[op]
            self.push(start + self.op_dur_ps[op] + self.op_lat_ps[op], EV_OP_DONE, op, 0)
        elif kind == K_SEND:
            msg = self.op_msg[op]
            self.msg_send_left[msg] = <int32_t>(self.msg_chunk_ptr[msg + 1] - self.msg_chunk_ptr[msg])
            self.msg_send_end[msg] = t
            for c in range(self.msg_chunk_ptr[msg], self.msg_chunk_ptr[msg + 1]):
                self.push(t, EV_CHUNK_HOP, <int32_t>c, 0)
        else:  # K_RECV
            msg = self.op_msg[op]
            if self.msg_delivered[msg] >= 0:
                self.push(t, EV_OP_DONE, op, 0)
            else:
                self.recv_waiting[msg] = 1
        return 0

    cdef int on_chunk_hop(self, int32_t chunk, int32_t hop) except -1:
        cdef int64_t t = self.now
        cdef int64_t ptr = self.chunk_route_lo[chunk] + hop
        cdef int32_t link = self.route_links[ptr]
        cdef int64_t nbytes = self.chunk_bytes[chunk]
        cdef int64_t start = t if t > self.link_free[link] else self.link_free[link]
        cdef int64_t ser = serialisation_ps(nbytes, self.link_rate[link])
        cdef int64_t sent = start + ser
        cdef int32_t msg
        self.link_free[link] = sent
        self.lbytes[link] += nbytes
        self.lbusy[link] += ser
        if hop == 0:
            # The sender is done with a chunk once its last byte left the first link.
            msg = self.chunk_msg[chunk]
            if sent > self.msg_send_end[msg]:
                self.msg_send_end[msg] = sent
            self.msg_send_left[msg] -= 1
            if self.msg_send_left[msg] == 0:
                self.push(self.msg_send_end[msg], EV_OP_DONE, self.msg_send_op[msg], 0)
        if ptr + 1 < self.chunk_route_hi[chunk]:
            self.push(sent + self.link_lat[link], EV_CHUNK_HOP, chunk, hop + 1)
        else:
            self.push(sent + self.link_lat[link], EV_CHUNK_ARRIVE, chunk, 0)
        return 0

    cdef int on_chunk_arrive(self, int32_t chunk) except -1:
        cdef int32_t msg = self.chunk_msg[chunk]
        self.msg_arrive_left[msg] -= 1
        if self.msg_arrive_left[msg] == 0:
            self.msg_delivered[msg] = self.now
            if self.recv_waiting[msg]:
                self.recv_waiting[msg] = 0
                self.push(self.now, EV_OP_DONE, self.msg_recv_op[msg], 0)
        return 0

    cdef int on_op_done(self, int32_t op) except -1:
        cdef int64_t s
        cdef int32_t nxt
        self.op_end[op] = self.now
        self.ops_done += 1
        for s in range(self.succ_ptr[op], self.succ_ptr[op + 1]):
            nxt = self.succ_idx[s]
            self.pending_deps[nxt] -= 1
            if self.pending_deps[nxt] == 0:
                self.push(self.now, EV_OP_READY, nxt, 0)
        return 0

    # -- the loop ------------------------------------------------------------------------
    def run(self, int64_t max_events=-1):
        """Process events until none remain or max_events were handled in this call.

        Returns True when the queue is empty (the run is over: check ``ops_done``).
        """
        cdef Event ev
        cdef int64_t budget = max_events
        while (self.heap_len > 0 or self.fifo_len > 0) and budget != 0:
            ev = self.next_event()
            self.now = ev.time
            self.events += 1
            if budget > 0:
                budget -= 1
            if ev.kind == EV_CHUNK_HOP:
                self.on_chunk_hop(ev.a, ev.b)
            elif ev.kind == EV_OP_DONE:
                self.on_op_done(ev.a)
            elif ev.kind == EV_OP_READY:
                self.on_op_ready(ev.a)
            else:
                self.on_chunk_arrive(ev.a)
        return self.heap_len == 0 and self.fifo_len == 0

    @property
    def pending(self):
        return self.heap_len + self.fifo_len
