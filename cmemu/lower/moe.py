"""MoE dispatch and combine on AIV-Direct, lowered step by step as the fused kernels run them.

Sources: CANN ops-transformer ``mc2/moe_distribute_dispatch_v2/op_kernel/moe_distribute_dispatch_v2.h``
and ``mc2/moe_distribute_combine_v2/op_kernel/moe_distribute_combine_v2.h`` (the low-latency
kernels DeepEP-Ascend runs on A3 for decode, [OT]); sgl-project/sgl-kernel-npu
``csrc/deepep/ops/op_kernel/notify_dispatch.h``, ``cam_moe_dispatch_normal.h`` and
``cam_moe_combine_normal.h`` (the normal, high-throughput kernels for prefill, [SKN]). Every AIV of
the collective (``cmemu.cores``; the kernels use all of a die's, CloudMatrix-Infer's decode 16)
starts at once; no AIC takes part. docs/model.md says what each step costs and what is left out.

Low-latency dispatch, per die (member), ``kernel = "low_latency"``:
  1. Each AIV takes a contiguous share of the (token, k) pairs (SplitToCore: the first
     pairs % AIVs get one more). Per pair: count the earlier pairs of this die for the same
     expert (its slot in the window: no count exchange), load the BF16 token GM -> UB, quantise
     it to INT8 with a per-token scale, and write it (7,168 B + a 32 B scale slot + a 12 B
     (rank, token, k) triple) with one MTE3 copy into the expert's die's window. Before it fills
     the triple the AIV waits for its previous pair's write to complete (SyncFunc<MTE3_S>), so
     each AIV has one remote write in flight; the next pair's work runs meanwhile. A pair for one's
     own die goes to the local window the same way (no fabric).
  2. Each AIV counts its experts' pairs, then all AIVs barrier (PipeBarrier<ALL>, SyncAll) and
     write one 32 B status entry {flag, count} per (this die, expert), back to back.
  3. The die's AIVs poll their status slots until every source's entry has arrived, barrier
     again, and copy the received tokens from the window into expert order (window -> UB ->
     GM: the INT8 token, its scale and its triple).
Low-latency combine: each AIV takes a contiguous share of the rows this die holds, in an order
rotated by the die's rank (the kernel's staggered send); per row it loads the expert output
(BF16, 14,336 B), writes it into the token's die's window, waits for that write
(PipeBarrier<PIPE_MTE3>) and writes a 32 B flag for that (token, k). Then, with no barrier, the
same AIV goes on to its share of this die's own tokens: per token it polls the K flags, then
loads the K outputs, scales each by its routing weight and sums them, and stores the token.
Normal dispatch (``kernel = "normal"``): a count exchange (notify_dispatch: each core writes a
flag to its target dies, waits for theirs and pulls their counts), two host synchronisations,
then each AIV quantises its pairs into the die's *own* window, all barrier and write status
flags, poll, barrier, and each AIV *pulls* the tokens of its slots from the sources' windows
(remote reads, one at a time, its stores of a row under the next read) into expert order. Normal combine is the
low-latency one without the rotation and with a full barrier (PipeBarrier<PIPE_ALL>) after each
row's write, so that the AIV's next load waits for it too.

Remote accesses are the AIVs' own (cmemu.fabric.aiv_initiator): each AIV issues its writes
and reads through its MTE pipes, in the kernel's order and with the kernel's waits
(cmemu.lower.comm: prep and flow). Vector and MTE work is timed from the die spec through the die
model's rules (start-up plus bytes over the pipe's rate, and the L2 or HBM latency).
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np

from cmemu.die.kernels import vector_cycles
from cmemu.die.model import DieModel, ceil_div
from cmemu.fabric import aiv_initiator
from cmemu.lower.comm import FLOW_BASE
from cmemu.vocab import MSG_READ, MSG_WRITE, OP_KIND_COMP, OP_KIND_RECV, OP_KIND_SEND

# Phases of a collective's internal ops (Lowered.op_phase): what the dispatch and combine
# scenarios report. 0: none.
PHASES = ("", "setup", "send", "barrier", "status", "wait", "copy", "sum", "notify", "host")
PHASE = {name: i for i, name in enumerate(PHASES)}

KERNELS = ("low_latency", "normal")

SCALE_SLOT_BYTE = 32  # the fp32 scale's 32 B slot after the INT8 token ([OT] dispatch_v2.h: Align32(H) + 32)
TRIPLE_BYTE = 12  # (source rank, token, k) as three int32 ([OT] dispatch_v2.h FillTriple)
WINDOW_ALIGN_BYTE = 512  # a window slot's pitch ([OT] dispatch_v2.h WIN_ADDR_ALIGN)
FLAG_BYTE = 32  # one status entry ([OT] STATE_OFFSET)
QUANT_PASSES = 7  # Cast bf16->fp32, Abs, ReduceMax, Muls, Cast fp32->int32, ->half, ->int8 ([OT] QuantProcess)
COUNT_PASSES = 5  # Duplicate, Sub, Abs, Mins, ReduceSum ([OT] CalTokenSendExpertCnt)
SUM_PASSES = 3  # per routed output: Cast bf16->fp32, Muls by its weight, Add ([OT] combine_v2.h ProcessMoeExpert)
NOTIFY_DATA_INT32 = 3  # per local expert and round: count, offset, tokens ([SKN] notify_dispatch.h)
NOTIFY_FLAG_BYTE = 8  # [SKN] notify_dispatch.h: an 8 B magic flag per target (32 B stride)


def dispatch_write_byte(hidden: int, int8: bool = True) -> int:
    """What one dispatch write carries: the token (INT8, or BF16), its scale slot and triple."""
    return ceil_div(hidden * (1 if int8 else 2), 32) * 32 + SCALE_SLOT_BYTE + TRIPLE_BYTE


def window_slot_byte(hidden: int, int8: bool = True) -> int:
    """A dispatch window slot: the write padded to 512 B (7,680 B for hidden 7,168 in INT8)."""
    return ceil_div(dispatch_write_byte(hidden, int8), WINDOW_ALIGN_BYTE) * WINDOW_ALIGN_BYTE


class Steps:
    """What an AIV's steps take on a die (ps), from the die spec through the die model's rules: an
    MTE transfer is its start-up plus its bytes at the pipe's rate, and its data is there an L2
    or HBM latency later; a vector instruction is its start-up plus its fp32 elements at the
    vector width (die.kernels.vector_cycles)."""

    def __init__(self, die):
        self.m = DieModel.of(die)
        d = die
        self.d = d
        c = self.m.cycles_to_ps
        self.c = c
        self.mte2_rate = d.aiv_mte2_byte_per_cycle
        self.l2 = d.l2_hit_latency_cycles
        self.hbm_rd = d.hbm_read_latency_cycles
        self.hbm_wr = d.hbm_write_latency_cycles

    def mte2(self, nbytes: int) -> int:  # cycles the MTE2 is busy
        return self.d.mte2_startup_cycles + ceil_div(int(nbytes), self.mte2_rate)

    def mte3(self, nbytes: int) -> int:
        return self.d.mte3_startup_cycles + ceil_div(int(nbytes), self.d.mte3_byte_per_cycle)

    def load_ps(self, nbytes: int, from_hbm: bool = False) -> int:
        """GM -> UB, until the data is usable."""
        return self.c(self.mte2(nbytes) + (self.hbm_rd if from_hbm else self.l2))

    def store_ps(self, nbytes: int) -> int:
        """UB -> local GM, until it is in memory."""
        return self.c(self.mte3(nbytes) + self.hbm_wr)

    def vector_ps(self, elements: int, passes: int) -> int:
        return self.c(vector_cycles(self.m, int(elements), passes))

    def count_ps(self, n: int) -> int:
        """Counting the earlier of n pairs that go to one expert: five vector instructions over n
        int32, then the vector -> scalar hand-off (one L2 round trip: cross_core_flag's rule)."""
        if n <= 0:
            return 0
        return self.c(COUNT_PASSES * (self.d.vector_startup_cycles + ceil_div(4 * n, self.d.vector_bytes_per_cycle)))

    def count_ps_array(self, n: np.ndarray) -> np.ndarray:
        """count_ps of each of n (an int array), rounded as cycles_to_ps rounds."""
        n = np.asarray(n, dtype=np.int64)
        cycles = COUNT_PASSES * (self.d.vector_startup_cycles + -(-4 * n // self.d.vector_bytes_per_cycle))
        return np.where(n > 0, np.rint(cycles * self.m.cycle_ps), 0).astype(np.int64)

    def quant_ps(self, hidden: int) -> int:
        return self.vector_ps(hidden, QUANT_PASSES)

    def sync_all_ps(self) -> int:
        """SyncAll of the kernel's cores: every core sets a flag and waits for all the others':
        two cross-core flag latencies (die.cross_core_flag_latency_cycles: one L2 round trip each)."""
        return self.c(2 * self.d.cross_core_flag_latency_cycles)

    def poll_ps(self, nbytes: int) -> int:
        """One poll of a status area: read it GM -> UB (written by remote cores into HBM), sum the
        flags on the vector unit, compare on the scalar unit. A flag that lands is seen by the
        first poll that reads after it: the model takes one whole poll after the last lands."""
        return self.c(self.mte2(nbytes) + self.hbm_rd) + self.vector_ps(ceil_div(nbytes, 4), 1)

    def copy_rows_ps(self, rows: int, in_byte: int, out_bytes: tuple, from_hbm: bool = True) -> int:
        """An AIV moving ``rows`` rows window -> UB -> GM, double buffered: the next row's load
        runs while this row's stores do; each row takes the longer of its load and its stores."""
        if rows <= 0:
            return 0
        ld = self.mte2(in_byte)
        st = sum(self.mte3(b) for b in out_bytes)
        lat = self.hbm_rd if from_hbm else self.l2
        return self.c(lat + rows * max(ld, st) + st + self.hbm_wr)

    def weighted_sum_ps(self, k: int, hidden: int) -> int:
        """One token's combine: k expert outputs (BF16) loaded from the window (double buffered
        against the vector work), each cast, scaled by its weight and added; the sum cast back
        and stored."""
        ld = self.mte2(2 * hidden)
        vec = vector_cycles(self.m, hidden, SUM_PASSES)
        cast = vector_cycles(self.m, hidden, 1)
        return self.c(self.hbm_rd + k * max(ld, vec) + vec + cast + self.mte3(2 * hidden) + self.hbm_wr)


@lru_cache(maxsize=16)
def steps_of(die) -> Steps:
    return Steps(die)


def split_to_cores(n: int, cores: int) -> np.ndarray:
    """Contiguous shares of n items over the cores, the first n % cores one more ([OT] SplitToCore):
    the first item of each core, and n at the end (cores + 1 values)."""
    base, extra = divmod(n, cores)
    sizes = np.full(cores, base, dtype=np.int64)
    sizes[:extra] += 1
    return np.concatenate([[0], np.cumsum(sizes)])


def moe_aiv(ctx, entries, combine: bool, routing_experts, local: int):
    """Lower one MoE dispatch or combine on AIV-Direct with the kernel the node asks for;
    returns each member's last op."""
    kernel = ctx.attrs.get("cmemu.kernel", "low_latency")
    if kernel not in KERNELS:
        from cmemu.errors import TraceError

        raise TraceError(ctx.trace.path, f"cmemu.kernel must be one of {', '.join(KERNELS)}, got {kernel!r}",
                         ctx.nodes[0].id, "cmemu.kernel")
    entries = np.asarray(entries, dtype=np.int64)
    if combine:
        return _combine(ctx, entries, routing_experts, local, kernel)
    return _dispatch(ctx, entries, routing_experts, local, kernel)


# --- building blocks, vectorised over every member and core of the collective -----------------


def _per_member(ctx, n, phase, member, **cols):
    """Ops of the given members (an array, one op each)."""
    member = np.asarray(member, dtype=np.int64)
    return ctx.b.ops(n, rank=ctx.ranks[member], parent=np.asarray(ctx.ops)[member], phase=PHASE[phase], **cols)


def _messages(ctx, src_member, dst_member, nbytes, send_op, recv_op, core, prep=0, flow=0, kind=MSG_WRITE):
    """Messages issued by AIV ``core`` of ``src_member`` (the reader's for a read, whose data
    comes from ``dst_member``), in the order given: each AIV's in the order it issues them."""
    src_member = np.asarray(src_member, dtype=np.int64)
    if src_member.size == 0:
        return
    mine, peer = ctx.ranks[src_member], ctx.ranks[np.asarray(dst_member, dtype=np.int64)]
    src_ep, dst_ep = (peer, mine) if kind == MSG_READ else (mine, peer)
    ctx.b.messages_between(ctx.topo, src_ep, dst_ep, nbytes, send_op, recv_op, kind=kind,
                           ini=aiv_initiator(ctx.topo, mine, core), prep=prep, flow=flow)


def _segment_plan(seg, remote, own, local_cost, n_seg):
    """An AIV's send loop over its items (tokens or rows), for every loop at once. ``seg``: each
    item's loop (non-decreasing); ``remote``: whether it is a remote write; ``own``: the core's
    work for it; ``local_cost``: what a local item adds (its local write). A remote item's prep
    is its own work plus the local items' since the previous remote one of its loop (or the
    loop's start); a loop's tail is its local items' after its last remote one (all of them if it
    has none). Returns (prep of each remote item, whether each loop has one, each loop's tail)."""
    n = seg.size
    idx = np.arange(n, dtype=np.int64)
    carry = np.where(remote, 0, own + local_cost).astype(np.int64)
    csum = np.concatenate([[0], np.cumsum(carry)])
    seg_lo = np.searchsorted(seg, np.arange(n_seg), side="left")
    seg_hi = np.searchsorted(seg, np.arange(n_seg), side="right")
    base = np.maximum.accumulate(np.where(remote, idx + 1, 0)) if n else idx
    prev = np.concatenate([[0], base[:-1]]) if n else idx
    prev = np.maximum(prev, seg_lo[seg])
    ri = np.flatnonzero(remote)
    prep = own[ri] + csum[ri] - csum[prev[ri]]
    last_r = np.full(n_seg, -1, dtype=np.int64)
    np.maximum.at(last_r, seg[ri], ri)
    has = last_r >= 0
    after_last = np.minimum(np.maximum(last_r, 0) + 1, n)  # (a loop without a remote item: unused)
    tail = np.where(has, csum[seg_hi] - csum[after_last], csum[seg_hi] - csum[seg_lo])
    return prep.astype(np.int64), has, tail.astype(np.int64)


def _loops(ctx, entries, seg_member, seg_core, has, tail, nbytes, phase="send"):
    """One op per non-empty loop (a SEND holding its remote writes, or a COMP of its local work),
    after its member's entry, and a COMP of its tail after it. Returns (the loop op of each
    segment, the last op of each segment), -1 for an empty one."""
    b = ctx.b
    n_seg = seg_member.size
    live = has | (tail > 0)
    loop_op = np.full(n_seg, -1, dtype=np.int64)
    last = np.full(n_seg, -1, dtype=np.int64)
    sel = np.flatnonzero(live)
    if sel.size:
        kind = np.where(has[sel], OP_KIND_SEND, OP_KIND_COMP)
        loop_op[sel] = _per_member(ctx, sel.size, phase, seg_member[sel], kind=kind,
                                   dur=np.where(has[sel], 0, tail[sel]), aiv=1, lane=ctx.lane_aiv,
                                   nbytes=np.where(has[sel], nbytes[sel], 0))
        b.edges(entries[seg_member[sel]], loop_op[sel])
        last[sel] = loop_op[sel]
    t = np.flatnonzero(has & (tail > 0))
    if t.size:
        tails = _per_member(ctx, t.size, phase, seg_member[t], kind=OP_KIND_COMP, dur=tail[t], aiv=1, lane=ctx.lane_aiv)
        b.edges(loop_op[t], tails)
        last[t] = tails
    return loop_op, last


def _join(ctx, seg_member, last, members, phase, dur, **cols):
    """Per member, one op after the last ops of its loops (and a member's own start-up first)."""
    ops = _per_member(ctx, members, phase, np.arange(members), kind=OP_KIND_COMP, dur=dur, lane=ctx.lane_aiv, **cols)
    live = last >= 0
    ctx.b.edges(last[live], ops[seg_member[live]])
    return ops


def _dispatch(ctx, entries, experts, local, kernel):
    a = ctx.attrs
    b = ctx.b
    st = steps_of(ctx.die)
    members, A = len(ctx.ops), ctx.cores
    tokens, top_k, hidden = a["cmemu.tokens"], a["cmemu.top_k"], a["cmemu.hidden"]
    n_experts = members * local
    pairs = tokens * top_k
    write_b = dispatch_write_byte(hidden)
    token_b = 2 * hidden
    flat = experts.reshape(members, pairs)  # expert of each (token, k) pair, per source member
    dst = flat // local
    # Per pair: the token's load and its quantisation, and in the low-latency kernel first its
    # slot: a count over the pairs before it (the normal kernel has it from dispatch_layout).
    work = np.full(pairs, st.load_ps(token_b) + st.quant_ps(hidden), dtype=np.int64)
    if kernel == "low_latency":
        work += st.count_ps_array(np.arange(pairs))
    else:
        entries = notify(ctx, entries, local)
    local_write = st.store_ps(write_b)
    setup = st.load_ps(FLAG_BYTE, from_hbm=True) + st.store_ps(FLAG_BYTE) + st.load_ps(4 * pairs)
    bounds = split_to_cores(pairs, A)
    core_of_pair = np.searchsorted(bounds, np.arange(pairs), side="right") - 1
    work[bounds[:-1][bounds[:-1] < pairs]] += setup  # each core's first pair also sets it up
    # Experts per core for the status step; the low-latency kernel counts each of them over all
    # pairs (the normal kernel's flag carries no count: the counts went through notify_dispatch).
    ebounds = split_to_cores(n_experts, A)
    count_ps = st.count_ps(pairs) * int(np.max(np.diff(ebounds))) if kernel == "low_latency" else 0
    received = np.bincount(dst.ravel(), minlength=members)
    # A member's slots (local expert, source member), the kernel's order, split over its cores.
    slots = members * local
    sbounds = split_to_cores(slots, A)
    recv_slot = np.zeros((members, slots), dtype=np.int64)
    e = np.arange(n_experts)
    for src in range(members):
        recv_slot[e // local, (e % local) * members + src] = np.bincount(flat[src], minlength=n_experts)
    seg_member = np.repeat(np.arange(members), A)
    seg_core = np.tile(np.arange(A), members)
    if kernel == "low_latency":
        m_of = np.repeat(np.arange(members), pairs)
        seg = m_of * A + np.tile(core_of_pair, members)
        remote = dst.ravel() != m_of
        prep, has, tail = _segment_plan(seg, remote, np.tile(work, members), local_write, members * A)
        nbytes = np.bincount(seg[remote], minlength=members * A) * write_b
        loop_op, last = _loops(ctx, entries, seg_member, seg_core, has, tail, nbytes)
        ri = np.flatnonzero(remote)
        _messages(ctx, m_of[ri], dst.ravel()[ri], write_b, loop_op[seg[ri]], -1, seg_core[seg[ri]], prep,
                  1 | FLOW_BASE)
    else:
        # Every pair into the die's own window (local writes); a core's next pair's work runs
        # under its previous write, which it waits for.
        per_core = np.add.reduceat(np.maximum(work, local_write), bounds[:-1][bounds[:-1] < pairs])
        share_ps = int(per_core.max()) + local_write if pairs else 0
        share = _per_member(ctx, members, "send", np.arange(members), kind=OP_KIND_COMP, dur=share_ps, aiv=A,
                            lane=ctx.lane_aiv, nbytes=pairs * (token_b + write_b), hbm=pairs * (token_b + write_b))
        b.edges(entries, share)
        last = share
        seg_member = np.arange(members)
    # Status: count, barrier, one flag per (this die, expert) for every expert on another die.
    barrier = _join(ctx, seg_member, last, members, "barrier", count_ps + st.sync_all_ps())
    e_of = np.tile(np.arange(n_experts), members)
    m_of = np.repeat(np.arange(members), n_experts)
    far = e_of // local != m_of
    status = _per_member(ctx, members, "status", np.arange(members), kind=OP_KIND_SEND, lane=ctx.lane_aiv,
                         nbytes=FLAG_BYTE * int(far.sum() // members))
    b.edges(barrier, status)
    waits = _per_member(ctx, members, "wait", np.arange(members), kind=OP_KIND_RECV, lane=ctx.lane_aiv,
                        nbytes=FLAG_BYTE * (members - 1) * local)
    b.edges(status, waits)  # a core polls once its own flags are out
    fe, fm = e_of[far], m_of[far]
    _messages(ctx, fm, fe // local, FLAG_BYTE, status[fm], waits[fe // local],
              np.searchsorted(ebounds, fe, side="right") - 1)
    seen = _per_member(ctx, members, "wait", np.arange(members), kind=OP_KIND_COMP, lane=ctx.lane_aiv,
                       dur=st.poll_ps(FLAG_BYTE * int(np.max(np.diff(sbounds)))) + st.sync_all_ps()
                       + st.load_ps(4 * A))
    b.edges(waits, seen)
    cs = np.concatenate([np.zeros((members, 1), dtype=np.int64), np.cumsum(recv_slot, axis=1)], axis=1)
    rows_per_core = cs[:, sbounds[1:]] - cs[:, sbounds[:-1]]  # [members, A]
    if kernel == "low_latency":
        copy_ps = np.array([st.copy_rows_ps(int(r), write_b, (TRIPLE_BYTE, 4, hidden))
                            for r in rows_per_core.max(axis=1)], dtype=np.int64)
        copy = _per_member(ctx, members, "copy", np.arange(members), kind=OP_KIND_COMP,
                           dur=copy_ps + (st.sync_all_ps() if local > 1 else 0), aiv=A, lane=ctx.lane_aiv,
                           nbytes=received * (write_b + hidden), hbm=received * (write_b + hidden))
        b.edges(seen, copy)
        return copy
    return _pull(ctx, seen, recv_slot, sbounds, write_b, hidden, local)


def _pull(ctx, start, recv_slot, sbounds, write_b, hidden, local):
    """Normal dispatch's last step: each core reads its slots' tokens from the source dies'
    windows, one at a time (the kernel dequeues each token before its stores and the next
    read), storing each row in expert order under the next read; its local rows are read from its
    own window."""
    b = ctx.b
    st = steps_of(ctx.die)
    members, A = recv_slot.shape[0], len(sbounds) - 1
    slots = recv_slot.shape[1]
    core_of_slot = np.searchsorted(sbounds, np.arange(slots), side="right") - 1
    src_of_slot = np.arange(slots) % members
    # Rows in (member, slot, row) order: each core's rows are contiguous, in its order.
    counts = recv_slot.ravel()
    m_of = np.repeat(np.repeat(np.arange(members), slots), counts)
    slot = np.repeat(np.tile(np.arange(slots), members), counts)
    seg = m_of * A + core_of_slot[slot]
    src = src_of_slot[slot]
    remote = src != m_of
    n_seg = members * A
    n_remote = np.bincount(seg[remote], minlength=n_seg)
    n_local = np.bincount(seg[~remote], minlength=n_seg)
    stores = st.c(sum(st.mte3(x) for x in (TRIPLE_BYTE, 4, hidden)) + st.hbm_wr)
    tail = np.array([st.copy_rows_ps(int(k), write_b, (TRIPLE_BYTE, 4, hidden)) if k else 0 for k in range(
        int(n_local.max()) + 1)], dtype=np.int64)[n_local] + np.where(n_remote > 0, stores, 0)
    seg_member = np.repeat(np.arange(members), A)
    has = n_remote > 0
    live = np.flatnonzero(has | (n_local > 0))
    recv = np.full(n_seg, -1, dtype=np.int64)
    r = np.flatnonzero(has)
    if r.size:
        recv[r] = _per_member(ctx, r.size, "copy", seg_member[r], kind=OP_KIND_RECV, aiv=1, lane=ctx.lane_aiv,
                              nbytes=write_b * n_remote[r])
        b.edges(start[seg_member[r]], recv[r])
    done = _per_member(ctx, live.size, "copy", seg_member[live], kind=OP_KIND_COMP, dur=tail[live], aiv=1,
                       lane=ctx.lane_aiv)
    b.edges(np.where(recv[live] >= 0, recv[live], start[seg_member[live]]), done)
    last = np.full(n_seg, -1, dtype=np.int64)
    last[live] = done
    ri = np.flatnonzero(remote)
    _messages(ctx, m_of[ri], src[ri], write_b, -1, recv[seg[ri]], seg[ri] % A, 0, 1, kind=MSG_READ)
    exit_ = _join(ctx, seg_member, last, members, "copy", st.sync_all_ps() if local > 1 else 0)
    b.edges(start, exit_)
    return exit_


def notify(ctx, entries, local):
    """Normal dispatch's count exchange (notify_dispatch) and the host's two synchronisations
    before the data kernel ([SKN] deep_ep.cpp: max_bs.item(), total_recv_token.item()): returns
    each member's op after which the data kernel starts."""
    b = ctx.b
    st = steps_of(ctx.die)
    members, A = len(ctx.ops), ctx.cores
    n_experts = members * local
    every = np.arange(members)
    # Core 0 lays out (count, offset, tokens) per expert with scalar loops, then a barrier.
    assemble_ps = st.c(n_experts * 3 * 4) + st.store_ps(NOTIFY_DATA_INT32 * 4 * n_experts) + st.sync_all_ps()
    per_target = NOTIFY_DATA_INT32 * 4 * local
    asm = _per_member(ctx, members, "notify", every, kind=OP_KIND_COMP, dur=assemble_ps, aiv=1, lane=ctx.lane_aiv)
    b.edges(entries, asm)
    flags = _per_member(ctx, members, "notify", every, kind=OP_KIND_SEND, lane=ctx.lane_aiv,
                        nbytes=NOTIFY_FLAG_BYTE * (members - 1))
    waits = _per_member(ctx, members, "notify", every, kind=OP_KIND_RECV, lane=ctx.lane_aiv,
                        nbytes=NOTIFY_FLAG_BYTE * (members - 1))
    b.edges(asm, flags)
    b.edges(asm, waits)
    # Member m's core c serves the targets m + 1 + c, m + 1 + c + A, ... ([SKN] notify_dispatch.h:
    # a core per target rank), each after its copy of the target's slice into its own window.
    m_of = np.repeat(every, members - 1)
    k = np.tile(np.arange(1, members), members)
    peer = (m_of + k) % members
    core = peer % A
    order = np.lexsort((k, core, m_of))  # each core's targets in a row
    m_of, peer, core = m_of[order], peer[order], core[order]
    _messages(ctx, m_of, peer, NOTIFY_FLAG_BYTE, flags[m_of], waits[peer], core, st.store_ps(per_target))
    seen = _per_member(ctx, members, "notify", every, kind=OP_KIND_COMP, dur=st.poll_ps(FLAG_BYTE), lane=ctx.lane_aiv)
    b.edges(waits, seen)
    pull = _per_member(ctx, members, "notify", every, kind=OP_KIND_RECV, lane=ctx.lane_aiv,
                       nbytes=per_target * (members - 1))
    b.edges(seen, pull)
    _messages(ctx, m_of, peer, per_target, -1, pull[m_of], core, 0, 1, kind=MSG_READ)
    build = _per_member(ctx, members, "notify", every, kind=OP_KIND_COMP, lane=ctx.lane_aiv,
                        dur=st.sync_all_ps() + st.c(members * local * 4) + st.store_ps(4 * members * local))
    b.edges(pull, build)
    host = _per_member(ctx, members, "host", every, kind=OP_KIND_COMP, dur=2 * round(ctx.comm.host_sync_ns * 1000),
                       lane=ctx.lane_aiv)
    b.edges(build, host)
    return host


def _combine(ctx, entries, experts, local, kernel):
    a = ctx.attrs
    b = ctx.b
    st = steps_of(ctx.die)
    members, A = len(ctx.ops), ctx.cores
    tokens, top_k, hidden = a["cmemu.tokens"], a["cmemu.top_k"], a["cmemu.hidden"]
    row_b = 2 * hidden
    flat = experts.reshape(members, tokens * top_k)
    # Rows each member holds, in the dispatch's output order: local expert, source member, the
    # source's pair order.
    src_of = np.repeat(np.arange(members), tokens * top_k)
    pair_of = np.tile(np.arange(tokens * top_k), members)
    e = flat.ravel()
    h = e // local
    order = np.lexsort((pair_of, src_of, e % local, h))
    h_sorted = h[order]
    hb = np.searchsorted(h_sorted, np.arange(members + 1))
    n_held = np.diff(hb)
    # Each holder's rows split over its cores, contiguous; a core's loop starts at (loop + rank)
    # mod n in the low-latency kernel (its staggered send).
    pos = np.arange(order.size) - hb[h_sorted]  # place among its holder's rows
    cb = np.stack([split_to_cores(int(n), A) for n in n_held])  # [members, A + 1]
    core = (pos[:, None] >= cb[h_sorted, 1:]).sum(axis=1)  # its core
    lo = cb[h_sorted, core]
    k = cb[h_sorted, core + 1] - lo
    if kernel == "low_latency":
        rows = order[hb[h_sorted] + lo + (pos - lo + h_sorted) % k]
    else:
        rows = order
    src, tok = src_of[rows], pair_of[rows] // top_k
    seg = h_sorted * A + core
    remote = src != h_sorted
    load = st.load_ps(row_b)
    local_row = load + st.store_ps(row_b) + st.store_ps(FLAG_BYTE)
    prep, has, tail = _segment_plan(seg, remote, np.full(rows.size, load, dtype=np.int64), local_row - load,
                                    members * A)
    seg_member = np.repeat(np.arange(members), A)
    seg_core = np.tile(np.arange(A), members)
    nbytes = np.bincount(seg[remote], minlength=members * A) * (row_b + FLAG_BYTE)
    loop_op, last = _loops(ctx, entries, seg_member, seg_core, has, tail, nbytes)
    # Each member's receive chains: per core a run of its tokens, per token a receive of its K
    # flags then a poll and its weighted sum; a core's chain follows its own send loop.
    tbounds = split_to_cores(tokens, A)
    sum_ps = st.weighted_sum_ps(top_k, hidden) + st.poll_ps(FLAG_BYTE * top_k)
    chain = _per_member(ctx, 2 * tokens * members, "sum", np.repeat(np.arange(members), 2 * tokens),
                        kind=np.tile([OP_KIND_RECV, OP_KIND_COMP], tokens * members), dur=np.tile([0, sum_ps], tokens * members),
                        aiv=1, lane=ctx.lane_aiv, nbytes=np.tile([FLAG_BYTE * top_k, (top_k + 1) * row_b],
                                                                  tokens * members),
                        hbm=np.tile([0, (top_k + 1) * row_b], tokens * members)).reshape(members, tokens, 2)
    recv_of = chain[:, :, 0]
    t_core = np.searchsorted(tbounds, np.arange(tokens), side="right") - 1
    ops_flat = chain.reshape(members, 2 * tokens)
    same = np.repeat(t_core, 2)[1:] == np.repeat(t_core, 2)[:-1]  # consecutive ops of one core's chain
    b.edges(ops_flat[:, :-1][:, same].ravel(), ops_flat[:, 1:][:, same].ravel())
    firsts = tbounds[:-1][np.diff(tbounds) > 0]
    chain_core = t_core[firsts]
    for_seg = np.arange(members)[:, None] * A + chain_core[None, :]
    start = np.where(last[for_seg] >= 0, last[for_seg], entries[:, None])
    b.edges(start.ravel(), recv_of[:, firsts].ravel())
    lasts = tbounds[1:][np.diff(tbounds) > 0] - 1
    exit_ = _join(ctx, seg_member, last, members, "sum", 0)
    b.edges(chain[:, lasts, 1].ravel(), np.repeat(exit_, lasts.size))
    b.edges(entries, exit_)
    # The rows and their flags: data, flag, data, flag, ...: the flag waits for its data's write
    # (flow 1); the next row's load runs from the data's issue (low latency) or, after the full
    # barrier of the normal kernel, from the flag's.
    ri = np.flatnonzero(remote)
    nr = ri.size
    two = np.repeat(ri, 2)
    sizes = np.tile([row_b, FLAG_BYTE], nr)
    preps = np.zeros(2 * nr, dtype=np.int64)
    preps[0::2] = prep
    flows = np.tile([FLOW_BASE, 1] if kernel == "low_latency" else [0, 1 | FLOW_BASE], nr)
    recvs = np.full(2 * nr, -1, dtype=np.int64)
    recvs[1::2] = recv_of[src[ri], tok[ri]]
    _messages(ctx, h_sorted[two], src[two], sizes, loop_op[seg[two]], recvs, seg_core[seg[two]], preps, flows)
    return exit_
