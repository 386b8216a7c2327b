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

Remote accesses are the AIVs' own (cmemu.lower.fabric.aiv_initiator): each AIV issues its writes
and reads through its MTE pipes, in the kernel's order and with the kernel's waits
(cmemu.lower.comm: prep and flow). Vector and MTE work is timed from the die spec through the die
model's rules (start-up plus bytes over the pipe's rate, and the L2 or HBM latency).
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np

from cmemu.die.kernels import vector_cycles
from cmemu.die.model import DieModel, ceil_div
from cmemu.lower.comm import FLOW_BASE
from cmemu.lower.fabric import MSG_READ, MSG_WRITE, aiv_initiator

OP_COMP, OP_SEND, OP_RECV = 0, 1, 2  # cmemu.lower.OP_KIND_* (no import cycle)

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


def _stream(ctx, m, dst_members, nbytes, prep, flow, aiv, send_op, recv_op, kind=MSG_WRITE):
    """Messages of AIV ``aiv`` of member m, in the order the AIV issues them."""
    if len(dst_members) == 0:
        return
    dst_ep = ctx.ranks[np.asarray(dst_members)]
    src_ep = np.full(dst_ep.size, ctx.ranks[m])
    if kind == MSG_READ:  # a read's data leaves the target: the message goes from it to the reader
        src_ep, dst_ep = dst_ep, src_ep
    ctx.b.messages_between(ctx.topo, src_ep, dst_ep, nbytes, send_op, recv_op, kind=kind,
                           ini=aiv_initiator(ctx.topo, ctx.ranks[m], aiv), prep=prep, flow=flow)


def moe_aiv(ctx, entries, combine: bool, routing_experts, local: int):
    """Lower one MoE dispatch or combine on AIV-Direct with the kernel the node asks for;
    returns each member's last op."""
    kernel = ctx.attrs.get("cmemu.kernel", "low_latency")
    if kernel not in KERNELS:
        from cmemu.errors import TraceError

        raise TraceError(ctx.trace.path, f"cmemu.kernel must be one of {', '.join(KERNELS)}, got {kernel!r}",
                         ctx.nodes[0].id, "cmemu.kernel")
    if combine:
        return _combine(ctx, entries, routing_experts, local, kernel)
    return _dispatch(ctx, entries, routing_experts, local, kernel)


def _ops(ctx, m, n, phase, **cols):
    return ctx.b.ops(n, rank=int(ctx.ranks[m]), parent=ctx.ops[m], phase=PHASE[phase], **cols)


def _op(ctx, m, phase, **cols):
    return int(_ops(ctx, m, 1, phase, **cols)[0])


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
    # Per pair: the token's load and its quantisation, and in the low-latency kernel first its slot:
    # a count over the pairs before it (grows with its index; the normal kernel has it from
    # dispatch_layout).
    work = np.full(pairs, st.load_ps(token_b) + st.quant_ps(hidden), dtype=np.int64)
    if kernel == "low_latency":
        work += st.count_ps_array(np.arange(pairs))
    else:
        entries = notify(ctx, entries, local)
    local_write = st.store_ps(write_b)
    setup = st.load_ps(FLAG_BYTE, from_hbm=True) + st.store_ps(FLAG_BYTE) + st.load_ps(4 * pairs)
    bounds = split_to_cores(pairs, A)
    exits = []
    # Experts per core for the status step, and the count each core makes for its experts.
    ebounds = split_to_cores(n_experts, A)
    # The low-latency kernel counts each of its experts' pairs for the status entry; the normal
    # kernel's flag carries no count (the counts went through notify_dispatch).
    count_ps = st.count_ps(pairs) * int(np.max(np.diff(ebounds))) if n_experts and kernel == "low_latency" else 0
    received = np.bincount(dst.ravel(), minlength=members)  # rows each member gets
    # Slots (source member, local expert) each core of a member polls and copies: contiguous.
    slots = members * local
    sbounds = split_to_cores(slots, A)
    recv_slot = np.zeros((members, slots), dtype=np.int64)  # rows in each of a member's slots
    for src in range(members):
        cnt = np.bincount(flat[src], minlength=n_experts)  # the source's pairs per expert
        e = np.arange(n_experts)
        recv_slot[e // local, (e % local) * members + src] = cnt
    flag_recvs = []
    for m in range(members):
        entry = entries[m]
        sends = []
        if kernel == "low_latency":
            sends = _ll_pair_writes(ctx, m, entry, dst[m], bounds, work, local_write, setup, write_b)
            phase_send = sends
        else:
            # Normal: every pair into the die's own window (local writes), then a pull.
            per_core = []
            for c in range(A):
                lo, hi = bounds[c], bounds[c + 1]
                per_core.append(setup + int(np.sum(np.maximum(work[lo:hi], local_write))) + (local_write if hi > lo else 0))
            share = _op(ctx, m, "send", kind=OP_COMP, dur=max(per_core), aiv=A, lane=ctx.lane_aiv,
                        nbytes=pairs * (token_b + write_b), hbm=pairs * (token_b + write_b))
            b.edges(entry, share)
            sends = [share]
        # Status: count, barrier, one flag per (this die, expert) for every expert on another die.
        barrier = _op(ctx, m, "barrier", kind=OP_COMP, dur=count_ps + st.sync_all_ps(), lane=ctx.lane_aiv)
        b.edges(np.asarray(sends), np.full(len(sends), barrier))
        e_all = np.arange(n_experts)
        remote_e = e_all[e_all // local != m]
        status = _op(ctx, m, "status", kind=OP_SEND, lane=ctx.lane_aiv, nbytes=FLAG_BYTE * remote_e.size)
        b.edges(barrier, status)
        core_of_e = np.searchsorted(ebounds, remote_e, side="right") - 1
        order = np.argsort(core_of_e, kind="stable")
        flag_recvs.append((m, status, remote_e[order], core_of_e[order]))
        exits.append(status)
    # Every member's wait: a receive of the flags of every other die for its experts.
    waits = [_op(ctx, m, "wait", kind=OP_RECV, lane=ctx.lane_aiv, nbytes=FLAG_BYTE * (members - 1) * local)
             for m in range(members)]
    for m, status, es, cores in flag_recvs:
        d = es // local
        for c in np.unique(cores):
            sel = cores == c
            _stream(ctx, m, d[sel], FLAG_BYTE, 0, 0, int(c), status, np.asarray(waits)[d[sel]])
    out = []
    for m in range(members):
        b.edges(exits[m], waits[m])  # polling starts after the barrier (and one's own flags went out)
        seen = _op(ctx, m, "wait", kind=OP_COMP, lane=ctx.lane_aiv,
                   dur=st.poll_ps(FLAG_BYTE * int(np.max(np.diff(sbounds)))) + st.sync_all_ps()
                   + st.load_ps(4 * A, from_hbm=False))
        b.edges(waits[m], seen)
        cs = np.concatenate([[0], np.cumsum(recv_slot[m])])
        per_core = cs[sbounds[1:]] - cs[sbounds[:-1]]
        if kernel == "low_latency":
            copy_ps = max(st.copy_rows_ps(int(r), write_b, (TRIPLE_BYTE, 4, hidden)) for r in per_core)
            copy = _op(ctx, m, "copy", kind=OP_COMP, dur=copy_ps + (st.sync_all_ps() if local > 1 else 0),
                       aiv=A, lane=ctx.lane_aiv, nbytes=int(received[m]) * (write_b + hidden),
                       hbm=int(received[m]) * (write_b + hidden))
            b.edges(seen, copy)
            out.append(copy)
        else:
            out.append(_pull(ctx, m, seen, recv_slot[m], sbounds, write_b, hidden, local))
    return np.asarray(out)


def _ll_pair_writes(ctx, m, entry, dst_of_pair, bounds, work, local_write, setup, write_b):
    """Member m's pair writes, one AIV stream per core: returns the cores' ops."""
    b = ctx.b
    ops = []
    for c in range(len(bounds) - 1):
        lo, hi = bounds[c], bounds[c + 1]
        if hi == lo:
            continue
        d = dst_of_pair[lo:hi]
        w = work[lo:hi].copy()
        w[0] += setup
        remote = d != m
        # A local pair's work and its local write come before the next remote write.
        carry = np.where(remote, 0, w + local_write)
        prep = w.copy()
        acc = 0
        ri = np.flatnonzero(remote)
        if ri.size == 0:
            op = _op(ctx, m, "send", kind=OP_COMP, dur=int(carry.sum()), aiv=1, lane=ctx.lane_aiv)
            b.edges(entry, op)
            ops.append(op)
            continue
        csum = np.concatenate([[0], np.cumsum(carry)])
        prev = np.concatenate([[0], ri[:-1] + 1])
        prep_r = prep[ri] + (csum[ri] - csum[prev])
        tail = int(csum[-1] - csum[ri[-1] + 1])
        send = _op(ctx, m, "send", kind=OP_SEND, aiv=1, lane=ctx.lane_aiv, nbytes=write_b * ri.size)
        b.edges(entry, send)
        _stream(ctx, m, d[ri], write_b, prep_r, 1 | FLOW_BASE, c, send, -1)
        if tail:
            t = _op(ctx, m, "send", kind=OP_COMP, dur=tail, aiv=1, lane=ctx.lane_aiv)
            b.edges(send, t)
            send = t
        ops.append(send)
    return ops


def _pull(ctx, m, start, rows_of_slot, sbounds, write_b, hidden, local):
    """Normal dispatch's last step on member m: each core reads its slots' tokens from the source
    dies' windows, one at a time, and stores them in expert order under the next read."""
    b = ctx.b
    st = steps_of(ctx.die)
    members = len(ctx.ops)
    ends = []
    for c in range(len(sbounds) - 1):
        srcs = []
        for s in range(sbounds[c], sbounds[c + 1]):
            src = s % members
            n = int(rows_of_slot[s])
            srcs += [src] * n
        srcs = np.asarray(srcs, dtype=np.int64)
        remote = srcs != m
        n_local = int((~remote).sum())
        if remote.sum() == 0 and n_local == 0:
            continue
        recv = _op(ctx, m, "copy", kind=OP_RECV, aiv=1, lane=ctx.lane_aiv, nbytes=write_b * int(remote.sum()))
        b.edges(start, recv)
        # The stores of each row (12 + 4 + hidden B) run behind the next reads (double buffered):
        # after the last read, its row's stores, and any local rows (read from one's own window).
        tail = st.copy_rows_ps(n_local, write_b, (TRIPLE_BYTE, 4, hidden)) if n_local else 0
        tail += st.c(sum(st.mte3(x) for x in (TRIPLE_BYTE, 4, hidden)) + st.hbm_wr)
        # One read in flight: the kernel dequeues each token (EnQue then DeQue) before it issues
        # its stores and the next read ([SKN] cam_moe_dispatch_normal.h ShareToOutputLongSeq); the
        # double buffer lets the stores of one row run under the next read.
        _stream(ctx, m, srcs[remote], write_b, 0, 1, c, -1, recv, kind=MSG_READ)
        done = _op(ctx, m, "copy", kind=OP_COMP, dur=tail, aiv=1, lane=ctx.lane_aiv)
        b.edges(recv, done)
        ends.append(done)
    exit_ = _op(ctx, m, "copy", kind=OP_COMP, dur=st.sync_all_ps() if local > 1 else 0, lane=ctx.lane_aiv)
    b.edges(np.asarray(ends, dtype=np.int64) if ends else start, np.full(max(len(ends), 1), exit_))
    return exit_


def notify(ctx, entries, local):
    """Normal dispatch's count exchange (notify_dispatch) and the host's two synchronisations
    before the data kernel ([SKN] deep_ep.cpp: max_bs.item(), total_recv_token.item()): returns
    each member's op after which the data kernel starts."""
    b = ctx.b
    st = steps_of(ctx.die)
    members, A = len(ctx.ops), ctx.cores
    n_experts = members * local
    # Core 0 lays out (count, offset, tokens) per expert with scalar loops, then a barrier.
    assemble_ps = st.c(n_experts * 3 * 4) + st.store_ps(NOTIFY_DATA_INT32 * 4 * n_experts) + st.sync_all_ps()
    per_target = NOTIFY_DATA_INT32 * 4 * local
    waits, starts = [], []
    for m in range(members):
        asm = _op(ctx, m, "notify", kind=OP_COMP, dur=assemble_ps, aiv=1, lane=ctx.lane_aiv)
        b.edges(entries[m], asm)
        flags = _op(ctx, m, "notify", kind=OP_SEND, lane=ctx.lane_aiv, nbytes=NOTIFY_FLAG_BYTE * (members - 1))
        b.edges(asm, flags)
        waits.append(_op(ctx, m, "notify", kind=OP_RECV, lane=ctx.lane_aiv,
                         nbytes=NOTIFY_FLAG_BYTE * (members - 1)))
        b.edges(asm, waits[-1])
        starts.append(flags)
    for m in range(members):
        others = np.array([(m + k) % members for k in range(1, members)], dtype=np.int64)
        core = others % A  # core c serves targets c, c + A, ...: [SKN] notify_dispatch.h
        for c in np.unique(core):
            sel = core == c
            _stream(ctx, m, others[sel], NOTIFY_FLAG_BYTE, st.store_ps(per_target), 0, int(c), starts[m],
                    np.asarray(waits)[others[sel]])
    out = []
    host = round(ctx.comm.host_sync_ns * 1000)
    for m in range(members):
        seen = _op(ctx, m, "notify", kind=OP_COMP, dur=st.poll_ps(FLAG_BYTE), lane=ctx.lane_aiv)
        b.edges(waits[m], seen)
        others = np.array([(m + k) % members for k in range(1, members)], dtype=np.int64)
        pull = _op(ctx, m, "notify", kind=OP_RECV, lane=ctx.lane_aiv, nbytes=per_target * others.size)
        b.edges(seen, pull)
        core = others % A
        for c in np.unique(core):
            sel = core == c
            _stream(ctx, m, others[sel], per_target, 0, 1, int(c), -1, pull, kind=MSG_READ)
        build = _op(ctx, m, "notify", kind=OP_COMP, lane=ctx.lane_aiv,
                    dur=st.sync_all_ps() + st.c(members * local * 4) + st.store_ps(4 * members * local))
        b.edges(pull, build)
        h = _op(ctx, m, "host", kind=OP_COMP, dur=2 * host, lane=ctx.lane_aiv)
        b.edges(build, h)
        out.append(h)
    return np.asarray(out)


def _combine(ctx, entries, experts, local, kernel):
    a = ctx.attrs
    b = ctx.b
    st = steps_of(ctx.die)
    members, A = len(ctx.ops), ctx.cores
    tokens, top_k, hidden = a["cmemu.tokens"], a["cmemu.top_k"], a["cmemu.hidden"]
    row_b = 2 * hidden
    flat = experts.reshape(members, tokens * top_k)
    holder = flat // local  # who holds each (source, token, k) row
    # Rows a member holds, in dispatch output order: local expert, source member, the source's
    # pair order.
    src_of = np.repeat(np.arange(members), tokens * top_k)
    pair_of = np.tile(np.arange(tokens * top_k), members)
    e = flat.ravel()
    h = holder.ravel()
    order = np.lexsort((pair_of, src_of, e % local, h))
    h_sorted = h[order]
    hb = np.searchsorted(h_sorted, np.arange(members + 1))
    load = st.load_ps(row_b)
    local_row = load + st.store_ps(row_b) + st.store_ps(FLAG_BYTE)
    sum_ps = st.weighted_sum_ps(top_k, hidden) + st.poll_ps(FLAG_BYTE * top_k)
    tbounds = split_to_cores(tokens, A)
    # Each member's receive chain per core: per token a receive of its K flags, then its sum.
    recv_of = np.full((members, tokens), -1, dtype=np.int64)
    chains = []
    for m in range(members):
        per = []
        for c in range(A):
            lo, hi = tbounds[c], tbounds[c + 1]
            if hi == lo:
                continue
            ops = _ops(ctx, m, 2 * (hi - lo), "sum", kind=np.tile([OP_RECV, OP_COMP], hi - lo),
                       dur=np.tile([0, sum_ps], hi - lo), aiv=1, lane=ctx.lane_aiv,
                       nbytes=np.tile([FLAG_BYTE * top_k, top_k * row_b + row_b], hi - lo),
                       hbm=np.tile([0, top_k * row_b + row_b], hi - lo))
            recv_of[m, lo:hi] = ops[0::2]
            if ops.size > 1:
                b.edges(ops[:-1], ops[1:])
            per.append((c, ops[0], ops[-1]))
        chains.append(per)
    exits = []
    for m in range(members):
        rows = order[hb[m]:hb[m + 1]]
        n = rows.size
        bounds = split_to_cores(n, A)
        ends = {}
        for c in range(A):
            lo, hi = bounds[c], bounds[c + 1]
            k = hi - lo
            if k == 0:
                continue
            sel = rows[lo:hi]
            if kernel == "low_latency":  # staggered: start at (loop + rank) % n ([OT] combine_v2.h)
                sel = sel[(np.arange(k) + m) % k]
            src = src_of[sel]
            tok = pair_of[sel] // top_k
            remote = src != m
            ri = np.flatnonzero(remote)
            carry = np.where(remote, 0, local_row)
            if ri.size == 0:
                op = _op(ctx, m, "send", kind=OP_COMP, dur=int(carry.sum()), aiv=1, lane=ctx.lane_aiv)
                b.edges(entries[m], op)
                ends[c] = op
                continue
            csum = np.concatenate([[0], np.cumsum(carry)])
            prev = np.concatenate([[0], ri[:-1] + 1])
            prep = load + (csum[ri] - csum[prev])
            tail = int(csum[-1] - csum[ri[-1] + 1])
            send = _op(ctx, m, "send", kind=OP_SEND, aiv=1, lane=ctx.lane_aiv, nbytes=(row_b + FLAG_BYTE) * ri.size)
            b.edges(entries[m], send)
            # data, flag, data, flag, ...: the flag waits for its data's write (flow 1); the
            # next row's load runs from the data's issue (low latency) or, after the full barrier
            # of the normal kernel, from the flag's.
            nr = ri.size
            dsts = np.repeat(src[ri], 2)
            sizes = np.tile([row_b, FLAG_BYTE], nr)
            preps = np.zeros(2 * nr, dtype=np.int64)
            preps[0::2] = prep
            flows = np.tile([FLOW_BASE, 1] if kernel == "low_latency" else [0, 1 | FLOW_BASE], nr)
            recvs = np.full(2 * nr, -1, dtype=np.int64)
            recvs[1::2] = recv_of[src[ri], tok[ri]]
            _stream(ctx, m, dsts, sizes, preps, flows, c, send, recvs)
            if tail:
                t = _op(ctx, m, "send", kind=OP_COMP, dur=tail, aiv=1, lane=ctx.lane_aiv)
                b.edges(send, t)
                send = t
            ends[c] = send
        exits.append(ends)
    out = []
    for m in range(members):
        exit_ = _op(ctx, m, "sum", kind=OP_COMP, dur=0, lane=ctx.lane_aiv)
        for c, first, last in chains[m]:
            # The core's receive loop follows its send loop (no barrier between).
            b.edges(exits[m][c] if c in exits[m] else entries[m], first)
            b.edges(last, exit_)
        for c, op in exits[m].items():
            b.edges(op, exit_)
        b.edges(entries[m], exit_)
        out.append(exit_)
    return np.asarray(out)
