# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The discrete-event kernel: ops, and the packet-level Unified Bus model, in one C loop.

Events are ordered by (time, sequence); the sequence number is the order in which events were
scheduled, so ties break first-scheduled-first and every run is deterministic. Handlers are C
methods named after the hardware action they model; nothing calls Python per event.
``cmemu._core.reference`` is the same model in pure Python; tests check both agree exactly.

Ops (see docs/model.md): an op is ready when its dependencies have ended. COMP runs for its
precomputed duration; MEM_* queue FIFO on their die's HBM server; COMM_SEND starts its write
messages at their source after the initiator's start-up and ends when all are acknowledged;
COMM_RECV ends when all its messages have been delivered (a read message is started by its
receive). Delivery and acknowledgement times are computed when the last packet is absorbed, so
neither is an event of its own: the op's end is scheduled at the latest of them.

Packets: an initiator cuts a message into packets of at most the MTU, issues one every
``issue`` picoseconds while it has fewer than ``max_outstanding`` unacknowledged, and sprays them
over the sub-planes and L2 chips (or hashes each message onto one path). Every link has a virtual
output queue per (input slot, virtual lane) at its sending end and credits for the receiver's
buffer per lane: a packet is sent when the link is idle and the receiver has room for it, chosen
round robin among the non-empty queues, serialised at line rate in whole flits and received one
link latency later. A credit returns the moment the packet leaves that buffer. At its
destination a write is absorbed (at the sink rate, if the endpoint has one) and acknowledged;
the ack's trip back is computed, not simulated, since acks are small and go the other way. A read
request is answered after the target's memory latency by a response carrying the data on VL1.

Message-level fabric (``fabric.message_lookahead_ps`` > 0, ``cmemu run --fabric message``): a
write packet has its whole path reserved when it is issued (``path_reserve``): on each link the
first idle stretch at or after its arrival that holds it, from a calendar of reserved intervals
per link (``cal_reserve``; a CPU's sink has one too); no credits, and no event of its own. Reads
stay packets, and take a link in its idle stretches of the same calendar (``try_transmit``).

Events: ``on_op_ready``, ``on_op_done``, ``on_link_free`` (only when a
packet waits for a busy link, or for its issue time at its source), ``on_packet_arrive`` (one per
packet per hop), ``on_sink_done``, ``on_response_inject``, ``on_wake``.
"""
cimport cython
from libc.stdlib cimport malloc, calloc, realloc, free, qsort
from libc.string cimport memcpy, memmove, memset
from libc.stdint cimport int64_t, int32_t, uint8_t, uint16_t, uint32_t, uint64_t, INT32_MAX, INT64_MAX, UINT32_MAX

import numpy as np
cimport numpy as cnp

from cmemu.errors import DieFailedError, SimulationError, UnroutableError
from cmemu._core import hbm_sharing, op_message_lists
from cmemu.lower.comm import MSG_COLUMNS

cnp.import_array()

cdef extern from *:
    """
    typedef __int128 cm_int128;
    static inline int cm_ctz64(unsigned long long x) { return __builtin_ctzll(x); }
    static inline void cm_prefetch(const void* p) { __builtin_prefetch(p, 1, 3); }
    """
    ctypedef long long cm_int128
    int cm_ctz64(unsigned long long x) noexcept nogil
    void cm_prefetch(const void* p) noexcept nogil

# The codes of op kinds, paths, packets, messages and load balancing: cmemu/vocab.py's.
from cmemu._core.vocab cimport (
    LB_HASH, LB_SPRAY, MSG_ATOMIC, MSG_READ, MSG_WRITE, OP_KIND_COMP, OP_KIND_MEM, OP_KIND_RECV, OP_KIND_SEND,
    PATH_D2D, PATH_RDMA, PATH_UB, PATH_VPC, PKT_ACK, PKT_READ_REQ, PKT_READ_RESP, PKT_WRITE,
)

# Virtual lanes per link (cmemu.fabric.NUM_VLS; tests/test_vocab.py checks it).
cdef enum:
    NUM_VLS = 2

# Event types. Ties at equal time break by sequence number, not by type.
cdef enum:
    EV_OP_READY = 0
    EV_OP_DONE = 1
    EV_LINK_FREE = 2
    EV_PKT_ARRIVE = 3
    EV_SINK_DONE = 4
    EV_RESP_INJECT = 5
    EV_WAKE = 6  # an initiator whose window was full may issue again
    EV_FAIL = 7
    EV_RETRANSMIT = 8
    EV_HBM_DONE = 9  # the row (hr) of a die's HBM share that finishes first (if still so)
    EV_TAIL = 10  # (not queued: the tails' own queue, run_tails; counted under this kind)

# Ports an endpoint's writes may be held at by the horizon at once (held_writes): its UB ports,
# its die-to-die, RDMA and VPC links; more are looked after by the ports' own wake-ups.
cdef enum:
    HELD_PORTS = 16
# How far from the end of an initiator's sorted acks a new one is looked for in turn (ack_push);
# further back, by halving.
cdef enum:
    ACK_NEAR = 16
cdef int64_t PS_PER_S = 1000000000000
cdef int64_t RATE_64 = 1000000000000000  # 10**15 B/s
# Units of a die's HBM share clock (see hbm_change): 1/HBM_SCALE ps of capacity-time.
cdef int64_t HBM_SCALE = 1024
cdef int64_t HBM_REBASE = 1 << 61
cdef uint64_t PATH_HASH_MULT = 0x9E3779B1  # cmemu.fabric.PATH_HASH_MULT

cdef struct Event:
    int64_t time
    int64_t seq
    int32_t kind
    int32_t a

cdef struct OpInfo:
    # Everything the loop touches per op, in one 64-byte line (ops are visited in no
    # particular order, so one line per op instead of one per array).
    int64_t dur
    int64_t start
    int64_t end
    int64_t succ_lo
    int32_t succ_n
    int32_t pending
    int32_t die
    int32_t qnext     # the next op waiting for cores on its die (-1: none)
    # By kind: a SEND / RECV's messages still awaited; the row of an op that shares its die's
    # HBM in the hbm_* arrays; a MEM op's server (res) otherwise.
    int32_t u
    uint8_t aic
    uint8_t aiv
    uint8_t kind
    uint8_t hbm       # it shares its die's HBM (row u)
    int64_t tmax      # a SEND / RECV: the latest ack / delivery time among its messages so far

cdef extern from "<stdlib.h>":
    int posix_memalign(void** memptr, size_t alignment, size_t size) nogil


cdef struct HbmRow:
    # An op that shares its die's HBM (see Engine.hbm_change): what a change of the share walks,
    # in one place.
    int64_t rate      # its demand, bytes/s
    int64_t at        # uncapped: when it ends at full speed; capped: the share clock's value then
    int64_t end       # the time its end was last scheduled for
    int32_t next      # the die's running rows, by (demand, row)
    int32_t prev
    int32_t op


cdef struct LinkInfo:
    # The first 64 bytes are what every transmission touches on either fabric: its timing, its
    # counters, and the calendar the message-level fabric reserves in (one line per hop there).
    int64_t busy_until
    int64_t rate
    int64_t lat
    int64_t bytes
    int64_t busy
    int64_t cur_bin   # the first of its open time bins (count_transmission), -1: none
    # The busy intervals message-level packets reserved: (start, end) pairs, sorted and disjoint,
    # cal[0: 2 * cal_n]; those that ended by now are dropped when it is full (see cal_reserve).
    int64_t* cal
    int32_t cal_n
    int32_t cal_cap   # int64s allocated
    # The packet fabric's queues and wake-ups.
    int64_t voq_base
    int64_t mask_base
    int64_t free_at   # the earliest pending on_link_free (-1: none)
    int32_t queued
    int32_t rr
    int32_t in_slot
    int32_t voq_slots
    uint8_t alive
    uint8_t own_queue  # its far end keeps a queue per input link (fabric.link_own_queue)
    uint8_t pad[2]
    # Message-level fabric with back-pressure ("message-bp"): the bytes the link's receive buffer
    # (per lane, at its far end) holds over time, from the packets reserved through it: (time,
    # bytes from then on) pairs, sorted by time, buf[0: 2 * buf_n]; none before the first (see
    # buf_hold). buf_limit: its credits (fabric.link_credit_byte); 0: not bounded (not a UB link, or
    # credits of 4 GiB or more, which no run fills).
    uint32_t buf_limit
    int32_t buf_n
    int32_t buf_cap   # int64s allocated
    int64_t* buf
    # The packet fabric: the die at the far end if a write's arrival there is worked out when it
    # starts on the link (fabric.direct_sinks), else -1.
    int32_t sink_ep


cdef struct Packet:
    # (What try_transmit's scan of a link's VOQs reads of each head, ready to next, comes first,
    # within 24 bytes: most packets then have it in one cache line.)
    int64_t ready     # not before this time may it leave its source (the initiator's issue rate)
    uint8_t leg       # 0: request / write data, 1: read response
    uint8_t ptype
    uint8_t vl
    uint8_t plane
    int32_t wire
    int32_t next
    int32_t msg
    int32_t payload
    int32_t link      # the link it is on or queued for
    int32_t in_link   # the link whose receive buffer holds it (-1 at its source)
    int32_t hop
    int32_t seq
    int32_t uplink
    int32_t iseq      # an AIV initiator's message number (aiv_done)


cdef struct PacketRecord:
    # One transmission of a packet on a link (record_packets): for --detail packets.
    int64_t start
    int64_t end       # its tail left the link's sender (start + serialisation)
    int32_t msg
    int32_t seq
    int32_t link
    int32_t wire
    uint8_t ptype
    uint8_t pad[7]


cdef struct Ini:
    # An initiator (an endpoint's own, or an AIV's), in two 64-byte lines: thousands of AIVs
    # issue messages in no particular order, so one place per initiator instead of an array per
    # field. First, its queue of messages to issue, in the order they started: runs of
    # consecutive entries of op_midx (the messages of one op, started together), (lo, hi) pairs in
    # a ring of ``cap`` runs from ``head``; ``seq`` packets of the first message are issued.
    # ``m_head``, ``row`` and ``shift``: that first message, its table row and op shift, set as
    # it becomes the first (head_ahead), while the lines of the one before are still in cache:
    # looked up when it is issued, microseconds later, they were a chain of four cache misses
    # (the ring, op_midx, mseg, the table). Set as its first packet is issued: ``npk``,
    # its packets; ``wire``, the wire bytes of a packet of ``wpay`` payload bytes (its full
    # ones); ``plane`` and ``uplink``, its next packet's path while no link is down (choose_path).
    int64_t* buf
    int64_t row
    int64_t issue_free   # when it may issue its next packet
    int64_t base         # an AIV: when its last FLOW_BASE message was issued (aiv_ready)
    int64_t wake_at      # its pending wake-up (INT64_MAX: none)
    int64_t startup      # its start-up, ps (fabric.ep_startup_ps)
    int32_t iseq         # an AIV: the messages it issued
    int32_t wait         # an AIV: the message it waits to see complete (-1: none)
    int32_t ack_len      # its packets' acks in flight (ack_heap)
    int32_t outstanding  # its packets in flight (its window)
    int32_t head
    int32_t n
    int32_t cap
    int32_t seq
    int32_t npk
    int32_t shift
    int32_t wire
    int32_t wpay
    int32_t plane
    int32_t uplink
    int32_t max_out      # its window, packets (fabric.ep_max_outstanding)
    int32_t issue[2]     # a packet's issue time, ps: a write's, a read's (fabric.ep_issue_ps)
    int32_t msg_startup[2]  # an AIV's MTE instruction's start-up, ps: likewise (fabric.ini_msg_startup_ps)
    int32_t m_head       # the first message of its queue (while n > 0; head_ahead)


cdef struct RingSlot:
    # One of an AIV's last AIV_RING messages: its completion time so far (its latest ack, or
    # read data back), and its packets not yet complete.
    int64_t t
    int32_t left
    int32_t pad


cdef struct SeriesRow:
    # One closed time bin of a link's counters (series_row); bins are int32 in /links/binned.
    # 16 bytes: counts above 2**32 - 1 take several rows of the bin, which link_series sums.
    int32_t link
    int32_t bin
    uint32_t nbytes
    uint32_t busy


cdef struct MsgRow:
    # One row of the messages' table (Engine.message_table), in one 32-byte piece: a message's
    # fields are read together, and an AIV's messages at random among thousands of others, so
    # one line per message instead of one per column.
    int64_t nbytes
    int32_t send      # its send op (-1: none), before its segment's shift
    int32_t recv      # its receive op (-1: none), likewise
    int32_t prep      # an AIV's work before it, ps (cmemu.lower.comm)
    uint16_t src      # endpoints (cmemu.lower.comm: 16-bit ids)
    uint16_t dst
    uint16_t ini      # the initiator that issues it (an endpoint, or an AIV)
    uint8_t kind
    uint8_t path
    uint8_t flow      # which earlier message of its AIV it waits for (FLOW_AFTER_MASK, FLOW_BASE)
    uint8_t pad[3]


cdef struct Seg:
    # A run of messages that are a template's (cmemu.lower.Lowered.msg_segments).
    int64_t lo      # its first message
    int64_t row     # the table's row of its first message
    int32_t shift   # added to its messages' send/recv ops (those >= 0)
    int32_t pad

cdef struct Bucket:
    Event* ev
    int64_t n
    int64_t cap

# The timing wheel: 2**WHEEL_BITS buckets of 2**BUCKET_BITS ps (16.4 ns each; 268 us in all).
cdef enum:
    BUCKET_BITS = 14
    WHEEL_BITS = 14
    WHEEL_SIZE = 1 << 14
    WHEEL_MASK = (1 << 14) - 1
    WHEEL_KEEP = 64  # events a drained bucket keeps room for
    SPARE_MAX = 64  # the larger rooms (up to SPARE_CAP events) kept for the next buckets that fill
    SPARE_CAP = 4096
    SORT_SMALL = 16  # a bucket of at most this many events is sorted by insertion, not radix
    SORT_TMP_KEEP = 1 << 16  # events the radix sort's scratch keeps room for
    PREFETCH_OP = 16  # how far ahead in the sorted list an op end's line is asked for
    PREFETCH_SUCC = 8  # and its first successor's
    RING = 16  # time bins a link's counters keep open
    AIV_RING = 32  # cmemu.fabric.AIV_MESSAGES_IN_FLIGHT
    FLOW_AFTER_MASK = 0x07  # cmemu.lower.comm
    FLOW_BASE = 0x10


cdef int ev_cmp(const void* a, const void* b) noexcept nogil:
    cdef const Event* x = <const Event*>a
    cdef const Event* y = <const Event*>b
    if x.time != y.time:
        return -1 if x.time < y.time else 1
    if x.seq != y.seq:
        return -1 if x.seq < y.seq else 1
    return 0


cdef inline bint ev_less(Event* x, Event* y) noexcept nogil:
    if x.time != y.time:
        return x.time < y.time
    return x.seq < y.seq


cdef inline int64_t serialisation_ps(int64_t nbytes, int64_t rate_byte_per_s) noexcept nogil:
    """Time to put nbytes on a link of the given rate, rounded up to a whole picosecond."""
    cdef cm_int128 num
    if nbytes < 4000000 and rate_byte_per_s < RATE_64:  # nbytes x 10**12 + rate fits in 64 bits
        return (nbytes * PS_PER_S + rate_byte_per_s - 1) // rate_byte_per_s
    num = <cm_int128>nbytes * PS_PER_S + rate_byte_per_s - 1
    return <int64_t>(num / rate_byte_per_s)


def serialisation_time_ps(nbytes, rate_byte_per_s):
    """Python access to the kernel's serialisation rule (used by the reference and tests)."""
    return serialisation_ps(nbytes, rate_byte_per_s)


@cython.final
cdef class Engine:
    """Replays lowered arrays (``cmemu.lower.Lowered``) on a fabric (``cmemu.fabric``)."""

    # Events: a FIFO for the current time, a sorted list for the current wheel bucket, the
    # timing wheel for the next 268 us, and a 4-ary heap beyond it (see `push`).
    cdef Event* heap
    cdef int64_t heap_len, heap_cap, seq
    cdef Event* fifo
    cdef int64_t fifo_head, fifo_len, fifo_cap
    cdef Bucket* wheel
    cdef Event* spare_ev[SPARE_MAX]  # rooms of drained buckets, for the next to fill (bucket_grow)
    cdef int64_t spare_cap[SPARE_MAX]
    cdef int spare_n
    cdef int64_t wheel_count, cur
    cdef Event* act
    cdef int64_t act_head, act_len, act_cap
    cdef Event* sort_tmp  # the bucket sort's scratch (sort_tmp_cap events)
    cdef int64_t sort_tmp_cap
    cdef readonly int64_t now, events, n_ops, ops_done, max_pending, packets_sent, packets_live
    cdef readonly bint past_event, released
    cdef int64_t kind_count[16]
    # Ops.
    cdef OpInfo* ops
    cdef const int64_t[::1] op_lat_ps
    cdef const int32_t[::1] succ_idx
    cdef const int64_t[::1] op_mptr   # messages of a SEND/RECV op: op_midx[op_mptr[op]:op_mptr[op+1]]
    cdef const int32_t[::1] op_midx
    # HBM shared by the running ops of a die (see hbm_change): a demand-capped max-min share. The
    # die's running ops, lightest first, each get their demand while it fits in an even share of
    # what the lighter ones leave; the others (capped) each get level = hbm_num / hbm_den bytes/s
    # and run at level / demand of their speed.
    cdef const int64_t[::1] hbm_cap    # per die, bytes/s (0: not shared)
    cdef int64_t[::1] hbm_sum          # per die, demand of its running ops, bytes/s
    cdef int32_t[::1] hbm_n            # per die, its running ops
    cdef int64_t[::1] hbm_num          # per die, bytes/s its capped ops share (hbm_den of them;
    cdef int64_t[::1] hbm_den          # 0: the demands fit, every op runs at full speed)
    cdef int64_t[::1] hbm_k            # per die, its share clock at hbm_t (1/HBM_SCALE ps of capacity-time)
    cdef int64_t[::1] hbm_t
    cdef int64_t[::1] hbm_last_num     # per die, the share of its last record (0, 0 before any)
    cdef int64_t[::1] hbm_last_den
    cdef int32_t[::1] hbm_first        # per die, its running rows, by (demand, row) (a list through hr.next)
    cdef int32_t[::1] hbm_next_op      # per die, the row whose end is scheduled
    cdef HbmRow* hr                    # per op that takes part, a row each, in op order (OpInfo.u)
    cdef int64_t n_hrows
    cdef int64_t* hrec                 # (die, time, hbm_num, hbm_den) after every change of a share
    cdef int64_t hrec_len, hrec_cap
    cdef int64_t[::1] res_free
    # Cores: an op holds op_aic AIC and op_aiv AIV cores of its die while it runs; ops that do
    # not fit wait in their die's FIFO.
    cdef int32_t[::1] free_aic
    cdef int32_t[::1] free_aiv
    cdef int32_t[::1] core_qhead
    cdef int32_t[::1] core_qtail
    # Messages.
    # Their fields live in a table that holds a collective's messages once however often it is
    # placed (Lowered.msg_segments): message m is row m - lo + row of its segment mseg[m], its
    # ops shifted by the segment's shift (m_src() ... m_recv_op()). Without segments, the table
    # is the lowering's own columns, in one segment.
    cdef MsgRow* mt  # the table's rows (n_rows of them)
    cdef int64_t n_rows
    cdef const uint16_t[::1] mseg
    cdef Seg* segs
    cdef int64_t n_msgs
    cdef readonly bint owns_messages  # its table is a copy: the lowering's columns can go
    cdef readonly int64_t packets_total
    cdef object row_packets, seg_rows  # packets of each table row, the segments (lo, row, shift)
    cdef int32_t[::1] msg_left        # packets not yet delivered (and, for a write, acknowledged)
    cdef readonly cnp.ndarray msg_delivered_ps
    # When a message was delivered (its last packet in memory), kept for the first n_record
    # messages only (record_deliveries); on the message-level fabric, the latest of its packets'
    # so far until msg_left is 0. A receive needs no per-message time: it keeps the latest of its
    # messages' packets itself (OpInfo.tmax), from before it starts on (deliver).
    cdef int64_t[::1] msg_delivered
    cdef int64_t n_record
    cdef readonly int64_t messages_delivered
    # Endpoints.
    cdef const int64_t[::1] ep_write_lat
    cdef const int64_t[::1] ep_read_lat
    cdef const int64_t[::1] ep_sink_rate
    cdef const int64_t[::1] ep_read_rate
    cdef const int32_t[::1] ep_node
    cdef Ini* ini  # per initiator, its state and the messages it has to issue
    cdef int64_t n_eps  # endpoints (dies, CPUs); initiators are those and then every die's AIVs
    cdef int64_t n_ini
    # AIV initiators (those from n_eps on): an AIV issues its remote reads and writes one by
    # one, as its kernel's waits allow (aiv_ready; Ini.iseq, Ini.base, Ini.wait), and keeps its
    # last AIV_RING messages' completion in a ring (ring_slot, AIV_RING per AIV).
    cdef RingSlot* ring_slot
    cdef int32_t[::1] held_port  # per endpoint, HELD_PORTS ports holding its writes (held_writes)
    cdef int32_t[::1] held_n
    cdef int32_t[::1] held_count  # per endpoint, its writes held (their acks are past the look-ahead)
    cdef int64_t[::1] ep_sink_free
    cdef int64_t[::1] ep_read_free
    # Per initiator, the times its writes' acks come back: a window slot frees at each, but
    # nothing needs to happen then unless the window is full (then one wake-up). Sorted, in
    # ack_heap[ep][ack_lo[ep]:] (Ini.ack_len of them): on the packet fabric they come back
    # roughly in the order they left, so a new one goes in near the end (ack_push) and the first
    # is taken off the front.
    cdef int64_t** ack_heap
    cdef int64_t* ack_cap
    cdef int64_t* ack_lo
    # Packet format.
    cdef const int64_t[::1] path_mtu
    cdef const int64_t[::1] path_flit
    cdef const int64_t[::1] path_header
    # Links.
    # Failures during the run: at fail_time[k], links fail_links[fail_ptr[k]:fail_ptr[k+1]] and
    # die fail_die[k] (or none, -1) go down; lost packets are sent again after rto_ps.
    cdef const int64_t[::1] fail_time
    cdef const int64_t[::1] fail_ptr
    cdef const int32_t[::1] fail_links
    cdef const int32_t[::1] fail_die
    cdef uint8_t[::1] die_failed
    cdef int64_t rto_ps
    cdef bint links_down  # whether any link is down (else every path is alive)
    cdef readonly int64_t packets_lost
    cdef int64_t[::1] credits
    cdef int32_t[::1] voq_head
    cdef int32_t[::1] voq_tail
    cdef uint64_t[::1] voq_mask   # per link, one bit per VOQ that holds packets
    cdef LinkInfo* lk  # per link, what a transmission reads and writes
    cdef LinkInfo* sk  # per endpoint with a sink rate, the sink's calendar (message-level fabric)
    cdef bint backpressure  # "message-bp": receive buffers bounded (buf_hold)
    cdef int64_t n_links
    cdef int64_t[::1] link_ack      # an ack's serialisation and latency on the link (ack_trip)
    cdef uint8_t[::1] link_ack_path  # the path it was worked out for, plus one (0: not yet)
    # An endpoint's port links on a plane (ep_up, ep_down) have one rate, and the same difference
    # of latencies as every other endpoint's (the switch's traversal on the way down), and every
    # L1-L2 link (l1_uplink, l2_down) one rate and latency: a UB ack's way back then takes what
    # its packet's way there would (path_reserve sums it as it goes).
    cdef bint ub_mirror
    # Routing tables.
    cdef const int32_t[::1] t_ep_up
    cdef const int32_t[::1] t_ep_down
    cdef const int32_t[::1] t_l1_uplink
    cdef const int32_t[::1] t_l1_uplink_chip
    cdef const int32_t[::1] t_l2_down
    cdef const int32_t[::1] t_l2_down_count
    cdef const int32_t[::1] t_d2d
    cdef const int32_t[::1] t_rdma_up
    cdef const int32_t[::1] t_rdma_down
    cdef const int32_t[::1] t_vpc_host_up
    cdef const int32_t[::1] t_vpc_host_down
    cdef const int32_t[::1] t_vpc_dpu_up
    cdef const int32_t[::1] t_vpc_dpu_down
    cdef int P, U, C, M, N, lb
    # choose_path with links down: the live paths of message live_m (in path order), live_n of them.
    cdef int32_t* live
    cdef int64_t live_m
    cdef int32_t live_n
    # Packet pool.
    cdef Packet* pkts
    cdef int32_t pkt_cap, pkt_free
    # Binned link counters (sparse: one row per link and bin with traffic).
    cdef int64_t bin_ps
    cdef int64_t bin_now, bin_start  # the bin of now and its start (bin_of), kept by run
    cdef SeriesRow* series
    cdef int64_t* ring  # per link, RING open bins of (bytes, busy_ps)
    cdef int64_t series_len, series_cap
    # Per-transmission records (only when asked for: record_packets).
    cdef PacketRecord* recs
    cdef int64_t recs_len, recs_cap
    cdef readonly bint record_packets
    # Message-level fabric: a write packet reserves its whole path when it is issued
    # (path_reserve); an initiator with a full window issues in one event the packets whose slots
    # free within ``lookahead`` ps (inject). 0: packet level.
    cdef int64_t lookahead
    cdef int64_t aiv_lookahead  # the same for an AIV's writes (cmemu.fabric.FABRIC_MODELS)
    # Message-bp: the tails of AIV writes across nodes (their hops after the first) waiting to be
    # reserved (aiv_write, run_tails): a ring of (due time, first and last packet of a chain),
    # in due order.
    cdef int64_t* tq_due
    cdef int32_t* tq_chain
    cdef int32_t* tq_last
    cdef int64_t tq_head, tq_len, tq_cap
    cdef int64_t ser_wire, ser_rate, ser_ps  # the last serialisation path_reserve worked out
    cdef int64_t ack_rate, ack_path, ack_ps  # and the last ack's

    def __cinit__(self):
        self.lk = NULL
        self.ops = NULL
        self.ack_heap = NULL
        self.ini = NULL
        self.ring_slot = NULL
        self.ack_rate = -1
        self.ack_cap = NULL
        self.ack_lo = NULL
        self.heap = NULL
        self.fifo = NULL
        self.wheel = NULL
        self.act = NULL
        self.sort_tmp = NULL
        self.sort_tmp_cap = 0
        self.pkts = NULL
        self.series = NULL
        self.recs = NULL
        self.recs_len = 0
        self.recs_cap = 0
        self.hrec = NULL
        self.hrec_len = 0
        self.hrec_cap = 0
        self.hr = NULL
        self.n_hrows = 0
        self.segs = NULL
        self.mt = NULL
        self.n_rows = 0
        self.live = NULL
        self.live_m = -1

    def __init__(self, lowered, fabric, int64_t bin_ps=0, bint record_packets=False, int64_t record_deliveries=-1,
                 bint drop_inputs=False):
        """``drop_inputs``: as soon as the engine has its own copy, cut the lowering's columns
        it no longer needs (``Lowered.drop_engine_messages`` when the messages' table is a copy,
        then ``Lowered.drop_engine_inputs``): a big run's peak is lower by the gigabytes they
        hold. run_trace asks for it."""
        cdef int64_t i
        L, F = lowered, fabric
        self.n_ops = L.op_kind.shape[0]
        if L.op_aic.size and (L.op_aic.max() > 255 or L.op_aiv.max() > 255):
            raise ValueError("an op holds more than 255 cores of one kind")
        # The messages first: once they are in the engine, the lowering's may go, before the ops.
        self.op_mptr, self.op_midx = op_message_lists(L)
        n_msgs = L.msg_src.shape[0]
        self.n_msgs = n_msgs
        self.path_mtu = F.path_mtu_byte
        self.message_table(L)
        self.n_record = n_msgs if record_deliveries < 0 else min(record_deliveries, n_msgs)
        self.msg_delivered_ps = np.full(self.n_record, -1, dtype=np.int64)
        self.msg_delivered = self.msg_delivered_ps
        self.messages_delivered = 0
        if drop_inputs and self.owns_messages:
            L.drop_engine_messages()
        cdef void* mem = NULL
        if posix_memalign(&mem, 64, max(self.n_ops, 1) * sizeof(OpInfo)) != 0:
            raise MemoryError("op table")
        self.ops = <OpInfo*>mem
        cdef const uint8_t[::1] kind = L.op_kind
        cdef const int64_t[::1] dur = L.op_dur_ps
        cdef const int32_t[::1] res = L.op_res
        cdef const int64_t[::1] succ_ptr = L.succ_ptr
        cdef const int32_t[::1] npred = L.op_npred
        cdef const int32_t[::1] aic = L.op_aic
        cdef const int32_t[::1] aiv = L.op_aiv
        cdef const int32_t[::1] die = L.op_rank
        for i in range(self.n_ops):
            self.ops[i].dur = dur[i]
            self.ops[i].start = -1
            self.ops[i].end = -1
            self.ops[i].succ_lo = succ_ptr[i]
            self.ops[i].succ_n = <int32_t>(succ_ptr[i + 1] - succ_ptr[i])
            self.ops[i].pending = npred[i]
            # A RECV counts its messages delivered before it starts in u (see deliver).
            self.ops[i].u = 0 if kind[i] == OP_KIND_RECV else res[i]
            self.ops[i].qnext = -1
            self.ops[i].tmax = 0
            self.ops[i].hbm = 0
            self.ops[i].die = die[i]
            self.ops[i].aic = <uint8_t>aic[i]
            self.ops[i].aiv = <uint8_t>aiv[i]
            self.ops[i].kind = kind[i]
        self.op_lat_ps = L.op_lat_ps
        self.succ_idx = L.succ_idx
        self.hbm_cap, op_rate = hbm_sharing(L)
        h_op = np.flatnonzero(op_rate > 0).astype(np.int32)
        self.n_hrows = h_op.shape[0]
        self.hr = <HbmRow*>calloc(max(self.n_hrows, 1), sizeof(HbmRow))
        if self.hr == NULL:
            raise MemoryError("HBM sharing rows")
        cdef const int32_t[::1] hop = h_op
        cdef const int64_t[::1] hrate = op_rate
        for i in range(self.n_hrows):
            self.hr[i].op = hop[i]
            self.hr[i].rate = hrate[hop[i]]
            self.hr[i].end = -1
            self.hr[i].next = self.hr[i].prev = -1
            self.ops[hop[i]].u = <int32_t>i
            self.ops[hop[i]].hbm = 1
        del hop, hrate, op_rate, h_op
        n_dies = L.die_aic_cores.shape[0]
        self.hbm_sum = np.zeros(n_dies, dtype=np.int64)
        self.hbm_n = np.zeros(n_dies, dtype=np.int32)
        self.hbm_k = np.zeros(n_dies, dtype=np.int64)
        self.hbm_num = np.zeros(n_dies, dtype=np.int64)
        self.hbm_den = np.zeros(n_dies, dtype=np.int64)
        self.hbm_t = np.zeros(n_dies, dtype=np.int64)
        self.hbm_last_num = np.zeros(n_dies, dtype=np.int64)
        self.hbm_last_den = np.zeros(n_dies, dtype=np.int64)
        self.hbm_first = np.full(n_dies, -1, dtype=np.int32)
        self.hbm_next_op = np.full(n_dies, -1, dtype=np.int32)
        self.res_free = np.zeros(max(L.n_resources, 1), dtype=np.int64)
        self.free_aic = L.die_aic_cores.copy()
        self.free_aiv = L.die_aiv_cores.copy()
        self.core_qhead = np.full(L.die_aic_cores.shape[0], -1, dtype=np.int32)
        self.core_qtail = np.full(L.die_aic_cores.shape[0], -1, dtype=np.int32)


        n_eps = F.ep_node.shape[0]
        n_ini = F.ep_startup_ps.shape[0]
        self.n_ini = n_ini
        self.ep_write_lat = F.ep_write_latency_ps
        self.ep_read_lat = F.ep_read_latency_ps
        self.ep_sink_rate = F.ep_sink_byte_per_s
        self.ep_read_rate = F.ep_read_byte_per_s
        self.ep_node = F.ep_node
        self.n_eps = n_eps
        tracked = np.asarray(F.ini_tracked).astype(bool)
        if not np.array_equal(tracked, np.arange(n_ini) >= n_eps):
            raise ValueError("the initiators are the endpoints' own and then AIVs (cmemu.fabric)")
        issue = np.asarray(F.ep_issue_ps, dtype=np.int64).reshape(n_ini, 2)
        msg_startup = np.asarray(F.ini_msg_startup_ps, dtype=np.int64).reshape(n_ini, 2)
        for name, value in (("a packet's issue time", issue), ("an MTE instruction's start-up", msg_startup)):
            if value.size and (value.min() < 0 or value.max() > INT32_MAX):
                raise ValueError(f"{name} must be 0 to {INT32_MAX} ps, got {value.max()} ps")
        cdef void* imem = NULL
        if posix_memalign(&imem, 64, max(n_ini, 1) * sizeof(Ini)) != 0:
            raise MemoryError("initiators")
        memset(imem, 0, max(n_ini, 1) * sizeof(Ini))
        self.ini = <Ini*>imem
        cdef const int64_t[::1] startup = F.ep_startup_ps
        cdef const int32_t[::1] max_out = F.ep_max_outstanding
        cdef const int64_t[:, ::1] issue_v = issue, msg_startup_v = msg_startup
        for i in range(n_ini):
            self.ini[i].startup = startup[i]
            self.ini[i].max_out = max_out[i]
            self.ini[i].issue[0], self.ini[i].issue[1] = <int32_t>issue_v[i, 0], <int32_t>issue_v[i, 1]
            self.ini[i].msg_startup[0] = <int32_t>msg_startup_v[i, 0]
            self.ini[i].msg_startup[1] = <int32_t>msg_startup_v[i, 1]
            self.ini[i].wait = -1
            self.ini[i].wake_at = INT64_MAX
        self.ep_sink_free = np.zeros(n_eps, dtype=np.int64)
        self.ep_read_free = np.zeros(n_eps, dtype=np.int64)
        self.ring_slot = <RingSlot*>calloc(max((n_ini - n_eps) * AIV_RING, 1), sizeof(RingSlot))
        self.held_port = np.zeros(max(n_eps, 1) * HELD_PORTS, dtype=np.int32)
        self.held_n = np.zeros(max(n_eps, 1), dtype=np.int32)
        self.held_count = np.zeros(max(n_eps, 1), dtype=np.int32)
        self.ack_heap = <int64_t**>malloc(max(n_ini, 1) * sizeof(int64_t*))
        self.ack_cap = <int64_t*>malloc(max(n_ini, 1) * sizeof(int64_t))
        self.ack_lo = <int64_t*>malloc(max(n_ini, 1) * sizeof(int64_t))
        if self.ack_heap == NULL or self.ack_cap == NULL or self.ack_lo == NULL or self.ring_slot == NULL:
            raise MemoryError("ack heaps")
        for i in range(n_ini):
            self.ack_heap[i] = NULL
            self.ack_cap[i] = 0
            self.ack_lo[i] = 0

        self.path_flit = F.path_flit_byte
        self.path_header = F.path_header_byte

        n_links = F.link_rate_byte_per_s.shape[0]
        self.n_links = n_links
        self.link_ack = np.zeros(n_links, dtype=np.int64)
        self.link_ack_path = np.zeros(n_links, dtype=np.uint8)
        self.fail_time = F.fail_time_ps
        self.fail_ptr = F.fail_ptr
        self.fail_links = F.fail_links
        self.fail_die = F.fail_die
        self.die_failed = np.zeros(F.d2d.shape[0], dtype=np.uint8)
        self.rto_ps = F.retransmit_timeout_ps
        self.links_down = bool(np.any(np.asarray(F.link_alive) == 0))
        self.packets_lost = 0
        self.credits = np.repeat(F.link_credit_byte, NUM_VLS).astype(np.int64)
        self.voq_head = np.full(F.num_voqs, -1, dtype=np.int32)
        self.voq_tail = np.full(F.num_voqs, -1, dtype=np.int32)
        words = (np.asarray(F.link_voq_slots, dtype=np.int64) * NUM_VLS + 63) // 64
        mask_base = (np.cumsum(words) - words).astype(np.int64)
        self.voq_mask = np.zeros(int(words.sum()), dtype=np.uint64)
        cdef void* lmem = NULL
        if posix_memalign(&lmem, 64, max(n_links, 1) * sizeof(LinkInfo)) != 0:
            raise MemoryError("link table")
        self.lk = <LinkInfo*>lmem
        memset(lmem, 0, max(n_links, 1) * sizeof(LinkInfo))
        self.sk = <LinkInfo*>calloc(max(F.ep_node.shape[0], 1), sizeof(LinkInfo))
        if self.sk == NULL:
            raise MemoryError("sink calendars")
        cdef const int64_t[::1] rate = F.link_rate_byte_per_s
        cdef const int64_t[::1] lat = F.link_latency_ps
        cdef const int32_t[::1] in_slot = F.link_in_slot
        cdef const int64_t[::1] vbase = F.link_voq_base
        cdef const int32_t[::1] vslots = F.link_voq_slots
        cdef const int64_t[::1] mbase = mask_base
        cdef const uint8_t[::1] alive = F.link_alive
        cdef const uint8_t[::1] own_queue = F.link_own_queue
        for i in range(n_links):
            self.lk[i].busy_until = 0
            self.lk[i].rate = rate[i]
            self.lk[i].lat = lat[i]
            self.lk[i].voq_base = vbase[i]
            self.lk[i].mask_base = mbase[i]
            self.lk[i].queued = 0
            self.lk[i].rr = 0
            self.lk[i].in_slot = in_slot[i]
            self.lk[i].voq_slots = vslots[i]
            self.lk[i].free_at = -1
            self.lk[i].cal = NULL
            self.lk[i].cal_n = 0
            self.lk[i].cal_cap = 0
            self.lk[i].alive = alive[i]
            self.lk[i].own_queue = own_queue[i]
            self.lk[i].bytes = 0
            self.lk[i].busy = 0
            self.lk[i].cur_bin = -1

        rate_a, lat_a = np.asarray(F.link_rate_byte_per_s), np.asarray(F.link_latency_ps)
        up, down = np.asarray(F.ep_up).ravel().astype(np.int64), np.asarray(F.ep_down).ravel().astype(np.int64)
        both = (up >= 0) & (down >= 0)
        mid = np.concatenate([np.asarray(F.l1_uplink).ravel(), np.asarray(F.l2_down).ravel()]).astype(np.int64)
        mid = mid[mid >= 0]
        self.ub_mirror = bool(up.shape == down.shape and np.array_equal(both, (up >= 0) | (down >= 0))
                              and np.array_equal(rate_a[up[both]], rate_a[down[both]])
                              and np.unique(lat_a[up[both]] - lat_a[down[both]]).size <= 1
                              and np.unique(rate_a[mid]).size <= 1 and np.unique(lat_a[mid]).size <= 1)
        self.t_ep_up = F.ep_up
        self.t_ep_down = F.ep_down
        self.t_l1_uplink = F.l1_uplink
        self.t_l1_uplink_chip = F.l1_uplink_chip
        self.t_l2_down = F.l2_down
        self.t_l2_down_count = F.l2_down_count
        self.t_d2d = F.d2d
        self.t_rdma_up = F.rdma_up
        self.t_rdma_down = F.rdma_down
        self.t_vpc_host_up = F.vpc_host_up
        self.t_vpc_host_down = F.vpc_host_down
        self.t_vpc_dpu_up = F.vpc_dpu_up
        self.t_vpc_dpu_down = F.vpc_dpu_down
        self.P = F.planes
        self.U = F.uplinks
        self.C = F.l2_chips
        self.M = F.l2_mult
        self.N = F.num_nodes
        self.lb = F.load_balancing

        self.lookahead = getattr(F, "message_lookahead_ps", 0)
        self.aiv_lookahead = getattr(F, "aiv_lookahead_ps", self.lookahead)

        if self.lookahead > 0 and F.fail_time_ps.shape[0] > 0:
            raise ValueError("the message-level fabric does not model failures during a run")
        cdef const int64_t[::1] credit = F.link_credit_byte
        self.backpressure = self.lookahead > 0 and getattr(F, "message_backpressure", False)
        for i in range(n_links):
            self.lk[i].buf_limit = <uint32_t>credit[i] if self.backpressure and credit[i] < UINT32_MAX else 0
        cdef const int32_t[::1] sink_ep = F.direct_sinks()
        for i in range(n_links):
            self.lk[i].sink_ep = sink_ep[i]
        self.bin_ps = bin_ps
        self.bin_now = 0
        self.bin_start = 0
        self.series_len = 0
        self.series_cap = 1024
        self.series = <SeriesRow*>malloc(self.series_cap * sizeof(SeriesRow))
        self.ring = <int64_t*>calloc(max(n_links, 1) * RING * 2 if bin_ps > 0 else 1, sizeof(int64_t))
        self.record_packets = record_packets

        self.pkt_cap = 1024
        self.pkts = <Packet*>malloc(self.pkt_cap * sizeof(Packet))
        for i in range(self.pkt_cap):
            self.pkts[i].next = <int32_t>(i + 1) if i + 1 < self.pkt_cap else -1
        self.pkt_free = 0
        self.packets_sent = 0
        self.packets_live = 0

        self.heap_cap = 1024
        self.heap = <Event*>malloc(self.heap_cap * sizeof(Event))
        self.fifo_cap = 1024
        self.fifo = <Event*>malloc(self.fifo_cap * sizeof(Event))
        self.wheel = <Bucket*>malloc(WHEEL_SIZE * sizeof(Bucket))
        self.act_cap = 1024
        self.act = <Event*>malloc(self.act_cap * sizeof(Event))
        if (self.heap == NULL or self.fifo == NULL or self.pkts == NULL or self.series == NULL
                or self.wheel == NULL or self.act == NULL or self.ring == NULL):
            raise MemoryError("engine buffers")
        for i in range(WHEEL_SIZE):
            self.wheel[i].ev = NULL
            self.wheel[i].n = 0
            self.wheel[i].cap = 0
        self.wheel_count = 0
        self.cur = 0
        self.act_head = 0
        self.act_len = 0
        self.fifo_head = 0
        self.fifo_len = 0
        self.heap_len = 0
        self.seq = 0
        self.now = 0
        self.events = 0
        for i in range(16):
            self.kind_count[i] = 0
        self.ops_done = 0
        self.max_pending = 0
        self.past_event = False
        for i in range(self.fail_time.shape[0]):
            self.push(self.fail_time[i], EV_FAIL, <int32_t>i)
        for i in range(self.n_ops):
            if self.ops[i].pending == 0:
                self.push(0, EV_OP_READY, <int32_t>i)
        if drop_inputs:
            L.drop_engine_inputs()

    def __dealloc__(self):
        cdef int64_t i
        free(self.tq_due)
        free(self.tq_chain)
        free(self.tq_last)
        if self.ack_heap != NULL:
            for i in range(self.n_ini):
                free(self.ack_heap[i])
            free(self.ack_heap)
        free(self.ring_slot)
        free(self.ack_cap)
        free(self.ack_lo)
        if self.lk != NULL:
            for i in range(self.n_links):
                free(self.lk[i].cal)
                free(self.lk[i].buf)
        if self.sk != NULL:
            for i in range(self.n_eps):
                free(self.sk[i].cal)
            free(self.sk)
        if self.ini != NULL:
            for i in range(self.n_ini):
                free(self.ini[i].buf)
            free(self.ini)
        free(self.ops)
        free(self.lk)
        free(self.heap)
        free(self.fifo)
        if self.wheel != NULL:
            for i in range(WHEEL_SIZE):
                free(self.wheel[i].ev)
            free(self.wheel)
        self.spares_free()
        free(self.act)
        free(self.sort_tmp)
        free(self.pkts)
        free(self.series)
        free(self.ring)
        free(self.recs)
        free(self.hrec)
        free(self.hr)
        free(self.segs)
        free(self.mt)
        free(self.live)

    def release(self, bint keep_op_times=False):
        """Free what only the simulation needs, once the run is over: the per-op and per-message
        state, the event queue, the calendars and the packet pool (gigabytes on a big run, while
        its results are built). Afterwards only msg_delivered_ps, messages_delivered,
        msg_packets, the link totals and series, hbm_clock and packet_records can be read; with
        ``keep_op_times``, op_start_ps and op_end_ps too, until release() is called again (read
        them then: less memory in use as they are built)."""
        cdef int64_t i
        if not keep_op_times and self.ops != NULL:
            free(self.ops)
            self.ops = NULL
        if self.released:
            return
        self.released = True
        for i in range(self.n_links):
            free(self.lk[i].cal)
            self.lk[i].cal = NULL
            self.lk[i].cal_n = self.lk[i].cal_cap = 0
        for i in range(self.n_eps):
            free(self.sk[i].cal)
            self.sk[i].cal = NULL
        for i in range(self.n_links):
            free(self.lk[i].buf)
            self.lk[i].buf = NULL
            self.lk[i].buf_n = self.lk[i].buf_cap = 0
        for i in range(self.n_ini):
            free(self.ini[i].buf)
            self.ini[i].buf = NULL
            self.ini[i].n = self.ini[i].cap = 0
            free(self.ack_heap[i])
            self.ack_heap[i] = NULL
            self.ini[i].ack_len = 0
            self.ack_cap[i] = self.ack_lo[i] = 0
        for i in range(WHEEL_SIZE):
            free(self.wheel[i].ev)
            self.wheel[i].ev = NULL
            self.wheel[i].n = self.wheel[i].cap = 0
        self.spares_free()
        free(self.heap)
        free(self.fifo)
        free(self.act)
        free(self.sort_tmp)
        free(self.pkts)
        self.heap = self.fifo = self.act = self.sort_tmp = NULL
        self.sort_tmp_cap = 0
        self.pkts = NULL
        self.heap_len = self.fifo_len = self.act_len = self.act_head = self.wheel_count = 0
        free(self.hr)
        self.hr = NULL
        self.n_hrows = 0
        self.op_mptr = self.op_midx = None
        self.msg_left = None

    # -- the event queue -----------------------------------------------------------------
    cdef int push(self, int64_t time, int32_t kind, int32_t a) except -1:
        """Schedule an event. The order is (time, seq), exactly as one heap would give it:

        - an event for the current time goes to a FIFO: every event already queued for this
          time was scheduled earlier (smaller seq), and is in the current bucket's sorted list;
        - an event in the current 16 ns bucket is inserted into that bucket's sorted list;
        - one within the wheel's horizon (268 us) is appended, unsorted, to its bucket, which is
          sorted when its turn comes;
        - a later one goes to the heap, and joins its bucket when that bucket's turn comes.
        """
        cdef Event ev
        cdef Event* slot
        cdef Bucket* bk
        cdef int64_t total, b, k
        if time < self.now:
            self.past_event = True
        b = time >> BUCKET_BITS
        # The two common cases (the FIFO, a wheel bucket) write the event in place: an Event
        # built here and passed by value cost a store-forwarding stall per push.
        if time == self.now:
            if self.fifo_len == self.fifo_cap:
                self.fifo_grow()
            k = self.fifo_head + self.fifo_len
            if k >= self.fifo_cap:
                k -= self.fifo_cap
            slot = &self.fifo[k]
            self.fifo_len += 1
        elif b > self.cur and b < self.cur + WHEEL_SIZE:
            bk = &self.wheel[b & WHEEL_MASK]
            if bk.n == bk.cap:
                self.bucket_grow(bk)
            slot = &bk.ev[bk.n]
            bk.n += 1
            self.wheel_count += 1
        else:
            ev.time = time
            ev.seq = self.seq
            ev.kind = kind
            ev.a = a
            self.seq += 1
            if b <= self.cur:
                self.active_insert(ev)
            else:
                self.heap_push(ev)
            slot = NULL
        if slot != NULL:
            slot.time = time
            slot.seq = self.seq
            slot.kind = kind
            slot.a = a
            self.seq += 1
        total = self.heap_len + self.fifo_len + self.wheel_count + self.act_len - self.act_head
        if total > self.max_pending:
            self.max_pending = total
        return 0

    cdef void spares_free(self) noexcept nogil:
        """Give the drained buckets' rooms kept for the next to fill (spare_ev) back."""
        cdef int i
        for i in range(self.spare_n):
            free(self.spare_ev[i])
        self.spare_n = 0

    cdef int bucket_grow(self, Bucket* bk) except -1:
        """Room for one more event in a full wheel bucket (an empty one takes the room a bucket
        drained last gave back, if any: no reallocation, and memory still in cache)."""
        cdef Event* grown
        cdef int64_t cap = 16 if bk.cap == 0 else 2 * bk.cap
        if bk.cap == 0 and self.spare_n > 0:
            self.spare_n -= 1
            bk.ev = self.spare_ev[self.spare_n]
            bk.cap = self.spare_cap[self.spare_n]
            return 0
        grown = <Event*>realloc(bk.ev, cap * sizeof(Event))
        if grown == NULL:
            raise MemoryError("event wheel")
        bk.ev = grown
        bk.cap = cap
        return 0

    cdef int active_reserve(self, int64_t extra) except -1:
        """Room for ``extra`` more events at the end of the active list (compacting it first)."""
        cdef Event* grown
        cdef int64_t n = self.act_len - self.act_head, cap
        if self.act_head > 0:
            memmove(self.act, self.act + self.act_head, n * sizeof(Event))
            self.act_head = 0
            self.act_len = n
        if n + extra > self.act_cap:
            cap = self.act_cap
            while cap < n + extra:
                cap *= 2
            grown = <Event*>realloc(self.act, cap * sizeof(Event))
            if grown == NULL:
                raise MemoryError("event list")
            self.act = grown
            self.act_cap = cap
        return 0

    cdef int active_insert(self, Event ev) except -1:
        """Insert into the current bucket's sorted list (after everything not later than it)."""
        cdef int64_t lo, hi, mid
        if self.act_len == self.act_cap:
            self.active_reserve(1)
        lo = self.act_head
        hi = self.act_len
        while lo < hi:
            mid = (lo + hi) >> 1
            if ev_less(&self.act[mid], &ev):
                lo = mid + 1
            else:
                hi = mid
        memmove(self.act + lo + 1, self.act + lo, (self.act_len - lo) * sizeof(Event))
        self.act[lo] = ev
        self.act_len += 1
        return 0

    cdef int refill(self) except -1:
        """The current bucket is drained: move on to the next one that holds events, collect
        them (its wheel slot, and heap events of that bucket), and sort them."""
        cdef Bucket* bk
        cdef int64_t heap_b
        cdef bint from_heap, sorted_ = False
        self.act_head = 0
        self.act_len = 0
        while self.wheel_count > 0 or self.heap_len > 0:
            heap_b = self.heap[0].time >> BUCKET_BITS if self.heap_len > 0 else -1
            if self.wheel_count == 0:
                self.cur = heap_b
            else:
                self.cur += 1
            bk = &self.wheel[self.cur & WHEEL_MASK]
            from_heap = heap_b == self.cur
            if bk.n > 0:
                self.active_reserve(bk.n)
                if from_heap or bk.n <= SORT_SMALL:
                    memmove(self.act, bk.ev, bk.n * sizeof(Event))
                else:
                    # A bucket's events were appended as they were scheduled, so in seq order:
                    # sorted stably by time alone, they are in (time, seq) order.
                    self.sort_by_time(bk.ev, bk.n)
                    sorted_ = True
                self.act_len = bk.n
                self.wheel_count -= bk.n
                bk.n = 0
                if bk.cap > WHEEL_KEEP:
                    # A burst made it big: give the room back (16 K buckets each keeping their
                    # largest burst would hold hundreds of MB for nothing), to the next bucket
                    # to fill (spare_ev) if it is not too big and there is room among them.
                    if bk.cap <= SPARE_CAP and self.spare_n < SPARE_MAX:
                        self.spare_ev[self.spare_n] = bk.ev
                        self.spare_cap[self.spare_n] = bk.cap
                        self.spare_n += 1
                    else:
                        free(bk.ev)
                    bk.ev = NULL
                    bk.cap = 0
            while self.heap_len > 0 and (self.heap[0].time >> BUCKET_BITS) == self.cur:
                if self.act_len == self.act_cap:
                    self.active_reserve(1)
                self.act[self.act_len] = self.heap_pop()
                self.act_len += 1
            if self.act_len > 0:
                if from_heap:  # heap events have come after the bucket's, in no seq order with them
                    qsort(self.act, self.act_len, sizeof(Event), ev_cmp)
                elif not sorted_:
                    self.insertion_sort_by_time(self.act_len)
                return 0
        return 0

    cdef void insertion_sort_by_time(self, int64_t n) noexcept nogil:
        """Sort act[0:n] stably by time (a few events in seq order: by (time, seq))."""
        cdef int64_t i, j
        cdef Event ev
        for i in range(1, n):
            if self.act[i].time >= self.act[i - 1].time:
                continue
            ev = self.act[i]
            j = i
            while j > 0 and self.act[j - 1].time > ev.time:
                self.act[j] = self.act[j - 1]
                j -= 1
            self.act[j] = ev

    cdef int sort_by_time(self, const Event* src, int64_t n) except -1:
        """src[0:n], events of bucket cur, into act[0:n] sorted stably by time: an LSD radix
        sort on the time's 14 bits within the bucket, 7 bits a pass (through sort_tmp)."""
        cdef int32_t lo_at[128]
        cdef int32_t hi_at[128]
        cdef int32_t c, t, u, d
        cdef int64_t i, base = self.cur << BUCKET_BITS
        cdef Event* tmp
        if n > self.sort_tmp_cap:
            free(self.sort_tmp)
            self.sort_tmp_cap = max(n, 2 * self.sort_tmp_cap)
            self.sort_tmp = <Event*>malloc(self.sort_tmp_cap * sizeof(Event))
            if self.sort_tmp == NULL:
                self.sort_tmp_cap = 0
                raise MemoryError("event sort")
        tmp = self.sort_tmp
        memset(lo_at, 0, sizeof(lo_at))
        memset(hi_at, 0, sizeof(hi_at))
        for i in range(n):
            d = <int32_t>(src[i].time - base)
            lo_at[d & 127] += 1
            hi_at[d >> 7] += 1
        t = u = 0
        for c in range(128):  # counts to starting places, both digits at once
            d = lo_at[c]
            lo_at[c] = t
            t += d
            d = hi_at[c]
            hi_at[c] = u
            u += d
        for i in range(n):
            d = <int32_t>(src[i].time - base) & 127
            tmp[lo_at[d]] = src[i]
            lo_at[d] += 1
        for i in range(n):
            d = <int32_t>(tmp[i].time - base) >> 7
            self.act[hi_at[d]] = tmp[i]
            hi_at[d] += 1
        if self.sort_tmp_cap > SORT_TMP_KEEP:  # a burst's: give the room back (as qsort would)
            free(self.sort_tmp)
            self.sort_tmp = NULL
            self.sort_tmp_cap = 0
        return 0

    cdef int fifo_grow(self) except -1:
        """Double the full FIFO's room, its events in order from its start."""
        cdef Event* grown
        cdef int64_t k
        grown = <Event*>malloc(2 * self.fifo_cap * sizeof(Event))
        if grown == NULL:
            raise MemoryError("event FIFO")
        for k in range(self.fifo_len):
            grown[k] = self.fifo[(self.fifo_head + k) % self.fifo_cap]
        free(self.fifo)
        self.fifo = grown
        self.fifo_head = 0
        self.fifo_cap *= 2
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

    cdef inline Event heap_pop(self) noexcept nogil:
        # A 4-ary heap popped Floyd's way: walk the hole down along the smallest children,
        # then sift the last element up from the leaf (usually zero or one step).
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

    cdef inline Event next_event(self) except *:
        """The earliest event: queued events for the current time precede the FIFO's."""
        cdef Event ev
        cdef Event* e
        cdef OpInfo* o
        cdef int64_t h
        if self.fifo_len > 0 and (self.act_head == self.act_len
                                  or self.act[self.act_head].time > self.fifo[self.fifo_head].time):
            ev = self.fifo[self.fifo_head]
            self.fifo_head += 1
            if self.fifo_head == self.fifo_cap:
                self.fifo_head = 0
            self.fifo_len -= 1
            return ev
        if self.act_head == self.act_len:
            self.refill()
        ev = self.act[self.act_head]
        self.act_head += 1
        # Ask for the op lines that the sorted list's coming op ends will touch: the op's own,
        # PREFETCH_OP events ahead, and its first successor's, PREFETCH_SUCC ahead (by then its
        # own line is in the cache). The op table is far larger than the caches, and ops end in
        # no order of their own. (Written here, not in a function of its own: GCC took such a
        # function for one without side effects and dropped its calls.)
        h = self.act_head + PREFETCH_OP
        if h < self.act_len:
            e = &self.act[h]
            if e.kind == EV_OP_DONE:
                cm_prefetch(&self.ops[e.a])
        h = self.act_head + PREFETCH_SUCC
        if h < self.act_len:
            e = &self.act[h]
            if e.kind == EV_OP_DONE:
                o = &self.ops[e.a]
                if o.succ_n > 0:
                    cm_prefetch(&self.ops[self.succ_idx[o.succ_lo]])
        return ev

    # -- packets -------------------------------------------------------------------------
    cdef int32_t packet_new(self) except -1:
        cdef Packet* grown
        cdef int32_t i, p
        if self.pkt_free < 0:
            grown = <Packet*>realloc(self.pkts, 2 * self.pkt_cap * sizeof(Packet))
            if grown == NULL:
                raise MemoryError("packet pool")
            self.pkts = grown
            for i in range(self.pkt_cap, 2 * self.pkt_cap):
                self.pkts[i].next = i + 1 if i + 1 < 2 * self.pkt_cap else -1
            self.pkt_free = self.pkt_cap
            self.pkt_cap *= 2
        p = self.pkt_free
        self.pkt_free = self.pkts[p].next
        self.pkts[p].next = -1
        self.packets_live += 1
        return p

    cdef inline void packet_release(self, int32_t p) noexcept nogil:
        self.pkts[p].next = self.pkt_free
        self.pkt_free = p
        self.packets_live -= 1

    cdef inline int64_t wire_bytes(self, int path, int ptype, int64_t payload) noexcept nogil:
        cdef int64_t flit = self.path_flit[path]
        cdef int64_t raw = payload + self.path_header[path * 4 + ptype]
        return (raw + flit - 1) // flit * flit

    def route(self, int path, int32_t s, int32_t d, int plane, int uplink) -> list:
        """The links, hop by hop, of the path of a message of path kind ``path`` from endpoint s to
        d on sub-plane ``plane`` and L1 uplink ``uplink``: route_link, as a run uses it (for tests)."""
        cdef int hop = 0
        cdef int32_t link = self.route_link(path, s, d, plane, uplink, 0)
        out = []
        while link >= 0:
            out.append(link)
            hop += 1
            link = self.route_link(path, s, d, plane, uplink, hop)
        return out

    cdef int32_t route_link(self, int path, int32_t s, int32_t d, int plane, int uplink, int hop) noexcept nogil:
        """The hop-th link from endpoint s to endpoint d, or -1 past the last one."""
        cdef int32_t ns, nd
        if path == PATH_D2D:
            if self.lk[self.t_d2d[s]].alive:
                return self.t_d2d[s] if hop == 0 else -1
            path = PATH_UB  # the die-to-die link is down: through the node's L1 chips, as UB
        if path == PATH_RDMA:
            if hop == 0:
                return self.t_rdma_up[s]
            return self.t_rdma_down[d] if hop == 1 else -1
        ns = self.ep_node[s]
        nd = self.ep_node[d]
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
            return self.l2_down_link(ns, nd, plane, uplink)
        return self.t_ep_down[d * self.P + plane] if hop == 3 else -1

    cdef inline int32_t l2_down_link(self, int32_t ns, int32_t nd, int plane, int uplink) noexcept nogil:
        """A UB path's third link, from an L2 chip down to node nd's L1 chip: the chip node
        ns's uplink reaches on the plane, and of that chip's links to nd the (uplink // C) %
        count-th."""
        cdef int32_t chip = self.t_l1_uplink_chip[(ns * self.P + plane) * self.U + uplink]
        cdef int32_t count = self.t_l2_down_count[(plane * self.C + chip) * self.N + nd]
        # (uplink // C) % count, without a division where it is not needed (on
        # CloudMatrix384 uplink < C and count is 1: the two integer divisions took 4-5% of
        # the run, waiting for count's load).
        cdef int32_t q = uplink // self.C if uplink >= self.C else 0
        if q >= count:
            q = q % count
        return self.t_l2_down[((plane * self.C + chip) * self.N + nd) * self.M + q]

    cdef inline int64_t path_hash(self, int32_t m, int64_t row) noexcept nogil:
        """Message m's path hash (cmemu.fabric.path_hashes); ``row``: its table row."""
        cdef uint64_t h = (<uint64_t>m * PATH_HASH_MULT + <uint64_t>self.mt[row].src * 7919
                           + <uint64_t>self.mt[row].dst * 104729)
        return <int64_t>(h & 0x7fffffff)  # mod 2**31

    cdef int64_t choose_path(self, int32_t m, int64_t seq, int32_t p, int64_t row) except -1:
        """The (plane, L2 chip) index of packet ``seq`` of message m: sprayed, (hash + seq) mod
        paths, or hashed, the one path its hash picks. With links down, a message with a failed
        path sprays (or hashes) over its live paths alone, in path order, so that the packets its
        lost paths would have carried spread evenly over the rest; none at all is an error."""
        cdef int64_t h = self.path_hash(m, row), n = self.P * self.U, k
        if self.lb == LB_SPRAY:
            k = (h + seq) % n
        else:
            k = h % n
        if not self.links_down:
            return k
        if m != self.live_m:
            self.live_paths(m, self.mt[row].path)
        if self.live_n == n:
            return k
        if self.live_n == 0:
            if p >= 0:
                self.packet_release(p)
            raise UnroutableError(m)
        return self.live[(h + seq) % self.live_n if self.lb == LB_SPRAY else h % self.live_n]

    cdef int live_paths(self, int32_t m, int path) except -1:
        """Message m's live paths, in path order (choose_path); a path kind with one route (RDMA,
        VPC, a live die-to-die link) has all or none."""
        cdef int64_t n = self.P * self.U, idx
        cdef bint one = path == PATH_RDMA or path == PATH_VPC
        if self.live == NULL:
            self.live = <int32_t*>malloc(n * sizeof(int32_t))
            if self.live == NULL:
                raise MemoryError("live paths")
        self.live_n = 0
        self.live_m = m
        for idx in range(n):
            if (idx == 0 or not one) and self.path_alive(m, <int>(idx % self.P), <int>(idx // self.P)):
                self.live[self.live_n] = <int32_t>idx
                self.live_n += 1
        if one and self.live_n == 1:
            for idx in range(n):
                self.live[idx] = <int32_t>idx
            self.live_n = <int32_t>n
        return 0

    cdef int lose(self, int32_t p) except -1:
        """A packet is lost (its link failed): free what it held; its source sends it again."""
        self.packets_lost += 1
        self.push(self.now + self.rto_ps, EV_RETRANSMIT, p)
        return 0

    cdef int on_fail(self, int32_t k) except -1:
        """Links (and maybe a die) go down: packets waiting for a dead link are lost."""
        cdef int64_t i, q, base, n
        cdef int32_t link, p, prev
        for i in range(self.fail_ptr[k], self.fail_ptr[k + 1]):
            self.lk[self.fail_links[i]].alive = 0
            self.links_down = True
            self.live_m = -1  # the live paths are to be found again
        if self.fail_die[k] >= 0:
            self.die_failed[self.fail_die[k]] = 1
        self.revert_in_flight()
        for i in range(self.fail_ptr[k], self.fail_ptr[k + 1]):
            link = self.fail_links[i]
            base = self.lk[link].voq_base
            n = self.lk[link].voq_slots * NUM_VLS
            for q in range(base, base + n):
                while self.voq_head[q] >= 0:
                    p = self.voq_head[q]
                    self.voq_head[q] = self.pkts[p].next
                    prev = self.pkts[p].in_link
                    if prev >= 0:
                        # It leaves the buffer it waited in: that buffer's sender gets the credit.
                        self.credits[prev * NUM_VLS + self.pkts[p].vl] += self.pkts[p].wire
                        self.try_transmit(prev)
                    self.lose(p)
                self.voq_tail[q] = -1
            self.lk[link].queued = 0
            for q in range((n + 63) >> 6):
                self.voq_mask[self.lk[link].mask_base + q] = 0
        return 0

    cdef int revert_in_flight(self) except -1:
        """Links just failed: a packet queued ahead for its next link (see try_transmit) that has
        not arrived yet (or arrives now: a failure is handled before the arrivals of its time), on
        a failed link or for one, becomes an arrival event again, so that it is lost when it
        arrives, as on_packet_arrive says."""
        cdef int64_t link, q, base, n, pos
        cdef int32_t p, prev, nx, came
        for link in range(self.n_links):
            if self.lk[link].queued == 0:
                continue
            base = self.lk[link].voq_base
            n = self.lk[link].voq_slots * NUM_VLS
            for q in range(base, base + n):
                p = self.voq_head[q]
                prev = -1
                while p >= 0:
                    nx = self.pkts[p].next
                    came = self.pkts[p].in_link
                    if came >= 0 and self.pkts[p].ready >= self.now and (
                            not self.lk[came].alive or not self.lk[link].alive):
                        if prev < 0:
                            self.voq_head[q] = nx
                        else:
                            self.pkts[prev].next = nx
                        if self.voq_tail[q] == p:
                            self.voq_tail[q] = prev
                        self.lk[link].queued -= 1
                        self.pkts[p].hop -= 1
                        self.pkts[p].link = came
                        self.push(self.pkts[p].ready, EV_PKT_ARRIVE, p)
                    else:
                        prev = p
                    p = nx
                if self.voq_head[q] < 0:
                    pos = q - base
                    self.voq_mask[self.lk[link].mask_base + (pos >> 6)] &= ~((<uint64_t>1) << (pos & 63))
        return 0

    cdef int on_retransmit(self, int32_t p) except -1:
        """The source (the target, for a read's response) sends a lost packet again, on a live path."""
        cdef int32_t m = self.pkts[p].msg, s, d, first
        cdef int64_t idx = self.choose_path(m, self.pkts[p].seq, -1, self.mrow(m))
        self.pkts[p].plane = <uint8_t>(idx % self.P)
        self.pkts[p].uplink = <int32_t>(idx // self.P)
        self.pkts[p].hop = 0
        self.pkts[p].in_link = -1
        self.pkts[p].ready = self.now
        self.leg_ends(p, &s, &d)
        first = self.route_link(self.m_path(m), s, d, self.pkts[p].plane, self.pkts[p].uplink, 0)
        self.voq_append(first, 0, p)
        self.try_transmit(first)
        return 0

    cdef bint path_alive(self, int32_t m, int plane, int uplink) noexcept nogil:
        """Whether every link of message m's path on (plane, uplink) is up, both ways for a read."""
        cdef int path = self.m_path(m), hop, leg
        cdef int32_t link, s, d
        for leg in range(2 if self.m_kind(m) != MSG_WRITE else 1):
            if leg == 0 and self.m_kind(m) != MSG_WRITE:
                s, d = self.m_dst(m), self.m_src(m)
            else:
                s, d = self.m_src(m), self.m_dst(m)
            hop = 0
            while True:
                link = self.route_link(path, s, d, plane, uplink, hop)
                if link < 0:
                    break
                if not self.lk[link].alive:
                    return False
                hop += 1
        return True

    cdef inline int64_t mrow(self, int64_t m) noexcept nogil:
        """Message m's row in the messages' table."""
        cdef const Seg* g = &self.segs[self.mseg[m]]
        return m - g.lo + g.row

    cdef inline int32_t m_src(self, int64_t m) noexcept nogil:
        return self.mt[self.mrow(m)].src

    cdef inline int32_t m_dst(self, int64_t m) noexcept nogil:
        return self.mt[self.mrow(m)].dst

    cdef inline int64_t m_bytes(self, int64_t m) noexcept nogil:
        return self.mt[self.mrow(m)].nbytes

    cdef inline uint8_t m_kind(self, int64_t m) noexcept nogil:
        return self.mt[self.mrow(m)].kind

    cdef inline uint8_t m_path(self, int64_t m) noexcept nogil:
        return self.mt[self.mrow(m)].path

    cdef inline int32_t m_send_op(self, int64_t m) noexcept nogil:
        cdef const Seg* g = &self.segs[self.mseg[m]]
        cdef int32_t op = self.mt[m - g.lo + g.row].send
        return op + g.shift if op >= 0 else op

    cdef inline int32_t m_recv_op(self, int64_t m) noexcept nogil:
        cdef const Seg* g = &self.segs[self.mseg[m]]
        cdef int32_t op = self.mt[m - g.lo + g.row].recv
        return op + g.shift if op >= 0 else op

    @property
    def hbm_shared_ops(self):
        """The ops that share their die's HBM bandwidth (cmemu._core.hbm_sharing; int32, in op
        order), until release."""
        if self.released:
            raise RuntimeError("this engine's run state was released")
        cdef int64_t i
        out = np.empty(self.n_hrows, dtype=np.int32)
        cdef int32_t[::1] o = out
        for i in range(self.n_hrows):
            o[i] = self.hr[i].op
        return out

    @property
    def hbm_shared_demand(self):
        """The demand (bytes/s) of each op of hbm_shared_ops, in its order (int64), until release."""
        if self.released:
            raise RuntimeError("this engine's run state was released")
        cdef int64_t i
        out = np.empty(self.n_hrows, dtype=np.int64)
        cdef int64_t[::1] o = out
        for i in range(self.n_hrows):
            o[i] = self.hr[i].rate
        return out

    def op_messages(self, int32_t op):
        """The messages op carries (a SEND's writes, a RECV's messages), until release."""
        if self.released:
            raise RuntimeError("this engine's run state was released")
        return np.asarray(self.op_midx[self.op_mptr[op]:self.op_mptr[op + 1]]).copy()

    def message(self, int64_t m):
        """Message m's fields: (src, dst, bytes, kind, path, send_op, recv_op)."""
        if not 0 <= m < self.n_msgs:
            raise IndexError(f"message {m} of {self.n_msgs}")
        return (self.m_src(m), self.m_dst(m), self.m_bytes(m), self.m_kind(m), self.m_path(m), self.m_send_op(m),
                self.m_recv_op(m))

    def message_table(self, L):
        """Set up the messages' table from the lowering (see mt)."""
        segs = getattr(L, "msg_segments", None)
        n = L.msg_src.shape[0]
        cols = tuple(MSG_COLUMNS)
        table = {c: getattr(L, c) for c in cols}
        rows = np.zeros((1, 3), dtype=np.int64)  # (lo, row, shift): one segment, the columns themselves
        seg_of = np.zeros(n, dtype=np.uint16)
        self.owns_messages = False
        if segs is not None and len(segs) and np.any(segs[:, 2] != segs[:, 0]) and len(segs) <= 65536:
            lo, count, tpl, shift = (segs[:, k] for k in range(4))
            if lo[0] != 0 or np.any(lo[1:] != lo[:len(lo) - 1] + count[:len(lo) - 1]) or count.sum() != n:
                raise ValueError("the message segments do not cover the messages in order")
            own = np.flatnonzero(tpl == lo)
            row_of = dict(zip(lo[own].tolist(), (np.cumsum(count[own]) - count[own]).tolist()))
            if any(t not in row_of for t in tpl.tolist()):
                raise ValueError("a message segment's template is not a segment of its own")
            count_of = dict(zip(lo[own].tolist(), count[own].tolist()))
            if any(count_of[t] != k for t, k in zip(tpl.tolist(), count.tolist())):
                raise ValueError("a message segment is not as long as its template")
            take = np.concatenate([np.arange(a, a + k) for a, k in zip(lo[own], count[own])])
            table = {c: np.ascontiguousarray(getattr(L, c)[take]) for c in cols}
            rows = np.stack([lo, np.array([row_of[t] for t in tpl.tolist()], dtype=np.int64), shift], axis=1)
            seg_of = np.repeat(np.arange(len(segs), dtype=np.uint16), count)
            self.owns_messages = True
        else:
            L.fill_messages()  # the columns are the table: every row is read
        self.fill_rows(table)
        self.mseg = seg_of
        free(self.segs)
        self.segs = <Seg*>calloc(rows.shape[0], sizeof(Seg))
        if self.segs == NULL:
            raise MemoryError("message segments")
        cdef int64_t k
        for k in range(rows.shape[0]):
            self.segs[k].lo, self.segs[k].row, self.segs[k].shift = rows[k, 0], rows[k, 1], rows[k, 2]
        # Every packet of every message is still to come (packets_of), worked out per table row
        # and copied segment by segment.
        mtu = np.asarray(self.path_mtu)[np.asarray(table["msg_path"])]
        row_bytes = np.asarray(table["msg_bytes"])
        packets = np.maximum(1, (row_bytes + mtu - 1) // mtu).astype(np.int32)
        self.row_packets, self.seg_rows = packets, rows
        left = self.message_packets(n, np.int32)
        self.msg_left = left
        self.packets_total = int(left.sum(dtype=np.int64))

    cdef int fill_rows(self, dict table) except -1:
        """The table's rows from its columns (message_table)."""
        cdef const uint16_t[::1] src = table["msg_src"], dst = table["msg_dst"], ini = table["msg_ini"]
        cdef const int64_t[::1] nbytes = table["msg_bytes"]
        cdef const uint8_t[::1] kind = table["msg_kind"], path = table["msg_path"], flow = table["msg_flow"]
        cdef const int32_t[::1] send = table["msg_send_op"], recv = table["msg_recv_op"], prep = table["msg_prep"]
        cdef int64_t i, n = src.shape[0]
        cdef void* mem = NULL
        free(self.mt)
        self.mt = NULL
        if posix_memalign(&mem, 64, max(n, 1) * sizeof(MsgRow)) != 0:
            raise MemoryError("messages' table")
        self.mt = <MsgRow*>mem
        self.n_rows = n
        for i in range(n):
            self.mt[i].nbytes = nbytes[i]
            self.mt[i].send = send[i]
            self.mt[i].recv = recv[i]
            self.mt[i].prep = prep[i]
            self.mt[i].src = src[i]
            self.mt[i].dst = dst[i]
            self.mt[i].ini = ini[i]
            self.mt[i].kind = kind[i]
            self.mt[i].path = path[i]
            self.mt[i].flow = flow[i]
        return 0

    cdef inline int32_t packets_of(self, int32_t m) noexcept nogil:
        """Packets message m is cut into: at most an MTU each, at least one."""
        cdef int64_t mtu = self.path_mtu[self.m_path(m)], n = self.m_bytes(m)
        return 1 if n <= mtu else <int32_t>((n + mtu - 1) // mtu)

    @property
    def msg_pending(self):
        """Packets of each message not yet delivered (int32 [msgs]; 0: delivered), until release."""
        if self.released:
            raise RuntimeError("this engine's run state was released")
        return np.asarray(self.msg_left).copy()

    @property
    def series_rows(self):
        """Rows of the binned link counters closed so far (the few bins each link keeps open aside):
        what run.simulate checks against the memory limit between slices."""
        return self.series_len

    @property
    def msg_packets(self):
        """Packets each message is cut into (int64 [msgs])."""
        return self.message_packets()

    def message_packets(self, int64_t n=-1, dtype=np.int64):
        """Packets each of the first n messages (-1: all) is cut into (packets_of; ``dtype``, int64
        unless asked), segment by segment from the table rows' counts (a lookup per message was
        1 s of the 61-layer decode step's 60 M)."""
        n = self.n_msgs if n < 0 else min(n, self.n_msgs)
        packets, rows = self.row_packets, self.seg_rows
        if rows.shape[0] == 1:
            return packets[:n].astype(dtype)
        out = np.empty(n, dtype=dtype)
        ends = np.append(rows[1:, 0], self.n_msgs)
        for k in range(rows.shape[0]):
            lo, hi = int(rows[k, 0]), min(int(ends[k]), n)
            if lo >= n:
                break
            out[lo:hi] = packets[rows[k, 1]:rows[k, 1] + hi - lo]
        return out

    cdef inline void leg_ends(self, int32_t p, int32_t* s, int32_t* d) noexcept nogil:
        """Endpoints of the packet's current leg (a read's request goes the other way)."""
        cdef int32_t m = self.pkts[p].msg
        if self.m_kind(m) != MSG_WRITE and self.pkts[p].leg == 0:
            s[0] = self.m_dst(m)
            d[0] = self.m_src(m)
        else:
            s[0] = self.m_src(m)
            d[0] = self.m_dst(m)

    cdef inline void voq_append(self, int32_t link, int32_t slot, int32_t p) noexcept nogil:
        cdef int64_t pos = slot * NUM_VLS + self.pkts[p].vl
        cdef int64_t q = self.lk[link].voq_base + pos
        self.pkts[p].next = -1
        self.pkts[p].link = link
        if self.voq_tail[q] < 0:
            self.voq_head[q] = p
            self.voq_mask[self.lk[link].mask_base + (pos >> 6)] |= (<uint64_t>1) << (pos & 63)
        else:
            self.pkts[self.voq_tail[q]].next = p
        self.voq_tail[q] = p
        self.lk[link].queued += 1

    # -- counters --------------------------------------------------------------------------
    cdef int series_row(self, int32_t link, int64_t b, int64_t nbytes, int64_t busy) except -1:
        cdef SeriesRow* grown
        cdef int64_t part_bytes, part_busy
        while nbytes > UINT32_MAX or busy > UINT32_MAX:  # a wide bin: in parts (SeriesRow)
            part_bytes = nbytes if nbytes < UINT32_MAX else UINT32_MAX
            part_busy = busy if busy < UINT32_MAX else UINT32_MAX
            self.series_row(link, b, part_bytes, part_busy)
            nbytes -= part_bytes
            busy -= part_busy
        if self.series_len == self.series_cap:
            grown = <SeriesRow*>realloc(self.series, 2 * self.series_cap * sizeof(SeriesRow))
            if grown == NULL:
                raise MemoryError("link counters")
            self.series = grown
            self.series_cap *= 2
        if b > 2147483647:
            raise SimulationError("the run has more than 2**31 link counter bins: make them wider (cmemu run --link-bin-ns)")
        self.series[self.series_len].link = link
        self.series[self.series_len].bin = <int32_t>b
        self.series[self.series_len].nbytes = <uint32_t>nbytes
        self.series[self.series_len].busy = <uint32_t>busy
        self.series_len += 1
        return 0

    cdef int series_flush(self, int32_t link, int64_t upto) except -1:
        """Write out the link's open bins below ``upto`` (all of them: -1)."""
        cdef int64_t b, slot, base = self.lk[link].cur_bin
        cdef int64_t* r = self.ring + <int64_t>link * RING * 2
        if base < 0:
            return 0
        for b in range(base, base + RING):
            if upto >= 0 and b >= upto:
                break
            slot = 2 * (b % RING)
            if r[slot] or r[slot + 1]:
                self.series_row(link, b, r[slot], r[slot + 1])
                r[slot] = 0
                r[slot + 1] = 0
        self.lk[link].cur_bin = upto
        return 0

    cdef inline int64_t bin_of(self, int64_t t) noexcept nogil:
        """t's time bin, t // bin_ps (bin_ps > 0), without a division in the bin of now or the
        next one, where most transmissions are reserved (a division per packet and hop was 5% of
        the message-level fabric's instructions)."""
        cdef int64_t d = t - self.bin_start
        if 0 <= d < self.bin_ps:
            return self.bin_now
        if self.bin_ps <= d < 2 * self.bin_ps:
            return self.bin_now + 1
        return t // self.bin_ps

    cdef int count_transmission(self, int32_t link, int64_t start, int64_t ser, int64_t nbytes) except -1:
        """Totals, and the binned counters: the bins a link has open are the RING from cur_bin on
        (transmissions come in time order on the packet fabric, and close to it on the
        message-level one); one older than those gets a row of its own (link_series sums rows)."""
        cdef int64_t t = start, end = start + ser, b, seg_end
        cdef int64_t* r = self.ring + <int64_t>link * RING * 2
        self.lk[link].bytes += nbytes
        self.lk[link].busy += ser
        if self.bin_ps <= 0:
            return 0
        while True:
            b = self.bin_of(t)
            seg_end = (b + 1) * self.bin_ps
            if seg_end > end:
                seg_end = end
            if self.lk[link].cur_bin < 0:
                self.lk[link].cur_bin = b
            if b < self.lk[link].cur_bin:
                self.series_row(link, b, nbytes, seg_end - t)
            else:
                if b >= self.lk[link].cur_bin + RING:
                    self.series_flush(link, b - RING + 1)
                r[2 * (b % RING)] += nbytes
                r[2 * (b % RING) + 1] += seg_end - t
            nbytes = 0  # bytes count in the bin where the packet starts
            t = seg_end
            if t >= end:
                break
        return 0

    cdef int record(self, int32_t m, int32_t seq, int32_t link, int64_t start, int64_t end, int64_t wire,
                    uint8_t ptype) except -1:
        """One transmission on a link: a packet's, or a message-level write's (seq -1)."""
        cdef PacketRecord* grown
        cdef PacketRecord* r
        if self.recs_len == self.recs_cap:
            grown = <PacketRecord*>realloc(self.recs, max(1024, 2 * self.recs_cap) * sizeof(PacketRecord))
            if grown == NULL:
                raise MemoryError("packet records")
            self.recs = grown
            self.recs_cap = max(1024, 2 * self.recs_cap)
        r = &self.recs[self.recs_len]
        r.start = start
        r.end = end
        r.msg = m
        r.seq = seq
        r.link = link
        r.wire = <int32_t>wire
        r.ptype = ptype
        self.recs_len += 1
        return 0

    def packet_records(self):
        """Every transmission of a packet on a link, in the order they started (record_packets):
        start_ps, end_ps (its tail left the sender), msg, seq (packet of the message), link,
        wire_bytes, ptype (cmemu.vocab.PKT_*). Empty unless the engine was made with record_packets."""
        n = self.recs_len
        out = {"start_ps": np.empty(n, dtype=np.int64), "end_ps": np.empty(n, dtype=np.int64),
               "msg": np.empty(n, dtype=np.int32), "seq": np.empty(n, dtype=np.int32),
               "link": np.empty(n, dtype=np.int32), "wire_bytes": np.empty(n, dtype=np.int32),
               "ptype": np.empty(n, dtype=np.uint8)}
        cdef int64_t[::1] st = out["start_ps"], en = out["end_ps"]
        cdef int32_t[::1] ms = out["msg"], sq = out["seq"], lk = out["link"], wr = out["wire_bytes"]
        cdef uint8_t[::1] pt = out["ptype"]
        cdef int64_t i
        for i in range(n):
            st[i] = self.recs[i].start
            en[i] = self.recs[i].end
            ms[i] = self.recs[i].msg
            sq[i] = self.recs[i].seq
            lk[i] = self.recs[i].link
            wr[i] = self.recs[i].wire
            pt[i] = self.recs[i].ptype
        return out

    def link_series(self):
        """Binned link counters as COO arrays: link, bin, bytes, busy_ps (flushes the bins)."""
        cdef int64_t link
        cdef int64_t n, i, k, w, lo, hi, j
        for link in range(self.n_links):
            self.series_flush(<int32_t>link, -1)
        # Rows by link (a counting sort, stable), then by bin within a link: a link's rows come
        # in bin order but for a few the message-level fabric adds to earlier bins; rows of one
        # (link, bin) are summed. As cmemu._core.merge_link_series does, without its copies.
        n = self.series_len
        cdef const SeriesRow* r = self.series
        pos_a = np.zeros(self.n_links + 1, dtype=np.int64)
        cdef int64_t[::1] pos = pos_a
        for i in range(n):
            pos[r[i].link + 1] += 1
        for k in range(self.n_links):
            pos[k + 1] += pos[k]
        start_a = pos_a[:-1].copy()
        bin_a = np.empty(n, dtype=np.int32)
        bytes_a = np.empty(n, dtype=np.int64)
        busy_a = np.empty(n, dtype=np.int64)
        cdef int32_t[::1] ob = bin_a
        cdef int64_t[::1] oy = bytes_a, ou = busy_a, st = start_a
        for i in range(n):
            k = pos[r[i].link]
            pos[r[i].link] = k + 1
            ob[k] = r[i].bin
            oy[k] = r[i].nbytes
            ou[k] = r[i].busy
        for link in range(self.n_links):
            lo, hi = st[link], pos[link]
            for j in range(lo + 1, hi):
                if ob[j] < ob[j - 1]:
                    order = np.argsort(bin_a[lo:hi], kind="stable") + lo
                    bin_a[lo:hi] = bin_a[order]
                    bytes_a[lo:hi] = bytes_a[order]
                    busy_a[lo:hi] = busy_a[order]
                    break
        link_a = np.empty(n, dtype=np.int32)
        cdef int32_t[::1] ol = link_a
        w = 0
        for link in range(self.n_links):
            for j in range(st[link], pos[link]):
                if w > 0 and ol[w - 1] == link and ob[w - 1] == ob[j]:
                    oy[w - 1] += oy[j]
                    ou[w - 1] += ou[j]
                else:
                    ol[w] = <int32_t>link
                    ob[w] = ob[j]
                    oy[w] = oy[j]
                    ou[w] = ou[j]
                    w += 1
        # The first w rows, as views: a copy would hold the series twice at the run's peak (the
        # 61-layer decode step: 31 M rows, 0.7 GB), and the rows left over are a few.
        return {"bin_ps": int(self.bin_ps), "link": link_a[:w], "bin": bin_a[:w], "bytes": bytes_a[:w],
                "busy_ps": busy_a[:w]}

    # -- link arbitration ------------------------------------------------------------------
    cdef inline int64_t next_voq(self, int32_t link, int64_t start, int64_t n) noexcept nogil:
        """The first non-empty VOQ of the link at or after position start, wrapping; -1 if none."""
        cdef int64_t base = self.lk[link].mask_base, words = (n + 63) >> 6, w, i
        cdef uint64_t bits
        w = start >> 6
        bits = self.voq_mask[base + w] & (~(<uint64_t>0) << (start & 63))
        for i in range(words + 1):
            if bits:
                return (w << 6) + cm_ctz64(bits)
            w += 1
            if w == words:
                w = 0
            bits = self.voq_mask[base + w]
        return -1

    cdef inline int64_t port_start(self, int32_t p, int32_t link) noexcept nogil:
        """Message-level fabric: when write packet p, at its source, would start on its port
        ``link`` (the first idle stretch from its issue time, or now, that holds it)."""
        cdef int64_t t = self.pkts[p].ready
        if t < self.now:
            t = self.now
        if self.pkts[p].wire != self.ser_wire or self.lk[link].rate != self.ser_rate:
            self.ser_wire = self.pkts[p].wire
            self.ser_rate = self.lk[link].rate
            self.ser_ps = serialisation_ps(self.ser_wire, self.ser_rate)
        return self.cal_find(&self.lk[link], t, self.ser_ps)

    cdef int64_t held_writes(self, int32_t link, int64_t wake) except -2:
        """Message-level fabric, the horizon: an endpoint's write packet has its path reserved
        once it would start on its port within the look-ahead, not when it is issued. Until then
        it waits in the port's queue (its VOQ from the source, in issue order; its issue time
        kept), and is looked at again when it would start (release_held). Reserved
        when issued, a window of packets (1,024, some 20 us of a die's ports) would take, at every
        switch output after the port, the slots before those of every die issued after it at
        the same time, however much earlier those reach the output; held, the paths are
        reserved in about the order the packets reach the wire, as the packet fabric sends them,
        and each port's queue on its own, as there (a busy port holds up no other). Reserves the
        port's held writes that start within the look-ahead; returns when the next one left would
        start (-1: none is held, or a read request is ahead of them, which try_transmit sends).
        Where one is left, the link wakes ``wake`` ps before it starts (-1: its endpoint's wake-up
        sees to it, release_held; the link's own wake-up is for a port past HELD_PORTS, or with a
        read request ahead)."""
        cdef int64_t q = self.lk[link].voq_base, start, row  # slot 0, VL 0: the source's requests
        cdef int32_t p
        while True:
            p = self.voq_head[q]
            if p < 0 or self.pkts[p].ptype != PKT_WRITE:
                return -1  # (a read request goes as on the packet fabric: try_transmit)
            start = self.port_start(p, link)
            if start > self.now + self.lookahead:
                if wake >= 0:
                    self.wake_link(link, start - wake)
                return start
            self.voq_head[q] = self.pkts[p].next
            if self.voq_head[q] < 0:
                self.voq_tail[q] = -1
                self.voq_mask[self.lk[link].mask_base] &= ~(<uint64_t>1)
            self.lk[link].queued -= 1
            row = self.mrow(self.pkts[p].msg)
            self.held_count[self.mt[row].ini] -= 1
            self.path_reserve(p, link, self.pkts[p].ready if self.pkts[p].ready > self.now else self.now, row)

    cdef int try_transmit(self, int32_t link) except -1:
        """Start the next packet on an idle link: round robin over its non-empty VOQs whose
        head packet fits in the receiver's credits. (On the message-level fabric, writes held
        at their port by the horizon go first: held_writes.)"""
        cdef int64_t base, q = 0, n, k, pos = 0, ser, scanned, wake = -1, arrive, rr, row = -1
        cdef int32_t p = -1, prev, vl, nxt, s, d
        if self.lk[link].queued == 0 or not self.lk[link].alive:
            return 0
        if self.lookahead == 0 and self.lk[link].busy_until > self.now:
            self.wake_link(link, self.lk[link].busy_until)
            return 0
        if self.lookahead > 0:
            self.held_writes(link, self.lookahead)
            if self.lk[link].queued == 0:
                return 0
        base = self.lk[link].voq_base
        n = self.lk[link].voq_slots * NUM_VLS
        # Round robin from rr over the non-empty VOQs (set bits of the link's mask), taking the
        # first whose head packet fits the receiver's credits.
        scanned = 0
        rr = self.lk[link].rr  # (in [0, n): the wraps below are one subtraction, not a division)
        while scanned < n:
            k = rr + scanned
            pos = self.next_voq(link, k - n if k >= n else k, n)
            if pos < 0:
                break
            k = pos - rr + n  # distance from rr in round-robin order
            if k >= n:
                k -= n
            if k < scanned:
                break  # wrapped all the way round
            q = base + pos
            p = self.voq_head[q]
            if self.lookahead > 0 and self.pkts[p].ptype == PKT_WRITE:
                pass  # held by the horizon (held_writes has its wake-up)
            elif self.pkts[p].ready > self.now:
                if wake < 0 or self.pkts[p].ready < wake:
                    wake = self.pkts[p].ready
            elif self.credits[link * NUM_VLS + self.pkts[p].vl] >= self.pkts[p].wire:
                break
            p = -1
            scanned = k + 1
        if p < 0:
            # Every head waits: for credits (a credit return will call again), or for its issue
            # time (wake up then).
            if wake >= 0:
                self.wake_link(link, wake)
            return 0
        ser = serialisation_ps(self.pkts[p].wire, self.lk[link].rate)
        if self.lookahead > 0:
            # Message-level fabric: the link is busy when its calendar says so (writes reserved
            # ahead, packets sent); the packet goes in the first idle stretch that holds it.
            arrive = self.cal_find(&self.lk[link], self.now, ser)
            if arrive > self.now:
                self.wake_link(link, arrive)
                return 0
        self.voq_head[q] = self.pkts[p].next
        if self.voq_head[q] < 0:
            self.voq_tail[q] = -1
            self.voq_mask[self.lk[link].mask_base + (pos >> 6)] &= ~((<uint64_t>1) << (pos & 63))
        else:
            # The next scan of this VOQ reads its new head: a cache miss a scan, unless it is
            # fetched now, a packet time ahead.
            cm_prefetch(&self.pkts[self.voq_head[q]])
        self.lk[link].queued -= 1
        self.lk[link].rr = <int32_t>(pos + 1 if pos + 1 < n else 0)
        vl = self.pkts[p].vl
        self.credits[link * NUM_VLS + vl] -= self.pkts[p].wire
        if self.lookahead > 0:
            self.cal_take(link, self.now, ser, self.pkts[p].wire)
        else:
            self.lk[link].busy_until = self.now + ser
            self.count_transmission(link, self.now, ser, self.pkts[p].wire)
        if self.record_packets:
            self.record(self.pkts[p].msg, self.pkts[p].seq, link, self.now, self.now + ser, self.pkts[p].wire,
                        self.pkts[p].ptype)
        self.packets_sent += 1
        prev = self.pkts[p].in_link
        self.pkts[p].in_link = link
        arrive = self.now + ser + self.lk[link].lat
        nxt = -1
        if self.lk[link].own_queue:
            # Cut the arrival event at a switch: the packet joins the next link's queue now,
            # not to leave before it has arrived (its ready time). The queue is this link's
            # alone (L1, L2: one per input link), which delivers in order, so the queue's order
            # is the order of arrival. (At a switch with one FIFO for all inputs it would not be.)
            self.leg_ends(p, &s, &d)
            nxt = self.route_link(self.m_path(self.pkts[p].msg), s, d, self.pkts[p].plane, self.pkts[p].uplink,
                                  self.pkts[p].hop + 1)
            if nxt >= 0 and not self.lk[nxt].alive:
                nxt = -1
        if nxt >= 0:
            self.pkts[p].hop += 1
            self.pkts[p].ready = arrive
            self.voq_append(nxt, self.lk[link].in_slot, p)
            if self.lookahead > 0 or arrive > self.lk[nxt].busy_until:
                self.wake_link(nxt, arrive)
            else:
                self.wake_link(nxt, self.lk[nxt].busy_until)
        else:
            if self.lk[link].sink_ep >= 0 and self.pkts[p].ptype == PKT_WRITE:
                # Its arrival, worked out below (fabric.direct_sinks). An AIV's too: its ring
                # slot and its waits take the ack's time (aiv_ready), not when the books close.
                row = self.mrow(self.pkts[p].msg)
                nxt = -2
            else:
                self.push(arrive, EV_PKT_ARRIVE, p)
        if self.lk[link].queued > 0:
            self.wake_link(link, self.now + ser)
        if prev >= 0:
            # The packet left prev's receive buffer: its credit goes back to prev's sender.
            self.credits[prev * NUM_VLS + vl] += self.pkts[p].wire
            self.try_transmit(prev)
        if nxt == -2:
            # A write to a die that takes it when it arrives, on a link whose credits never run
            # out: the arrival would give its credit back and put it in memory, nothing else. So
            # no event: its credit is back now (nothing waits for it), and it is in memory, with
            # its ack worked out, from its arrival, as on the message-level fabric.
            self.credits[link * NUM_VLS + vl] += self.pkts[p].wire
            self.write_absorbed(p, arrive + self.ep_write_lat[self.lk[link].sink_ep], -1, row)
        return 0

    # -- handlers --------------------------------------------------------------------------
    cdef int on_op_ready(self, int32_t op) except -1:
        """Dependencies done: start now if the op's cores are free and nobody waits before it."""
        cdef OpInfo* o = &self.ops[op]
        cdef int32_t die = o.die
        if die < self.die_failed.shape[0] and self.die_failed[die]:
            raise DieFailedError(op)
        if o.aic > 0 or o.aiv > 0:
            if self.core_qhead[die] >= 0 or self.free_aic[die] < o.aic or self.free_aiv[die] < o.aiv:
                o.qnext = -1
                if self.core_qtail[die] < 0:
                    self.core_qhead[die] = op
                else:
                    self.ops[self.core_qtail[die]].qnext = op
                self.core_qtail[die] = op
                return 0
            self.free_aic[die] -= o.aic
            self.free_aiv[die] -= o.aiv
        return self.start_op(op)

    cdef int start_op(self, int32_t op) except -1:
        cdef int64_t t = self.now, start, i
        cdef int32_t msg, r, left = 0
        cdef OpInfo* o = &self.ops[op]
        cdef uint8_t kind = o.kind
        o.start = t
        if kind == OP_KIND_COMP:
            if o.hbm:
                self.hbm_join(op)
            else:
                self.push(t + o.dur, EV_OP_DONE, op)
        elif kind == OP_KIND_MEM and o.hbm:
            self.hbm_join(op)  # it shares the die's HBM; it ends one access latency after
        elif kind == OP_KIND_MEM:
            r = o.u
            start = t if t > self.res_free[r] else self.res_free[r]
            self.res_free[r] = start + o.dur
            self.push(start + o.dur + self.op_lat_ps[op], EV_OP_DONE, op)
        elif kind == OP_KIND_SEND:
            # It waits for the acks of its writes; the holder of read data has nothing to do.
            for i in range(self.op_mptr[op], self.op_mptr[op + 1]):
                if self.m_kind(self.op_midx[i]) == MSG_WRITE:
                    left += 1
            o.u = left
            o.tmax = t
            if left == 0:
                self.push(t, EV_OP_DONE, op)
            for i in range(self.op_mptr[op], self.op_mptr[op + 1]):
                msg = self.op_midx[i]
                if self.m_kind(msg) == MSG_WRITE:
                    self.message_start(i)
        else:  # OP_KIND_RECV: it waits for every message not yet delivered (u of them were, by tmax)
            if t > o.tmax:
                o.tmax = t
            left = <int32_t>(self.op_mptr[op + 1] - self.op_mptr[op]) - o.u
            o.u = left
            if left == 0:
                self.push(o.tmax, EV_OP_DONE, op)
            for i in range(self.op_mptr[op], self.op_mptr[op + 1]):
                msg = self.op_midx[i]
                if self.m_kind(msg) != MSG_WRITE:
                    self.message_start(i)
        return 0

    # -- HBM shared by a die's running ops -------------------------------------------------
    cdef void hbm_rebase(self, int32_t d, int64_t num, int64_t den) noexcept nogil:
        """Die d's share clock back to 0, and its capped ops' targets with it (only differences
        of them count): after about 2**51 ps of its ops capped without a break, before it could
        overflow."""
        cdef int64_t base = self.hbm_k[d]
        cdef int32_t h = self.hbm_first[d]
        while h >= 0:
            if den > 0 and <cm_int128>self.hr[h].rate * den > num:
                self.hr[h].at -= base
            h = self.hr[h].next
        self.hbm_k[d] = 0

    cdef int hbm_change(self, int32_t d, int32_t joiner) except -1:
        """Die d's running ops changed (``joiner`` joined, or -1: one left): a new share, and the
        end of the op that ends first at it scheduled.

        The arithmetic, the reference's too. An uncapped op keeps the time it ends at full
        speed (it progresses one ps of its alone time a ps). A capped op of demand q, with r ps
        of its alone time left, is given a target on the die's share clock K, K + ceil(r q S /
        C) (C the capacity, S = HBM_SCALE); K runs at S level / C a ps (floor(dt S num / (den C))
        over each dt between changes; 0 while no op is capped), so every capped op moves at
        level / q of its speed. Capped again uncapped, it has ceil((target - K) C / (q S)) ps
        left. The first to end: the uncapped op with the least end time, or the capped one with
        the least target, at now + ceil((target - K) den C / (num S)); ties go to the lower row.
        """
        cdef int64_t onum = self.hbm_num[d], oden = self.hbm_den[d], num = 0, den = 0, cap = self.hbm_cap[d]
        cdef int64_t dt = self.now - self.hbm_t[d], k, x, q, left, fin = 0, fc, free = cap, m = self.hbm_n[d]
        cdef int32_t h, bu = -1, bc = -1, best = -1
        cdef bint was, now_capped = False, fits = self.hbm_sum[d] <= cap
        if oden > 0 and dt > 0:
            self.hbm_k[d] += <int64_t>((<cm_int128>dt * HBM_SCALE * onum) // (<cm_int128>oden * cap))
            if self.hbm_k[d] > HBM_REBASE:
                self.hbm_rebase(d, onum, oden)
        self.hbm_t[d] = self.now
        k = self.hbm_k[d]
        # One walk, lightest first: the new water level (each op gets its demand while it fits in
        # an even share of what the lighter ones leave; from the first that does not, every op
        # is capped: they share what is left evenly, num bytes/s among den ops; the demands fit:
        # den = 0), each op's state in the new share, and the first to end.
        h = self.hbm_first[d]
        while h >= 0:
            q = self.hr[h].rate
            if not fits and not now_capped:
                if <cm_int128>q * m <= free:
                    free -= q
                    m -= 1
                else:
                    now_capped = True
                    num, den = free, m
            if h == joiner:
                left = self.ops[self.hr[h].op].dur
                if now_capped:
                    self.hr[h].at = k + <int64_t>((<cm_int128>left * q * HBM_SCALE + cap - 1) // cap)
                else:
                    self.hr[h].at = self.now + left
            else:
                was = oden > 0 and <cm_int128>q * oden > onum
                if was and not now_capped:
                    x = self.hr[h].at - k if self.hr[h].at > k else 0
                    self.hr[h].at = self.now + <int64_t>((<cm_int128>x * cap + q * HBM_SCALE - 1) // (<cm_int128>q * HBM_SCALE))
                elif now_capped and not was:
                    left = self.hr[h].at - self.now if self.hr[h].at > self.now else 0
                    self.hr[h].at = k + <int64_t>((<cm_int128>left * q * HBM_SCALE + cap - 1) // cap)
            if now_capped:
                if bc < 0 or self.hr[h].at < self.hr[bc].at or (self.hr[h].at == self.hr[bc].at and h < bc):
                    bc = h
            elif bu < 0 or self.hr[h].at < self.hr[bu].at or (self.hr[h].at == self.hr[bu].at and h < bu):
                bu = h
            h = self.hr[h].next
        self.hbm_num[d] = num
        self.hbm_den[d] = den
        if den == 0:
            self.hbm_k[d] = 0  # no target on it is left
        self.hbm_record(d)
        if bu >= 0:
            best, fin = bu, self.hr[bu].at
        if bc >= 0:
            x = self.hr[bc].at - k if self.hr[bc].at > k else 0
            fc = self.now + <int64_t>((<cm_int128>x * den * cap + <cm_int128>num * HBM_SCALE - 1)
                                      // (<cm_int128>num * HBM_SCALE))
            if best < 0 or fc < fin or (fc == fin and bc < best):
                best, fin = bc, fc
        self.hbm_next_op[d] = best
        if best >= 0 and self.hr[best].end != fin:
            self.hr[best].end = fin
            self.push(fin, EV_HBM_DONE, best)
        return 0

    cdef int hbm_record(self, int32_t d) except -1:
        """Die d's share after a change, if it differs from its last record (before any, every op
        ran at full speed): what the HBM series needs to know each op's progress."""
        cdef int64_t* grown
        if self.hbm_den[d] == self.hbm_last_den[d] and self.hbm_num[d] == self.hbm_last_num[d]:
            return 0
        self.hbm_last_num[d] = self.hbm_num[d]
        self.hbm_last_den[d] = self.hbm_den[d]
        if self.hrec_len == self.hrec_cap:
            grown = <int64_t*>realloc(self.hrec, 4 * max(256, 2 * self.hrec_cap) * sizeof(int64_t))
            if grown == NULL:
                raise MemoryError("HBM share records")
            self.hrec = grown
            self.hrec_cap = max(256, 2 * self.hrec_cap)
        self.hrec[4 * self.hrec_len] = d
        self.hrec[4 * self.hrec_len + 1] = self.now
        self.hrec[4 * self.hrec_len + 2] = self.hbm_num[d]
        self.hrec[4 * self.hrec_len + 3] = self.hbm_den[d]
        self.hrec_len += 1
        return 0

    def hbm_clock(self):
        """Each die's HBM share (see hbm_change), in time order: from ``t_ps`` on, the die's running
        ops whose demand is above the level ``shared_byte_per_s / sharers`` each get the level and
        run at level / demand of their speed, the others run at full speed (``sharers`` 0: all of
        them). Written at every change; before a die's first record its ops ran at full speed.
        With each die's capacity (bytes/s)."""
        cdef int64_t i, n = self.hrec_len
        die_a = np.empty(n, dtype=np.int32)
        t_a = np.empty(n, dtype=np.int64)
        num_a = np.empty(n, dtype=np.int64)
        den_a = np.empty(n, dtype=np.int64)
        cdef int32_t[::1] od = die_a
        cdef int64_t[::1] ot = t_a, on = num_a, oq = den_a
        for i in range(n):
            od[i] = <int32_t>self.hrec[4 * i]
            ot[i] = self.hrec[4 * i + 1]
            on[i] = self.hrec[4 * i + 2]
            oq[i] = self.hrec[4 * i + 3]
        return {"die": die_a, "t_ps": t_a, "shared_byte_per_s": num_a, "sharers": den_a,
                "capacity": np.asarray(self.hbm_cap).copy()}

    cdef int hbm_join(self, int32_t op) except -1:
        """An op with HBM traffic starts: it joins its die's share, in order of (demand, row)."""
        cdef int32_t d = self.ops[op].die, h = self.ops[op].u, x, prev = -1
        self.hbm_sum[d] += self.hr[h].rate
        self.hbm_n[d] += 1
        x = self.hbm_first[d]
        while x >= 0 and (self.hr[x].rate < self.hr[h].rate or (self.hr[x].rate == self.hr[h].rate and x < h)):
            prev = x
            x = self.hr[x].next
        self.hr[h].prev = prev
        self.hr[h].next = x
        if prev >= 0:
            self.hr[prev].next = h
        else:
            self.hbm_first[d] = h
        if x >= 0:
            self.hr[x].prev = h
        return self.hbm_change(d, h)

    cdef int on_hbm_done(self, int32_t h) except -1:
        """The scheduled end of a die's first finisher (row h), unless a later change moved it."""
        cdef int32_t op = self.hr[h].op
        cdef int32_t d = self.ops[op].die
        if self.hbm_next_op[d] != h or self.hr[h].end != self.now:
            if self.hr[h].end == self.now and self.hbm_next_op[d] != h:
                self.hr[h].end = -1  # its pending end is gone: a later schedule makes a new one
            return 0  # superseded
        self.hbm_sum[d] -= self.hr[h].rate
        self.hbm_n[d] -= 1
        if self.hr[h].prev >= 0:
            self.hr[self.hr[h].prev].next = self.hr[h].next
        else:
            self.hbm_first[d] = self.hr[h].next
        if self.hr[h].next >= 0:
            self.hr[self.hr[h].next].prev = self.hr[h].prev
        self.hbm_change(d, -1)
        if self.ops[op].kind == OP_KIND_MEM:  # its data is moved; it ends one access latency later
            self.push(self.now + self.op_lat_ps[op], EV_OP_DONE, op)
            return 0
        return self.on_op_done(op)

    cdef int deliver(self, int32_t m, int64_t t) except -1:
        """Message m is delivered at t (now or later): its waiting receive may end then. A receive
        that started before counted it among those it waits for (start_op) and ends at the latest
        of its messages' times; one that starts later counts it as delivered (u), its time in
        tmax. (A write's packets bring their times to the receive's tmax as they land: see
        write_absorbed.)"""
        cdef int32_t r = self.m_recv_op(m)
        cdef OpInfo* o
        self.messages_delivered += 1
        if m < self.n_record and t > self.msg_delivered[m]:
            self.msg_delivered[m] = t
        if r >= 0 and self.ops[r].kind == OP_KIND_RECV:
            o = &self.ops[r]
            if t > o.tmax:
                o.tmax = t
            if o.start < 0:
                o.u += 1
                return 0
            o.u -= 1
            if o.u == 0:
                self.push(o.tmax, EV_OP_DONE, r)
        return 0

    cdef int message_start(self, int64_t i) except -1:
        """The message at op_midx[i] joins its initiator's queue now; its first packet leaves no
        earlier than its op's start plus the initiator's start-up (see inject): it waits in its
        port's queue. It joins its op's run when it follows it there."""
        cdef int32_t msg = self.op_midx[i]
        cdef int64_t row = self.mrow(msg)
        cdef int32_t ini = self.mt[row].ini
        cdef Ini* q = &self.ini[ini]
        cdef int64_t* grown
        cdef int64_t k, last
        if q.n > 0:
            last = (q.head + q.n - 1) & (q.cap - 1)
            if q.buf[2 * last + 1] == i:
                q.buf[2 * last + 1] = i + 1
                return self.inject(ini)
        if q.n == q.cap:  # grow the ring, its runs in order from 0
            grown = <int64_t*>malloc(2 * max(8, 2 * q.cap) * sizeof(int64_t))
            if grown == NULL:
                raise MemoryError("initiator queue")
            for k in range(q.n):
                grown[2 * k] = q.buf[2 * ((q.head + k) & (q.cap - 1))]
                grown[2 * k + 1] = q.buf[2 * ((q.head + k) & (q.cap - 1)) + 1]
            free(q.buf)
            q.buf = grown
            q.head = 0
            q.cap = max(8, 2 * q.cap)
        last = (q.head + q.n) & (q.cap - 1)
        q.buf[2 * last] = i
        q.buf[2 * last + 1] = i + 1
        q.n += 1
        if q.n == 1:  # it is the first
            self.head_ahead(q)
        return self.inject(ini)

    cdef inline void head_ahead(self, Ini* q) noexcept nogil:
        """Its queue's first message has changed (the one before was taken, or it joined an
        empty queue): its id, table row and op shift into the initiator's record (Ini.m_head)."""
        cdef int32_t m
        cdef const Seg* g
        if q.n > 0:
            m = self.op_midx[q.buf[2 * q.head]]
            g = &self.segs[self.mseg[m]]
            q.m_head = m
            q.row = m - g.lo + g.row
            q.shift = g.shift
            cm_prefetch(&self.mt[q.row])  # read when it is issued, often straight after this one

    cdef int path_reserve(self, int32_t p, int32_t link, int64_t t, int64_t row) except -1:
        """Message-level fabric: write packet p, issued at t onto its first link ``link``, has its
        whole path reserved now (path_hops) and is absorbed at its destination (write_absorbed);
        none of it is an event. ``row``: its message's table row."""
        cdef int64_t ack
        t = self.path_hops(self.pkts[p].msg, self.pkts[p].seq, row, link, t, self.pkts[p].wire,
                           self.pkts[p].payload, self.pkts[p].plane, self.pkts[p].uplink, &ack, 0, 8, 0)
        return self.write_absorbed(p, t, ack, row)

    cdef inline int64_t path_hops(self, int32_t m, int32_t seq, int64_t row, int32_t link, int64_t t, int64_t wire,
                                  int64_t payload, int plane, int uplink, int64_t* ack_out,
                                  int first_hop, int last_hop, int64_t held) except -1:
        """Message-level fabric: packet ``seq`` of write message m (table row ``row``; ``wire``
        bytes on the wire, ``payload`` of them data, on sub-plane ``plane`` and L1 uplink
        ``uplink``), issued at t onto its first link ``link``, has its whole path reserved, link
        by link, each in the link's idle time at or after the packet is there (store and forward,
        as on the packet fabric; see cal_take). An initiator's packets reach its own links in
        issue order, as they would; a later link sees them in the order their initiators issued
        them, and those issued first keep their slots, but a packet may use any idle time before
        them. At the destination a CPU's sink takes it likewise (at its rate, from a calendar of
        its own). Returns when it is in memory, one write latency later; *ack_out: its ack's
        trip back, ps, where the path's links give it (-1: ack_trip's).

        Only hops ``first_hop`` to ``last_hop`` - 1 (0 and 8: all of them) are reserved
        (aiv_write, on_tail): from ``link`` the path's first link, at t the packet there, having
        started on the link before at ``held``; with last_hop < 8, returns when it reaches the
        link after hop last_hop - 1 (*ack_out -1)."""
        cdef int32_t s = self.mt[row].src, d = self.mt[row].dst
        cdef int32_t links[8]
        cdef int hop = 0, n = 0, path = self.mt[row].path
        cdef int64_t ser = 0, rate = 0, b = 0, ack = -1
        cdef LinkInfo* L
        # Its links are known before any is reserved: fetch their lines (and their calendars'
        # ends, and the open counter bin of its issue time) together rather than one hop after
        # another; what a hop reads is then mostly in cache.
        if path == PATH_UB:
            n = self.ub_links(s, d, plane, uplink, links)  # (links[0] is ``link``)
            for hop in range(n):
                if links[hop] < 0:
                    n = hop
                    break
                cm_prefetch(&self.lk[links[hop]])
        else:
            while link >= 0 and n < 8:
                links[n] = link
                cm_prefetch(&self.lk[link])
                n += 1
                link = self.route_link(path, s, d, plane, uplink, n)
            if link >= 0:
                raise ValueError("a path of more than 8 links")
        if self.backpressure:  # the receive buffers' books are in the links' second lines
            for hop in range(n):
                cm_prefetch(<char*>&self.lk[links[hop]] + 64)
        if self.bin_ps > 0:
            b = 2 * (self.bin_of(t) & (RING - 1))  # (bin_of >= 0: % RING)
        for hop in range(n):
            L = &self.lk[links[hop]]
            if L.cal_n > 0:
                cm_prefetch(L.cal + 2 * L.cal_n - 2)
            if self.backpressure and L.buf_n > 0:
                cm_prefetch(L.buf + 2 * L.buf_n - 2)
            if self.bin_ps > 0:
                cm_prefetch(self.ring + <int64_t>links[hop] * RING * 2 + b)
        if path == PATH_UB and self.ub_mirror and last_hop >= n:
            ack = 0  # (from hop first_hop on)
        if last_hop < n:
            n = last_hop
        for hop in range(first_hop, n):
            link = links[hop]
            if self.lk[link].rate != rate:  # the links of a path mostly have one rate
                rate = self.lk[link].rate
                if wire != self.ser_wire or rate != self.ser_rate:  # and packets one size
                    self.ser_wire = wire
                    self.ser_rate = rate
                    self.ser_ps = serialisation_ps(wire, rate)
                ser = self.ser_ps
            t = self.cal_take(link, t, ser, wire)
            if hop > 0 and self.lk[links[hop - 1]].buf_limit > 0:
                # It waited in the previous link's receive buffer until it started here.
                self.buf_hold(links[hop - 1], held, t - ser, wire)
            held = t - ser
            if self.record_packets:
                self.record(m, seq, link, t - ser, t, wire, PKT_WRITE)
            t += self.lk[link].lat
            if ack >= 0:  # link_ack_of, from the link's line (its rate and latency) in hand
                if rate != self.ack_rate or path != self.ack_path:
                    self.ack_rate = rate
                    self.ack_path = path
                    self.ack_ps = serialisation_ps(self.wire_bytes(path, PKT_ACK, 0), rate)
                ack += self.ack_ps + self.lk[link].lat
        self.packets_sent += n - first_hop
        ack_out[0] = ack
        if last_hop < 8:
            return t
        rate = self.ep_sink_rate[d]
        if rate > 0:  # the sink takes it in its idle time too
            ser = serialisation_ps(payload, rate)
            t = self.cal_reserve(&self.sk[d], t, ser) + ser
        return t + self.ep_write_lat[d]

    cdef inline int ub_links(self, int32_t s, int32_t d, int plane, int uplink, int32_t* links) noexcept nogil:
        """route_link's UB path from endpoint s to endpoint d on sub-plane ``plane`` and L1 uplink
        ``uplink``, its links worked out together into ``links``; returns how many (2 within a
        node, 4 across)."""
        cdef int32_t ns = self.ep_node[s], nd = self.ep_node[d]
        links[0] = self.t_ep_up[s * self.P + plane]
        if ns == nd:
            links[1] = self.t_ep_down[d * self.P + plane]
            return 2
        links[1] = self.t_l1_uplink[(ns * self.P + plane) * self.U + uplink]
        links[2] = self.l2_down_link(ns, nd, plane, uplink)
        links[3] = self.t_ep_down[d * self.P + plane]
        return 4

    cdef inline void spray_next(self, int32_t* plane, int32_t* uplink) noexcept nogil:
        """The path after (plane, uplink) in spraying's (uplink, plane) order."""
        plane[0] += 1
        if plane[0] == self.P:
            plane[0] = 0
            uplink[0] += 1
            if uplink[0] == self.U:
                uplink[0] = 0

    cdef int write_absorbed(self, int32_t p, int64_t t, int64_t ack=-1, int64_t row=-1) except -1:
        """Write packet p is in its destination's memory at t. The message is delivered with its
        last packet, at the latest of its packets' times (they may come in any order on the
        message-level fabric). The packet's ack is computed, not simulated: it is back after its
        trip (``ack`` ps when the caller knows it, else ack_trip), which frees its window slot
        (see collect_acks) and ends the send op no earlier; the message is acknowledged when its
        last ack is. (``row``: the message's row in its table, when the caller has it.)"""
        cdef int32_t m = self.pkts[p].msg, s, r, shift = self.segs[self.mseg[m]].shift
        if row < 0:
            row = self.mrow(m)
        s, r = self.mt[row].ini, self.mt[row].recv
        if r >= 0:
            r += shift
        if m < self.n_record and t > self.msg_delivered[m]:
            self.msg_delivered[m] = t
        if r >= 0 and t > self.ops[r].tmax and self.ops[r].kind == OP_KIND_RECV:
            self.ops[r].tmax = t  # the latest of its messages' packets so far (deliver)
        if self.msg_left[m] == 1:
            self.deliver(m, t)
        t += ack if ack >= 0 else self.ack_trip(m, self.pkts[p].plane, self.pkts[p].uplink)
        if (s >= self.n_eps):
            if self.lookahead == 0:
                self.ack_push(s, t)  # (on the message-level fabric an AIV keeps no window: inject)
            self.aiv_done(s, self.pkts[p].iseq, t)
        else:
            self.ack_push(s, t)
        if (self.ini[s].n > 0 and self.ini[s].outstanding >= self.ini[s].max_out
                and not ((s >= self.n_eps) and self.lookahead > 0)):
            self.wake_at(s, t)  # its initiator waits for a window slot
        r = self.mt[row].send
        if r >= 0:
            r += shift
        self.ack_back_op(r, t)
        self.packet_release(p)
        self.msg_left[m] -= 1
        if self.msg_left[m] == 0:
            self.acked_op(r)
        return 0

    cdef int aiv_write(self, int32_t ep, int32_t m, int64_t row) except -1:
        """Message-level fabric: AIV initiator ep issues all the packets of its write message m
        (table row ``row``) now, as inject would one after the other (its issue times, its
        paths, each reserved whole: path_hops), and takes the message off its queue. Nothing
        stops an AIV between the packets of a message there (its waits are before a message:
        aiv_ready; it keeps no window), and what write_absorbed does for each packet ends in
        nothing before the last, so the message is absorbed once (message_absorbed): no packet
        is made (the inject loop, the packet and write_absorbed per packet were a quarter of the
        decode step's instructions).

        With back-pressure, a write to another node has only its first link reserved now; the
        rest of each packet's path (its tail) is reserved later, by the time its two extra hops
        take (L1 to L2 to L1), so that at its last link, the die's, where incast queues and
        packets from the die's own node meet those from the others, it is reserved in about the
        order the packets arrive there, as those of a write within the node issued meanwhile are
        (tail_due, run_tails). Its packets wait, made, in the tails' queue."""
        cdef Ini* q = &self.ini[ep]
        cdef int path = self.mt[row].path, plane, uplink
        cdef int32_t s = self.mt[row].src, d = self.mt[row].dst, first, iseq = q.iseq - 1
        cdef int64_t mtu = self.path_mtu[path], nbytes = self.mt[row].nbytes, seq, payload, wire
        cdef int64_t start = self.ops[self.mt[row].send + q.shift].start + q.startup, t, ack
        cdef int64_t last = -1, acked = -1, reach = -1
        cdef int32_t shift = q.shift, npk = q.npk  # (the queue's next message takes q's)
        cdef int32_t p, head = -1, tail = -1
        cdef bint split = (self.backpressure and path == PATH_UB and not self.links_down
                           and self.ep_node[s] != self.ep_node[d])
        cm_prefetch(q.buf + 2 * q.head)  # (head_ahead's, once its packets are reserved)
        self.prefetch_paths(q, row)
        for seq in range(q.npk):
            payload = nbytes - seq * mtu
            if payload > mtu:
                payload = mtu
            wire = q.wire if payload == q.wpay else self.wire_bytes(path, PKT_WRITE, payload)
            self.packet_path(q, m, seq, -1, row, &plane, &uplink)
            # One issue time after the previous packet, not before its message's start.
            if q.issue_free < self.now:
                q.issue_free = self.now
            if q.issue_free < start:
                q.issue_free = start
            t = q.issue_free
            q.issue_free += q.issue[MSG_WRITE]
            first = self.route_link(path, s, d, plane, uplink, 0)
            if split:  # its first link; its tail waits (on_tail)
                t = self.path_hops(m, <int32_t>seq, row, first, t, wire, payload, plane, uplink, &ack, 0, 1, 0)
                p = self.packet_new()
                self.pkts[p].msg = m
                self.pkts[p].seq = <int32_t>seq
                self.pkts[p].wire = <int32_t>wire
                self.pkts[p].payload = <int32_t>payload
                self.pkts[p].plane = <uint8_t>plane
                self.pkts[p].uplink = uplink
                self.pkts[p].iseq = iseq
                self.pkts[p].in_link = first
                self.pkts[p].ready = t  # at the L1 chip
                if tail >= 0:
                    self.pkts[tail].next = p
                else:
                    head = p
                tail = p
                if reach < 0 or t < reach:
                    reach = t
                continue
            t = self.path_hops(m, <int32_t>seq, row, first, t, wire, payload, plane, uplink, &ack, 0, 8, 0)
            if t > last:
                last = t
            t += ack if ack >= 0 else self.ack_trip(m, plane, uplink)
            if t > acked:
                acked = t
        q.seq = 0  # on to the next message
        q.buf[2 * q.head] += 1
        if q.buf[2 * q.head] == q.buf[2 * q.head + 1]:
            q.head = (q.head + 1) & (q.cap - 1)
            q.n -= 1
        self.head_ahead(q)
        if split:
            return self.tq_add(self.tail_due(head, reach), head, tail)
        return self.message_absorbed(m, row, shift, ep, iseq, npk, last, acked)

    cdef int64_t tail_due(self, int32_t p, int64_t reach) noexcept nogil:
        """When the tails of a write to another node whose first links were reserved now (its
        first packet p; the first of them at its L1 chip at ``reach``) are reserved: the time its
        packet takes on the two hops a packet within the node does not have (L1 to L2, L2 to L1:
        serialisation and latency each), from now, rounded up to the event wheel's bucket (the
        tails due in one are reserved together: one engine event); no later than ``reach``
        (nothing is reserved on a link before now)."""
        cdef int32_t m = self.pkts[p].msg
        cdef int32_t links[4]
        cdef int64_t row = self.mrow(m), due = self.now, k
        self.ub_links(self.mt[row].src, self.mt[row].dst, self.pkts[p].plane, self.pkts[p].uplink, links)
        for k in range(1, 3):
            due += serialisation_ps(self.pkts[p].wire, self.lk[links[k]].rate) + self.lk[links[k]].lat
        due = ((due >> BUCKET_BITS) + 1) << BUCKET_BITS
        return reach if due > reach else due

    cdef int tq_add(self, int64_t due, int32_t head, int32_t last) except -1:
        """Queue a chain of tails (packets head to last, linked by next) due at ``due``: joined
        to the last chain if that one is due then too, else in due order, after those due at
        the same time."""
        cdef int64_t j, k, k1, mask = self.tq_cap - 1
        if self.tq_len > 0:
            k = (self.tq_head + self.tq_len - 1) & mask
            if self.tq_due[k] == due:
                self.pkts[self.tq_last[k]].next = head
                self.tq_last[k] = last
                return 0
        if self.tq_len == self.tq_cap:
            self.tq_grow()
            mask = self.tq_cap - 1
        j = self.tq_len  # from the back: they mostly come in order
        while j > 0 and self.tq_due[(self.tq_head + j - 1) & mask] > due:
            k = (self.tq_head + j - 1) & mask
            k1 = (k + 1) & mask
            self.tq_due[k1] = self.tq_due[k]
            self.tq_chain[k1] = self.tq_chain[k]
            self.tq_last[k1] = self.tq_last[k]
            j -= 1
        k = (self.tq_head + j) & mask
        self.tq_due[k] = due
        self.tq_chain[k] = head
        self.tq_last[k] = last
        self.tq_len += 1
        return 0

    cdef int tq_grow(self) except -1:
        cdef int64_t cap = 64 if self.tq_cap == 0 else 2 * self.tq_cap, i, k
        cdef int64_t* due = <int64_t*>malloc(cap * sizeof(int64_t))
        cdef int32_t* chain = <int32_t*>malloc(cap * sizeof(int32_t))
        cdef int32_t* last = <int32_t*>malloc(cap * sizeof(int32_t))
        if due == NULL or chain == NULL or last == NULL:
            free(due)
            free(chain)
            free(last)
            raise MemoryError("the tails' queue")
        for i in range(self.tq_len):
            k = (self.tq_head + i) & (self.tq_cap - 1)
            due[i] = self.tq_due[k]
            chain[i] = self.tq_chain[k]
            last[i] = self.tq_last[k]
        free(self.tq_due)
        free(self.tq_chain)
        free(self.tq_last)
        self.tq_due = due
        self.tq_chain = chain
        self.tq_last = last
        self.tq_head = 0
        self.tq_cap = cap
        return 0

    cdef inline int64_t peek_time(self) except -2:
        """The time of the next event (INT64_MAX: none), without taking it."""
        cdef int64_t t = INT64_MAX
        if self.fifo_len > 0:
            t = self.fifo[self.fifo_head].time
        if self.act_head == self.act_len and (self.wheel_count > 0 or self.heap_len > 0):
            self.refill()
        if self.act_head < self.act_len and self.act[self.act_head].time < t:
            t = self.act[self.act_head].time
        return t

    cdef int run_tails(self, int64_t t) except -1:
        """Reserve the tails due by the next event (at t, peek_time), before it: those due at one
        time together (one event, counted as EV_TAIL), in the order they were queued, then what
        they schedule for that time."""
        cdef int64_t due
        cdef int32_t p
        while self.tq_len > 0 and self.tq_due[self.tq_head] <= t:
            due = self.tq_due[self.tq_head]
            if due > self.now:
                self.now = due
                if self.bin_ps > 0 and self.now - self.bin_start >= self.bin_ps:
                    self.bin_now = self.now // self.bin_ps
                    self.bin_start = self.bin_now * self.bin_ps
            self.events += 1
            self.kind_count[EV_TAIL] += 1
            while self.tq_len > 0 and self.tq_due[self.tq_head] == due:
                p = self.tq_chain[self.tq_head]
                self.tq_head = (self.tq_head + 1) & (self.tq_cap - 1)
                self.tq_len -= 1
                while p >= 0:  # message by message
                    p = self.on_tail(p)
            t = self.peek_time()
        return 0

    cdef int32_t on_tail(self, int32_t p) except -2:
        """The tails of the packets of one AIV write message (those of the chain from p that are
        its): each reserved from its L1 chip on (path_hops from hop 1, its time in the L1 buffer
        counted from its start on the link before), then the message absorbed
        (message_absorbed). Returns the chain's next packet, another message's (-1: none)."""
        cdef int32_t m = self.pkts[p].msg, first, nxt, npk = 0
        cdef int64_t row = self.mrow(m), t, ack, last = -1, acked = -1, ser
        cdef int32_t ep = self.mt[row].ini, shift = self.segs[self.mseg[m]].shift, iseq = self.pkts[p].iseq
        while p >= 0 and self.pkts[p].msg == m:
            first = self.pkts[p].in_link
            ser = serialisation_ps(self.pkts[p].wire, self.lk[first].rate)
            t = self.path_hops(m, self.pkts[p].seq, row, first, self.pkts[p].ready, self.pkts[p].wire,
                               self.pkts[p].payload, self.pkts[p].plane, self.pkts[p].uplink, &ack, 1, 8,
                               self.pkts[p].ready - self.lk[first].lat - ser)
            if t > last:
                last = t
            # Its ack's trip: back over the tail's links (path_hops) and the first one.
            t += ack + self.link_ack_of(first, PATH_UB) if ack >= 0 else self.ack_trip(m, self.pkts[p].plane,
                                                                                       self.pkts[p].uplink)
            if t > acked:
                acked = t
            npk += 1
            nxt = self.pkts[p].next
            self.packet_release(p)
            p = nxt
        self.message_absorbed(m, row, shift, ep, iseq, npk, last, acked)
        return p

    cdef inline void prefetch_paths(self, const Ini* q, int64_t row) noexcept nogil:
        """The links of the UB paths the packets of q's message (table row ``row``) will take,
        sprayed from q's next path, into cache before the first is reserved: path_hops reads a
        link's line as soon as it has asked for it, and a message's packets take different
        sub-planes, so their lines are fetched side by side here instead of one path at a time."""
        cdef int32_t s = self.mt[row].src, d = self.mt[row].dst, plane = q.plane, uplink = q.uplink
        cdef int32_t links[4]
        cdef int k, hop, n
        if self.links_down or q.npk < 2 or self.mt[row].path != PATH_UB:
            return
        for k in range(q.npk):
            n = self.ub_links(s, d, plane, uplink, links)
            for hop in range(n):
                cm_prefetch(&self.lk[links[hop]])
            if self.lb != LB_SPRAY:
                return
            self.spray_next(&plane, &uplink)

    cdef int message_absorbed(self, int32_t m, int64_t row, int32_t shift, int32_t ep, int32_t iseq, int32_t npk,
                              int64_t t, int64_t acked) except -1:
        """AIV ep's write message m (table row ``row``, its ops' ``shift``, its message number
        iseq), all npk of its packets reserved at once (aiv_write): in its destination's memory at
        t (its last packet) and acknowledged at ``acked`` (its last ack). What write_absorbed does packet by packet,
        for them together, in the same order: the message delivered, the AIV's ring slot
        complete (waking it if it waits for it), the send op's last ack."""
        cdef int32_t r = self.mt[row].recv, op = self.mt[row].send
        cdef int64_t e = self.ring_base(ep) + iseq % AIV_RING
        if r >= 0:
            r += shift
        if m < self.n_record and t > self.msg_delivered[m]:
            self.msg_delivered[m] = t
        if r >= 0 and t > self.ops[r].tmax and self.ops[r].kind == OP_KIND_RECV:
            self.ops[r].tmax = t
        self.deliver(m, t)
        if acked > self.ring_slot[e].t:  # aiv_done, for its packets together
            self.ring_slot[e].t = acked
        self.ring_slot[e].left -= npk
        if self.ring_slot[e].left == 0 and self.ini[ep].wait == iseq:
            self.ini[ep].wait = -1
            self.wake_at(ep, self.ring_slot[e].t if self.ring_slot[e].t > self.now else self.now)
        if op >= 0:
            op += shift
        self.ack_back_op(op, acked)
        self.msg_left[m] -= npk
        self.acked_op(op)
        return 0

    cdef inline int64_t cal_gap(self, LinkInfo* L, int64_t n, int64_t* t, int64_t need) noexcept nogil:
        """The first idle stretch of L's calendar at or after *t that holds ``need`` ps: moves *t
        to its start and returns the interval it ends at (n: none). Most packets come after the
        last interval or during it, so those two are looked at first; else it is mostly a few
        intervals back (8 on average in the decode step, of 36), so the search gallops back from
        the end."""
        cdef int64_t* c = L.cal
        cdef int64_t i, hi, mid, step
        if n == 0 or c[2 * n - 1] <= t[0]:
            return n  # after them all: nothing to look through
        if n == 1 or c[2 * n - 3] <= t[0]:
            i = n - 1  # the first interval that ends after t is the last one
        else:
            # Back from the end in steps that double (in lines the end's prefetch brought, the
            # most part), then a binary search between the last two probes.
            hi = n - 2  # ends after t
            step = 2
            i = hi - step
            while i > 0 and c[2 * i + 1] > t[0]:
                hi = i
                step *= 2
                i = hi - step
            if i < 0:
                i = 0
            while i < hi:  # the first interval that ends after t
                mid = (i + hi) >> 1
                if c[2 * mid + 1] > t[0]:
                    hi = mid
                else:
                    i = mid + 1
        while i < n and c[2 * i] < t[0] + need:
            if c[2 * i + 1] > t[0]:
                t[0] = c[2 * i + 1]
            i += 1
        return i

    cdef inline int64_t cal_find(self, LinkInfo* L, int64_t t, int64_t need) noexcept nogil:
        """When something there at t would start (cal_reserve without reserving)."""
        self.cal_gap(L, L.cal_n, &t, need)
        return t

    cdef inline int64_t cal_reserve(self, LinkInfo* L, int64_t t, int64_t need) except -1:
        """Reserve ``need`` ps of L's time (a link's, or a sink's) for a packet that is there at
        t: the first idle stretch at or after t long enough to hold it (a packet goes out
        whole). Stretches between the intervals reserved before may be used, so the link is not
        left idle while a packet that has arrived waits behind one reserved earlier for a later
        time. Returns when it starts. (In line: its calls' entry and exit were a fifth of its
        instructions; a full calendar goes to cal_room.)"""
        cdef int64_t* c = L.cal
        cdef int64_t n = L.cal_n, i
        i = self.cal_gap(L, n, &t, need)
        # [t, t + need) goes in before interval i, joining its neighbours where it touches them.
        if i > 0 and c[2 * i - 1] == t:
            c[2 * i - 1] = t + need
            if i < n and c[2 * i] == t + need:
                c[2 * i - 1] = c[2 * i + 1]
                memmove(c + 2 * i, c + 2 * i + 2, (n - i - 1) * 2 * sizeof(int64_t))
                n -= 1
        elif i < n and c[2 * i] == t + need:
            c[2 * i] = t
        else:
            if n * 2 + 2 > L.cal_cap:
                i = self.cal_room(L, i)
                c = L.cal
                n = L.cal_n
            if i < n:  # (most go after the last: nothing to move)
                memmove(c + 2 * i + 2, c + 2 * i, (n - i) * 2 * sizeof(int64_t))
            c[2 * i] = t
            c[2 * i + 1] = t + need
            n += 1
        L.cal_n = <int32_t>n
        return t

    cdef int64_t cal_room(self, LinkInfo* L, int64_t i) except -1:
        """Room in L's full calendar for one more interval, to go in before interval i: intervals
        that ended by now are of no more use (every packet comes at now or later), so they are
        dropped; if that is not enough it grows (or it shrinks, once most of it had ended: a link
        busy only for a while). Returns where interval i is now."""
        cdef int64_t* c = L.cal
        cdef int64_t n = L.cal_n, k, hi, mid
        cdef int64_t* grown
        k = 0  # the first interval that ends after now (they all end after t if i < n)
        hi = i
        while k < hi:
            mid = (k + hi) >> 1
            if c[2 * mid + 1] > self.now:
                hi = mid
            else:
                k = mid + 1
        if k > 0:
            memmove(c, c + 2 * k, (n - k) * 2 * sizeof(int64_t))
            n -= k
            i -= k
        if n * 2 + 2 > L.cal_cap or 4 * n < L.cal_cap and L.cal_cap > 64:
            L.cal_cap = 16 if L.cal_cap == 0 else (2 * L.cal_cap if n * 2 + 2 > L.cal_cap else L.cal_cap // 2)
            grown = <int64_t*>realloc(c, L.cal_cap * sizeof(int64_t))
            if grown == NULL:
                raise MemoryError("link calendar")
            L.cal = grown
        L.cal_n = <int32_t>n
        return i

    cdef int buf_hold(self, int32_t link, int64_t a, int64_t b, int64_t w) except -1:
        """Back-pressure on the message-level fabric: a packet of ``w`` wire bytes is in link's
        receive buffer over [a, b) (from the start of its transmission on the link, when its
        credit is taken, to its start on the next link, when the credit returns, as on the packet
        fabric). Where the buffer then has no room for another packet of its size, the link is
        blocked for every packet (cal_block): on the packet fabric the sender would be out of
        credits, so nothing, whatever its output, could start on the link then."""
        cdef LinkInfo* B = &self.lk[link]
        cdef int64_t* e
        cdef int64_t n = B.buf_n, i, j, k, lev, x1, room = <int64_t>B.buf_limit - w, lo, hi, mid, step
        cdef int64_t* grown
        if b <= a:
            return 0
        if 2 * n + 4 > B.buf_cap:
            e = B.buf
            # Entries before the last one at or before now are of no more use (every packet comes
            # at now or later): k, the first after now, less one.
            k = 0
            hi = n
            while k < hi:
                mid = (k + hi) >> 1
                if e[2 * mid] > self.now:
                    hi = mid
                else:
                    k = mid + 1
            k = k - 1 if k > 0 else 0
            if k > 0:
                memmove(e, e + 2 * k, (n - k) * 2 * sizeof(int64_t))
                n -= k
            if 2 * n + 4 > B.buf_cap:
                B.buf_cap = 32 if B.buf_cap == 0 else 2 * B.buf_cap
                grown = <int64_t*>realloc(B.buf, B.buf_cap * sizeof(int64_t))
                if grown == NULL:
                    raise MemoryError("receive buffer")
                B.buf = grown
        e = B.buf
        # i: the first entry at or after a: mostly near the end, but packets reserved ahead (an
        # AIV's, up to its look-ahead) put entries after it, so gallop back from the end, then a
        # binary search between the last two probes.
        i = n
        if n > 0 and e[2 * n - 2] >= a:
            hi = n - 1  # at or after a
            step = 1
            lo = hi - step
            while lo >= 0 and e[2 * lo] >= a:
                hi = lo
                step *= 2
                lo = hi - step
            if lo < 0:
                lo = -1  # before a (or none)
            while hi - lo > 1:
                mid = (lo + hi) >> 1
                if e[2 * mid] >= a:
                    hi = mid
                else:
                    lo = mid
            i = hi
        if i == n or e[2 * i] != a:
            lev = e[2 * i - 1] if i > 0 else 0
            memmove(e + 2 * i + 2, e + 2 * i, (n - i) * 2 * sizeof(int64_t))
            e[2 * i] = a
            e[2 * i + 1] = lev
            n += 1
        j = i
        while j < n and e[2 * j] < b:
            e[2 * j + 1] += w
            j += 1
        if j == n or e[2 * j] != b:
            lev = e[2 * j - 1] - w
            memmove(e + 2 * j + 2, e + 2 * j, (n - j) * 2 * sizeof(int64_t))
            e[2 * j] = b
            e[2 * j + 1] = lev
            n += 1
        B.buf_n = <int32_t>n
        k = i
        while k < j:
            if e[2 * k + 1] > room:
                x1 = e[2 * k]
                while k < j and e[2 * k + 1] > room:
                    k += 1
                self.cal_block(B, x1, e[2 * k])
            else:
                k += 1
        return 0

    cdef int cal_block(self, LinkInfo* L, int64_t x1, int64_t x2) except -1:
        """Mark [x1, x2) busy in L's calendar, joining the intervals it meets (buf_hold)."""
        cdef int64_t* c = L.cal
        cdef int64_t n = L.cal_n, i, j, hi, mid
        cdef int64_t* grown
        i = 0  # the first interval that ends at or after x1
        hi = n
        while i < hi:
            mid = (i + hi) >> 1
            if c[2 * mid + 1] >= x1:
                hi = mid
            else:
                i = mid + 1
        j = i  # the first that starts after x2
        while j < n and c[2 * j] <= x2:
            j += 1
        if j > i:
            if c[2 * i] < x1:
                x1 = c[2 * i]
            if c[2 * j - 1] > x2:
                x2 = c[2 * j - 1]
            c[2 * i] = x1
            c[2 * i + 1] = x2
            if j > i + 1:
                memmove(c + 2 * i + 2, c + 2 * j, (n - j) * 2 * sizeof(int64_t))
                n -= j - i - 1
        else:
            if n * 2 + 2 > L.cal_cap:
                L.cal_cap = 16 if L.cal_cap == 0 else 2 * L.cal_cap
                grown = <int64_t*>realloc(c, L.cal_cap * sizeof(int64_t))
                if grown == NULL:
                    raise MemoryError("link calendar")
                c = grown
                L.cal = c
            memmove(c + 2 * i + 2, c + 2 * i, (n - i) * 2 * sizeof(int64_t))
            c[2 * i] = x1
            c[2 * i + 1] = x2
            n += 1
        L.cal_n = <int32_t>n
        return 0

    cdef inline int64_t cal_take(self, int32_t link, int64_t t, int64_t need, int64_t nbytes) except -1:
        """cal_reserve on a link, whose counters get the packet's bytes and busy time; returns
        when its tail has left."""
        cdef LinkInfo* L = &self.lk[link]
        cdef int64_t b, k
        cdef int64_t* r
        t = self.cal_reserve(L, t, need)
        # count_transmission's common case in line: the packet within one open bin.
        b = self.bin_of(t) if self.bin_ps > 0 else -1
        if b >= 0 and L.cur_bin >= 0 and L.cur_bin <= b < L.cur_bin + RING and t + need <= (b + 1) * self.bin_ps:
            L.bytes += nbytes
            L.busy += need
            k = 2 * (b & (RING - 1))  # (b >= 0: b % RING)
            r = self.ring + <int64_t>link * RING * 2
            r[k] += nbytes
            r[k + 1] += need
        else:
            self.count_transmission(link, t, need, nbytes)
        if t + need > L.busy_until:
            L.busy_until = t + need
        return t + need

    cdef inline int64_t ack_first(self, int32_t ep) noexcept nogil:
        """The initiator's earliest ack in flight (ack_len[ep] > 0)."""
        return self.ack_heap[ep][self.ack_lo[ep]]

    cdef void ack_pop(self, int32_t ep) noexcept nogil:
        """Take the earliest ack off the initiator's list: its window slot is free."""
        self.ini[ep].outstanding -= 1
        self.ini[ep].ack_len -= 1
        self.ack_lo[ep] = self.ack_lo[ep] + 1 if self.ini[ep].ack_len > 0 else 0

    cdef int ack_push(self, int32_t ep, int64_t t) except -1:
        cdef int64_t* h = self.ack_heap[ep]
        cdef int64_t i, near, a, b, mid, cap, lo = self.ack_lo[ep], n = self.ini[ep].ack_len
        if lo + n == self.ack_cap[ep]:
            if lo > 0 and 2 * n <= self.ack_cap[ep]:  # room at the front: move them there
                memmove(h, h + lo, n * sizeof(int64_t))
            else:
                cap = 16 if self.ack_cap[ep] == 0 else 2 * self.ack_cap[ep]
                h = <int64_t*>malloc(cap * sizeof(int64_t))
                if h == NULL:
                    raise MemoryError("ack list")
                if n > 0:
                    memcpy(h, self.ack_heap[ep] + lo, n * sizeof(int64_t))
                free(self.ack_heap[ep])
                self.ack_heap[ep] = h
                self.ack_cap[ep] = cap
            lo = self.ack_lo[ep] = 0
        i = lo + n  # at the end: on the packet fabric most come after the others
        near = i - ACK_NEAR if i - ACK_NEAR > lo else lo
        while i > near and h[i - 1] > t:  # a few places before the end: moved one at a time
            h[i] = h[i - 1]
            i -= 1
        if i == near and i > lo and h[i - 1] > t:
            # Further: after the last one not later than it, found by halving, and those after it
            # moved up in one copy. (On the message-level fabric a DMA's packets, reserved over
            # several planes and far ahead, are acked out of order: on the prefill step a new ack
            # went 119 places before the end of 464, on average, one at a time.)
            a = lo
            b = i - 1  # h[b] > t
            while a < b:
                mid = (a + b) >> 1
                if h[mid] > t:
                    b = mid
                else:
                    a = mid + 1
            memmove(h + a + 1, h + a, (i - a) * sizeof(int64_t))
            i = a
        h[i] = t
        self.ini[ep].ack_len = n + 1
        return 0

    cdef void collect_acks(self, int32_t ep) noexcept nogil:
        """Acks back by now free their window slots."""
        while self.ini[ep].ack_len > 0 and self.ack_first(ep) <= self.now:
            self.ack_pop(ep)

    cdef inline int64_t ring_base(self, int32_t ep) noexcept nogil:
        return (ep - self.n_eps) * AIV_RING

    cdef int64_t aiv_ready(self, int32_t ep, int64_t row, int32_t shift, int kind) except -2:
        """When AIV initiator ep may issue the first packet of its next message (table row
        ``row``), or -1 if not yet known or not yet due (a wake-up is then scheduled, or its
        completion will wake it: aiv_done). Its kernel's own work before it (MsgRow.prep) runs from
        when its last FLOW_BASE message was issued (or its op started); a message with flow k
        waits for the one k places before it to be complete; the AIV_RING-th message before must
        be complete too (its ring slot is reused). Its MTE instruction then reaches the wire
        its MTE start-up (Ini.msg_startup) later, after the packets it issued before. On the packet fabric it is
        issued when due; on the message-level one up to the look-ahead before (its path is
        reserved from then)."""
        cdef int64_t s = self.ini[ep].iseq, e, t, k, la
        cdef int64_t r0 = self.ring_base(ep)
        cdef int32_t op
        if s >= AIV_RING and self.ring_slot[r0 + s % AIV_RING].left > 0:
            self.ini[ep].wait = s - AIV_RING
            return -1
        op = (self.mt[row].send if kind == MSG_WRITE else self.mt[row].recv) + shift
        t = self.ops[op].start + self.ini[ep].startup
        if self.ini[ep].base > t:
            t = self.ini[ep].base
        t += self.mt[row].prep
        if s >= AIV_RING and self.ring_slot[r0 + s % AIV_RING].t > t:
            # Its slot frees when the message AIV_RING before is complete (its last ack), not
            # when its last packet arrives (packet fabric) or is reserved (message-level).
            t = self.ring_slot[r0 + s % AIV_RING].t
        k = self.mt[row].flow & FLOW_AFTER_MASK
        if k > 0 and s >= k:
            e = r0 + (s - k) % AIV_RING
            if self.ring_slot[e].left > 0:
                self.ini[ep].wait = s - k
                return -1
            if self.ring_slot[e].t > t:
                t = self.ring_slot[e].t
        t += self.ini[ep].msg_startup[(kind if kind < 2 else 1)]
        if t < self.ini[ep].issue_free:
            t = self.ini[ep].issue_free
        if t < self.now:
            t = self.now
        # Its instruction is issued its start-up before its first packet leaves: on the
        # message-level fabric its path is reserved from then, up to the look-ahead ahead.
        la = self.aiv_lookahead + self.ini[ep].msg_startup[(kind if kind < 2 else 1)] if (
            kind == MSG_WRITE and self.lookahead > 0) else 0
        if t > self.now + la:
            # Woken when its instruction is due, it reserves then everything due within the
            # look-ahead (an AIV's chain of waiting writes in a few events, not one a write).
            self.wake_at(ep, t - la + self.aiv_lookahead if la > 0 else t)
            return -1
        return t

    cdef int64_t ini_start_issue(self, int32_t ep, int64_t row, int64_t t, int kind) except -1:
        """AIV initiator ep issues its next message (table row ``row``) at t (aiv_ready), or at
        its issue time if that is later: its number, its ring slot, its base."""
        cdef int64_t e = self.ring_base(ep) + self.ini[ep].iseq % AIV_RING
        if t < self.ini[ep].issue_free:
            t = self.ini[ep].issue_free
        self.ini[ep].issue_free = t
        self.ini[ep].iseq += 1
        self.ring_slot[e].t = 0
        self.ring_slot[e].left = <int32_t>self.ini[ep].npk
        if self.mt[row].flow & FLOW_BASE:
            self.ini[ep].base = t - self.ini[ep].msg_startup[(kind if kind < 2 else 1)]
        return t

    cdef int aiv_done(self, int32_t ep, int32_t iseq, int64_t t) except -1:
        """A packet of AIV initiator ep's message number iseq is complete at t (acked, or its read
        data back): the message is, with its last; wake the AIV if it waits for it."""
        cdef int64_t e = self.ring_base(ep) + iseq % AIV_RING
        if t > self.ring_slot[e].t:
            self.ring_slot[e].t = t
        self.ring_slot[e].left -= 1
        if self.ring_slot[e].left == 0 and self.ini[ep].wait == iseq:
            self.ini[ep].wait = -1
            self.wake_at(ep, self.ring_slot[e].t if self.ring_slot[e].t > self.now else self.now)
        return 0

    cdef int inject(self, int32_t ep) except -1:
        """Issue packets of the initiator's queued messages while its window and rate allow."""
        cdef int32_t m, p, first, s, d, op
        cdef int64_t payload, idx, t, seq, row, nbytes, mtu, t0
        cdef int path, kind, plane, uplink
        cdef Ini* q = &self.ini[ep]
        self.collect_acks(ep)
        if ep < self.n_eps and self.held_n[ep] > 0:
            self.release_held(ep)
        while q.n > 0:
            m = q.m_head
            seq = q.seq
            if seq == 0:  # what its packets have in common, found once a message
                row = q.row
                kind = self.mt[row].kind
                path = self.mt[row].path
                mtu = self.path_mtu[path]
                nbytes = self.mt[row].nbytes
                q.npk = 1 if nbytes <= mtu else (nbytes + mtu - 1) // mtu  # packets_of
                # A read request carries no data; an atomic's carries its operand.
                q.wpay = <int32_t>(0 if kind == MSG_READ else (mtu if nbytes > mtu else nbytes))
                q.wire = <int32_t>self.wire_bytes(path, PKT_WRITE if kind == MSG_WRITE else PKT_READ_REQ, q.wpay)
                if not self.links_down:  # choose_path's first draw, without its divisions
                    idx = self.path_hash(m, row) % (self.P * self.U)
                    q.plane = <int32_t>(idx % self.P)
                    q.uplink = <int32_t>(idx // self.P)
            row = q.row
            kind = self.mt[row].kind
            if seq == 0 and (ep >= self.n_eps):
                t = self.aiv_ready(ep, row, q.shift, kind)
                if t < 0:
                    break  # it waits for an earlier message, or for its time (a wake-up is due)
            if self.ini[ep].outstanding >= self.ini[ep].max_out and not ((ep >= self.n_eps) and self.lookahead > 0):
                # The window is full. On the message-level fabric a write's packet may take the
                # slot of an ack due within the look-ahead, and leave no earlier than that ack.
                # Only while every slot in flight is a write's, whose ack time is known (a read
                # frees its slot when its response is back, which is not yet known). (An AIV's
                # messages there are bounded by its kernel's waits and its ring of messages, not
                # by the packets it reserved ahead.)
                # (Its writes held at its ports start, so are acked, past the look-ahead.)
                if (self.lookahead == 0 or kind != MSG_WRITE or self.ini[ep].ack_len == 0
                        or self.ini[ep].ack_len + (self.held_count[ep] if ep < self.n_eps else 0)
                        != self.ini[ep].outstanding
                        or self.ack_first(ep) > self.now + self.lookahead):
                    break
                if self.ack_first(ep) > self.ini[ep].issue_free:
                    self.ini[ep].issue_free = self.ack_first(ep)
                self.ack_pop(ep)
            if (ep >= self.n_eps):
                if seq == 0:
                    t = self.ini_start_issue(ep, row, t, kind)
                    if self.lookahead > 0 and kind == MSG_WRITE:
                        self.aiv_write(ep, m, row)  # its packets all at once
                        continue
                elif self.lookahead == 0 and self.ini[ep].issue_free > self.now:
                    # On the packet fabric a core's packet joins its port's queue when it is
                    # issued, not before: there it would hold up the other cores' packets.
                    self.wake_at(ep, self.ini[ep].issue_free)
                    break
            path = self.mt[row].path
            mtu = self.path_mtu[path]
            nbytes = self.mt[row].nbytes
            payload = nbytes - seq * mtu
            if payload > mtu:
                payload = mtu  # every packet but the last is a full MTU
            p = self.packet_new()
            self.pkts[p].msg = m
            self.pkts[p].payload = <int32_t>payload
            self.pkts[p].seq = <int32_t>seq
            self.pkts[p].leg = 0
            self.pkts[p].hop = 0
            self.pkts[p].iseq = <int32_t>(self.ini[ep].iseq - 1)
            self.pkts[p].in_link = -1
            self.pkts[p].vl = 0
            self.pkts[p].ptype = PKT_WRITE if kind == MSG_WRITE else PKT_READ_REQ
            if kind == MSG_READ or payload == q.wpay:
                self.pkts[p].wire = q.wire
            else:  # the last packet of a write, shorter than the others
                self.pkts[p].wire = <int32_t>self.wire_bytes(path, self.pkts[p].ptype, payload)
            self.packet_path(q, m, seq, p, row, &plane, &uplink)
            self.pkts[p].plane = <uint8_t>plane
            self.pkts[p].uplink = uplink
            q.seq += 1
            if q.seq == q.npk:  # on to the next message
                q.seq = 0
                q.buf[2 * q.head] += 1
                if q.buf[2 * q.head] == q.buf[2 * q.head + 1]:
                    q.head = (q.head + 1) & (q.cap - 1)
                    q.n -= 1
                self.head_ahead(q)
            if not (ep >= self.n_eps) or self.lookahead == 0 or kind != MSG_WRITE:
                self.ini[ep].outstanding += 1
            # Issued one issue time after the previous packet, and not before its message's
            # start; it waits in its port's queue until then.
            if self.ini[ep].issue_free < self.now:
                self.ini[ep].issue_free = self.now
            op = self.mt[row].send if kind == MSG_WRITE else self.mt[row].recv
            t = self.ops[op + q.shift].start + self.ini[ep].startup
            if self.ini[ep].issue_free < t:
                self.ini[ep].issue_free = t
            self.pkts[p].ready = self.ini[ep].issue_free
            self.ini[ep].issue_free += self.ini[ep].issue[(kind if kind < 2 else 1)]
            if kind == MSG_WRITE:  # leg_ends: a read's request goes from its destination
                s, d = self.mt[row].src, self.mt[row].dst
            else:
                s, d = self.mt[row].dst, self.mt[row].src
            first = self.route_link(path, s, d, self.pkts[p].plane, self.pkts[p].uplink, 0)
            if self.lookahead > 0 and kind == MSG_WRITE:
                if ep < self.n_eps and (self.lk[first].queued > 0 or self.port_start(p, first) > self.now + self.lookahead):
                    # The horizon: it waits in its port's queue (held_writes).
                    self.voq_append(first, 0, p)
                    self.held_count[ep] += 1
                    self.hold_at(ep, first)
                    continue
                self.path_reserve(p, first, self.pkts[p].ready, row)
                continue
            self.voq_append(first, 0, p)
            self.try_transmit(first)
        if (q.n > 0 and self.ini[ep].ack_len > 0 and self.ini[ep].outstanding >= self.ini[ep].max_out
                and not ((ep >= self.n_eps) and self.lookahead > 0)):
            self.wake_at(ep, self.ack_first(ep))  # the window is full: wake when a slot frees
        if ep < self.n_eps and self.held_n[ep] > 0:
            self.release_held(ep)
        return 0

    cdef inline int packet_path(self, Ini* q, int32_t m, int64_t seq, int32_t p, int64_t row, int* plane,
                                int* uplink) except -1:
        """Sub-plane and L1 uplink of packet ``seq`` of message m (table row ``row``) that initiator
        q issues: choose_path's, without its divisions while no link is down: sprayed, the next
        path in (uplink, plane) order from packet to packet (from the hash's, set at its first
        packet); hashed, the same path for all. (``p``: the packet, freed if no path is left.)"""
        cdef int64_t idx
        if not self.links_down:
            plane[0] = q.plane
            uplink[0] = q.uplink
            if self.lb == LB_SPRAY:
                self.spray_next(&q.plane, &q.uplink)
        else:
            idx = self.choose_path(m, seq, p, row)
            plane[0] = <int>(idx % self.P)
            uplink[0] = <int>(idx // self.P)
        return 0

    cdef int hold_at(self, int32_t ep, int32_t link) except -1:
        """Endpoint ep has a write held at its port ``link`` (held_writes): the port joins its
        list, which its wake-ups release (release_held); past HELD_PORTS, the port wakes itself."""
        cdef int32_t k, n = self.held_n[ep]
        for k in range(n):
            if self.held_port[ep * HELD_PORTS + k] == link:
                return 0
        if n < HELD_PORTS:
            self.held_port[ep * HELD_PORTS + n] = link
            self.held_n[ep] = n + 1
            return 0
        self.held_writes(link, self.lookahead)
        return 0

    cdef int release_held(self, int32_t ep) except -1:
        """Reserve endpoint ep's held writes that start within the look-ahead, port by port (in
        each port's order), and wake it when the first of those left starts: each wake-up then
        reserves about a look-ahead of every port's packets."""
        cdef int32_t k = 0, n = self.held_n[ep], link
        cdef int64_t first = INT64_MAX, start
        while k < n:
            link = self.held_port[ep * HELD_PORTS + k]
            start = self.held_writes(link, -1)
            if start < 0:
                n -= 1  # none held there now (or a read ahead of them: try_transmit's)
                self.held_port[ep * HELD_PORTS + k] = self.held_port[ep * HELD_PORTS + n]
                continue
            if start < first:
                first = start
            k += 1
        self.held_n[ep] = n
        if n > 0:
            self.wake_at(ep, first)
        return 0

    cdef int wake_at(self, int32_t ep, int64_t t) except -1:
        if t < self.ini[ep].wake_at:  # (INT64_MAX: no wake-up pending)
            self.ini[ep].wake_at = t
            self.push(t, EV_WAKE, ep)
        return 0

    cdef int on_wake(self, int32_t ep) except -1:
        if self.now == self.ini[ep].wake_at:
            self.ini[ep].wake_at = INT64_MAX
        self.inject(ep)
        return 0

    cdef int wake_link(self, int32_t link, int64_t t) except -1:
        """Make sure the link looks at its queues again at t (one pending wake-up per link: the
        earliest; later ones left in the queue are ignored when they come)."""
        if self.lk[link].free_at < 0 or t < self.lk[link].free_at:
            self.lk[link].free_at = t
            self.push(t, EV_LINK_FREE, link)
        return 0

    cdef int on_link_free(self, int32_t link) except -1:
        if self.now != self.lk[link].free_at:
            return 0  # superseded by an earlier wake-up
        self.lk[link].free_at = -1
        self.try_transmit(link)
        return 0

    cdef int on_packet_arrive(self, int32_t p) except -1:
        """The packet's tail reached the far end of its link: a switch, or its destination."""
        cdef int32_t link = self.pkts[p].link, nxt, s, d, m
        cdef int64_t rate, start
        m = self.pkts[p].msg
        if not self.lk[link].alive:
            # It was on the wire when the link failed: lost. The dead link's receiver never
            # holds it, so its credit comes back at once (keeps the books balanced).
            self.credits[link * NUM_VLS + self.pkts[p].vl] += self.pkts[p].wire
            return self.lose(p)
        self.leg_ends(p, &s, &d)
        nxt = self.route_link(self.m_path(m), s, d, self.pkts[p].plane, self.pkts[p].uplink, self.pkts[p].hop + 1)
        if nxt >= 0 and not self.lk[nxt].alive:
            # Its next link has failed: the switch drops it, freeing its buffer.
            self.credits[link * NUM_VLS + self.pkts[p].vl] += self.pkts[p].wire
            self.try_transmit(link)
            return self.lose(p)
        if nxt >= 0:
            self.pkts[p].hop += 1
            self.voq_append(nxt, self.lk[link].in_slot, p)
            self.try_transmit(nxt)
            return 0
        rate = self.ep_sink_rate[d]
        if rate > 0 and self.pkts[p].ptype == PKT_WRITE:
            start = self.now if self.now > self.ep_sink_free[d] else self.ep_sink_free[d]
            self.ep_sink_free[d] = start + serialisation_ps(self.pkts[p].payload, rate)
            self.push(self.ep_sink_free[d], EV_SINK_DONE, p)
        else:
            self.on_sink_done(p)
        return 0

    cdef int64_t ack_trip(self, int32_t m, int plane, int uplink) noexcept nogil:
        """An ack's trip from write m's destination back to its source, on an idle path."""
        cdef int32_t link
        cdef int path = self.m_path(m), hop = 0
        cdef int64_t total = 0
        while True:
            link = self.route_link(path, self.m_dst(m), self.m_src(m), plane, uplink, hop)
            if link < 0:
                return total
            total += self.link_ack_of(link, path)
            hop += 1

    cdef inline int64_t link_ack_of(self, int32_t link, int path) noexcept nogil:
        """An ack's serialisation and latency on the link, worked out once per path."""
        if self.link_ack_path[link] != path + 1:
            self.link_ack_path[link] = path + 1
            self.link_ack[link] = serialisation_ps(self.wire_bytes(path, PKT_ACK, 0), self.lk[link].rate) + self.lk[link].lat
        return self.link_ack[link]

    cdef int on_sink_done(self, int32_t p) except -1:
        """The destination took the packet out of its receive buffer."""
        cdef int32_t m = self.pkts[p].msg, link = self.pkts[p].in_link, s, d
        cdef int64_t t
        self.credits[link * NUM_VLS + self.pkts[p].vl] += self.pkts[p].wire
        self.try_transmit(link)
        if self.pkts[p].ptype == PKT_WRITE:
            self.write_absorbed(p, self.now + self.ep_write_lat[self.m_dst(m)])
        elif self.pkts[p].ptype == PKT_READ_REQ:
            # A read reads the target's memory (at its read rate, if it has one: one request after
            # the other); an atomic reads, modifies and writes it.
            s = self.m_src(m)
            t = self.now
            if self.ep_read_rate[s] > 0:
                if self.ep_read_free[s] > t:
                    t = self.ep_read_free[s]
                t += serialisation_ps(self.pkts[p].payload, self.ep_read_rate[s])
                self.ep_read_free[s] = t
            t += self.ep_read_lat[s]
            if self.m_kind(m) == MSG_ATOMIC:
                t += self.ep_write_lat[self.m_src(m)]
            self.push(t, EV_RESP_INJECT, p)
        else:  # read response, back at the initiator
            d = self.mt[self.mrow(m)].ini
            self.ini[d].outstanding -= 1
            if (d >= self.n_eps):
                self.aiv_done(d, self.pkts[p].iseq, self.now)
            self.packet_release(p)
            self.msg_left[m] -= 1
            if self.msg_left[m] == 0:
                self.deliver(m, self.now)
            self.inject(d)
        return 0

    cdef int on_response_inject(self, int32_t p) except -1:
        cdef int32_t m = self.pkts[p].msg, first
        cdef int path = self.m_path(m)
        self.pkts[p].leg = 1
        self.pkts[p].ptype = PKT_READ_RESP
        self.pkts[p].vl = 1
        self.pkts[p].hop = 0
        self.pkts[p].in_link = -1
        self.pkts[p].ready = self.now
        self.pkts[p].wire = <int32_t>self.wire_bytes(path, PKT_READ_RESP, self.pkts[p].payload)
        first = self.route_link(path, self.m_src(m), self.m_dst(m), self.pkts[p].plane, self.pkts[p].uplink, 0)
        if not self.lk[first].alive:
            return self.lose(p)  # its way back failed while the target was reading
        self.voq_append(first, 0, p)
        self.try_transmit(first)
        return 0

    cdef inline void ack_back_op(self, int32_t op, int64_t t) noexcept nogil:
        """An ack of a write of send op ``op`` will be back at t: the op ends no earlier."""
        if op >= 0 and self.ops[op].kind == OP_KIND_SEND and t > self.ops[op].tmax:
            self.ops[op].tmax = t

    cdef int acked_op(self, int32_t op) except -1:
        """A write's last ack is on its way (ack_back_op): its send op ``op`` ends when the last of
        its messages is acknowledged, at the latest ack. (Its window slots free by themselves:
        see collect_acks; an initiator with a full window has a wake-up at its first ack.)"""
        if op < 0 or self.ops[op].kind != OP_KIND_SEND:
            return 0
        self.ops[op].u -= 1
        if self.ops[op].u == 0:
            self.push(self.ops[op].tmax, EV_OP_DONE, op)
        return 0

    cdef int on_op_done(self, int32_t op) except -1:
        cdef int64_t s
        cdef int32_t nxt, die, w
        cdef OpInfo* o = &self.ops[op]
        o.end = self.now
        self.ops_done += 1
        if o.aic > 0 or o.aiv > 0:
            # Give the cores back, then start waiting ops in order while the first one fits.
            die = o.die
            self.free_aic[die] += o.aic
            self.free_aiv[die] += o.aiv
            while self.core_qhead[die] >= 0:
                w = self.core_qhead[die]
                if self.free_aic[die] < self.ops[w].aic or self.free_aiv[die] < self.ops[w].aiv:
                    break
                self.core_qhead[die] = self.ops[w].qnext
                if self.core_qhead[die] < 0:
                    self.core_qtail[die] = -1
                self.free_aic[die] -= self.ops[w].aic
                self.free_aiv[die] -= self.ops[w].aiv
                self.start_op(w)
        for s in range(o.succ_lo, o.succ_lo + o.succ_n):
            nxt = self.succ_idx[s]
            self.ops[nxt].pending -= 1
            if self.ops[nxt].pending == 0:
                self.push(self.now, EV_OP_READY, nxt)
        return 0

    # -- the loop --------------------------------------------------------------------------
    def run(self, int64_t max_events=-1, int64_t max_series_rows=-1):
        """Process events until none remain or max_events were handled in this call, or (with
        max_series_rows >= 0) the binned link counters hold more rows than that.

        Returns True when the queue is empty (the run is over: check ``ops_done``).
        """
        cdef Event ev
        cdef int64_t budget = max_events
        cdef int64_t t
        if self.released:
            raise RuntimeError("this engine's run state was released")
        while (self.queued_events() > 0 or self.tq_len > 0) and budget != 0 and (
                max_series_rows < 0 or self.series_len <= max_series_rows):
            if self.tq_len > 0:
                t = self.peek_time()
                if self.tq_due[self.tq_head] <= t:
                    self.run_tails(t)  # those due by the next event, before it
                    if self.queued_events() == 0:
                        continue
            ev = self.next_event()
            self.now = ev.time
            if self.bin_ps > 0 and self.now - self.bin_start >= self.bin_ps:
                self.bin_now = self.now // self.bin_ps
                self.bin_start = self.bin_now * self.bin_ps
            self.events += 1
            self.kind_count[ev.kind & 15] += 1
            if budget > 0:
                budget -= 1
            if ev.kind == EV_PKT_ARRIVE:
                self.on_packet_arrive(ev.a)
            elif ev.kind == EV_LINK_FREE:
                self.on_link_free(ev.a)
            elif ev.kind == EV_OP_DONE:
                self.on_op_done(ev.a)
            elif ev.kind == EV_OP_READY:
                self.on_op_ready(ev.a)
            elif ev.kind == EV_SINK_DONE:
                self.on_sink_done(ev.a)
            elif ev.kind == EV_WAKE:
                self.on_wake(ev.a)
            elif ev.kind == EV_FAIL:
                self.on_fail(ev.a)
            elif ev.kind == EV_RETRANSMIT:
                self.on_retransmit(ev.a)
            elif ev.kind == EV_HBM_DONE:
                self.on_hbm_done(ev.a)
            else:
                self.on_response_inject(ev.a)
        return self.queued_events() == 0 and self.tq_len == 0

    cdef inline int64_t queued_events(self) noexcept nogil:
        return self.heap_len + self.fifo_len + self.wheel_count + self.act_len - self.act_head

    @property
    def event_counts(self):
        """Events handled so far, by handler name (for profiling)."""
        names = {EV_OP_READY: "op_ready", EV_OP_DONE: "op_done", EV_LINK_FREE: "link_free",
                 EV_PKT_ARRIVE: "packet_arrive", EV_SINK_DONE: "sink_done", EV_RESP_INJECT: "response_inject",
                 EV_WAKE: "wake", EV_FAIL: "fail", EV_RETRANSMIT: "retransmit", EV_HBM_DONE: "hbm_done",
                 EV_TAIL: "tail"}
        return {name: int(self.kind_count[k]) for k, name in names.items() if self.kind_count[k]}

    def pending(self):
        return self.queued_events() + self.tq_len

    @property
    def link_bytes(self):
        out = np.empty(self.n_links, dtype=np.int64)
        cdef int64_t[::1] v = out
        cdef int64_t i
        for i in range(self.n_links):
            v[i] = self.lk[i].bytes
        return out

    @property
    def link_busy_ps(self):
        out = np.empty(self.n_links, dtype=np.int64)
        cdef int64_t[::1] v = out
        cdef int64_t i
        for i in range(self.n_links):
            v[i] = self.lk[i].busy
        return out

    @property
    def op_start_ps(self):
        if self.ops == NULL:
            raise RuntimeError("this engine's run state was released")
        out = np.empty(self.n_ops, dtype=np.int64)
        cdef int64_t[::1] v = out
        cdef int64_t i
        for i in range(self.n_ops):
            v[i] = self.ops[i].start
        return out

    @property
    def op_end_ps(self):
        if self.ops == NULL:
            raise RuntimeError("this engine's run state was released")
        out = np.empty(self.n_ops, dtype=np.int64)
        cdef int64_t[::1] v = out
        cdef int64_t i
        for i in range(self.n_ops):
            v[i] = self.ops[i].end
        return out

    @property
    def credit_bytes(self):
        """Credits per link and virtual lane, now (for invariant checks)."""
        return np.asarray(self.credits).reshape(-1, NUM_VLS).copy()


def engine_codes() -> dict:
    """The engine's compiled codes and constants that Python defines too, by their Python names
    (tests/test_vocab.py checks them against cmemu.vocab, cmemu.fabric and cmemu.lower.comm)."""
    return {
        "OP_KIND_COMP": OP_KIND_COMP, "OP_KIND_SEND": OP_KIND_SEND, "OP_KIND_RECV": OP_KIND_RECV,
        "OP_KIND_MEM": OP_KIND_MEM,
        "PATH_UB": PATH_UB, "PATH_D2D": PATH_D2D, "PATH_RDMA": PATH_RDMA, "PATH_VPC": PATH_VPC,
        "PKT_WRITE": PKT_WRITE, "PKT_READ_REQ": PKT_READ_REQ, "PKT_READ_RESP": PKT_READ_RESP, "PKT_ACK": PKT_ACK,
        "MSG_WRITE": MSG_WRITE, "MSG_READ": MSG_READ, "MSG_ATOMIC": MSG_ATOMIC,
        "LB_SPRAY": LB_SPRAY, "LB_HASH": LB_HASH,
        "NUM_VLS": NUM_VLS, "AIV_MESSAGES_IN_FLIGHT": AIV_RING, "FLOW_AFTER_MASK": FLOW_AFTER_MASK,
        "FLOW_BASE": FLOW_BASE, "PATH_HASH_MULT": PATH_HASH_MULT,
    }
