"""COMM_COLL: collectives and MoE dispatch/combine lowered to ops, messages and flags.

Each member's COMM_COLL node becomes its *exit*: it ends when the member's part is done. An
*entry* op takes the node's dependencies; from it the member's internal ops run, on one of two
engines (docs/machine.md 2.5):

- **SDMA**: the die's ``comm.sdma_engines`` DMA engines take one descriptor per destination, in
  turn. A descriptor costs ``comm.sdma_descriptor_startup_ns`` before its data moves, and keeps its
  engine busy for its bytes at ``comm.sdma_engine_gbyte_per_s`` (the transfer itself is the
  fabric's: a write message). No core is used, except for local work (quantising, reducing).
- **AIV-Direct**: ``cmemu.cores`` vector cores (all of the die's by default) each take every
  A-th piece of work: load it from GM into their Unified Buffer (for MoE dispatch: read the token
  and quantise it to INT8) and write it straight into the destination's memory over UB. Each
  load holds one AIV while it runs, so other vector work on the die waits for free cores.

Completion is by flags, as the real kernels do it: when every write a member issued has been
acknowledged (a fence), it writes a ``comm.flag_byte`` status entry to each other member; a
member polls its own status area and sees the last flag at most ``comm.flag_poll_interval_ns``
after it lands (taken as exactly that); then it does its local work (copying received tokens into
expert order, a reduction, MoE combine's weighted sum) and its exit ends.

Algorithms: ALL_TO_ALL, ALL_GATHER and BROADCAST write directly to every destination (the UB
Clos gives every pair of dies a path: no ring or tree is needed); REDUCE_SCATTER writes each
member's share to it and reduces there; ALL_REDUCE is a reduce-scatter followed by an all-gather
of the reduced shares. MOE_DISPATCH/MOE_COMBINE follow [MC2] (docs/machine.md 2.5): token-by-token writes
of (token, expert) pairs to the die holding the expert, then the flag exchange, then the local copy
(dispatch) or weighted sum (combine). Routing is drawn from a seeded distribution (uniform, or
Zipf-skewed by ``cmemu.skew``) and is the same for a dispatch and the combine with the same
attributes. Writes to one's own die are local copies and take no message.
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np

from cmemu.units import ns_to_ps
from cmemu.vocab import MSG_WRITE, OP_KIND_COMP, OP_KIND_RECV, OP_KIND_SEND, PIPE_CODE
from cmemu.workload.moe import dispatch_payload_byte, moe_experts, moe_routing

SDMA, AIV = PIPE_CODE["SDMA"], PIPE_CODE["AIV_DIRECT"]
VECTOR = PIPE_CODE["VECTOR"]


def ub_chunk_byte(die) -> int:
    """What one AIV moves at a time: half its Unified Buffer (the other half is the second buffer)."""
    return die.ub_buffer_kib * 1024 // 2


@lru_cache(maxsize=4096)
def _vector_ps(die, attrs: tuple) -> int:
    """The die model's time for a vector op (cached: members of a collective ask the same)."""
    from cmemu.die.ops import node_cost

    return node_cost(die, {"cmemu.unit": "aiv", "cmemu.dtype": "bf16", **dict(attrs)}).duration_ps


class _Ctx:
    def __init__(self, b, topo, trace, ops):
        self.b, self.topo, self.trace = b, topo, trace
        self.ops = ops  # members' trace op indices, in group order
        self.nodes = [trace.nodes[i] for i in ops]
        self.ranks = np.array([n.rank for n in self.nodes])
        self.attrs = self.nodes[0].attrs
        spec = topo.spec
        self.die, self.comm = spec.die, spec.comm
        self.engine = self.attrs.get("cmemu.engine", "aiv" if self.attrs["comm_type"].startswith("MOE") else "sdma")
        self.lane_aiv = AIV
        self.cores = self.attrs.get("cmemu.cores", spec.die.aiv_cores)
        if self.cores > spec.die.aiv_cores:
            from cmemu.errors import TraceError

            raise TraceError(trace.path, f"{self.cores} AIV requested, the die has {spec.die.aiv_cores}",
                             self.nodes[0].id, "cmemu.cores")

    def comp(self, m, dur_ps, lane, nbytes=0, aiv=0, count=None):
        """Internal COMP ops of member m (one, or ``count`` of them with array durations)."""
        n = 1 if count is None else count
        # What a load, a DMA or a local copy moves goes through this die's HBM.
        idx = self.b.ops(n, kind=OP_KIND_COMP, dur=dur_ps, rank=int(self.ranks[m]), parent=self.ops[m], lane=lane,
                         nbytes=nbytes, hbm=nbytes, aiv=aiv)
        return int(idx[0]) if count is None else idx

    def vector_ps(self, attrs) -> int:
        return _vector_ps(self.die, tuple(sorted(attrs.items())))

    def stream_ps(self, nbytes, cores) -> int:
        """Time for ``cores`` AIVs to stream ``nbytes`` between GM and their UBs (MTE2/MTE3)."""
        if nbytes <= 0:
            return 0
        return self.vector_ps({"num_ops": 0, "tensor_size": int(nbytes), "cmemu.cores": int(cores)})


def collective_blocks(topo, trace, base: int):
    """Every collective of the trace as a block of ops placed from op ``base`` on, in the order
    of ``trace.graph.collectives``: the parts for ``builder.assemble`` (a block and the members'
    trace ops), and the members' trace ops with each one's entry op.

    A collective is lowered once per *shape*: its first member's attrs dict (the loader shares
    one between equal nodes) and its ranks, all that its lowering reads. Later collectives of a
    shape place the same block at their own base with their own members.
    """
    from cmemu.lower.builder import OpBuilder

    nodes = trace.nodes
    shapes = {}
    parts, members, entries = [], [], []
    for ops in trace.graph.collectives:
        attrs = nodes[ops[0]].attrs
        key = (id(attrs), tuple(nodes[i].rank for i in ops))
        shape = shapes.get(key)
        if shape is None:
            b = OpBuilder(base)
            entry = lower_collective(b, topo, trace, ops)
            block = b.block(members=ops)
            shape = shapes[key] = (block, np.array([entry[op] for op in ops], dtype=np.int64) - base, attrs)
        block, entry_rel, _ = shape  # (the attrs dict kept alive: its id is in the key)
        parts.append((block, np.array(ops, dtype=np.int64)))
        members.append(ops)
        entries.append(base + entry_rel)
        base += block.n_ops
    if not parts:
        return [], np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    return parts, np.concatenate(members).astype(np.int64), np.concatenate(entries)


def lower_collective(b, topo, trace, ops) -> dict:
    """Add the internal ops of one collective; returns {member's op: its entry op}."""
    ctx = _Ctx(b, topo, trace, ops)
    ctype = ctx.attrs["comm_type"]
    members = len(ops)
    entries = b.ops(members, kind=OP_KIND_COMP, dur=0, rank=ctx.ranks, parent=ops, lane=-1, nbytes=0, hbm=0, aiv=0)
    b.report_start.update(zip(ops, entries.tolist()))
    size = int(ctx.attrs.get("comm_size", 0))
    exits = None
    if ctype in ("ALL_TO_ALL", "ALL_GATHER"):
        nbytes = np.full((members, members), size, dtype=np.int64)
        np.fill_diagonal(nbytes, 0)
        exits = _exchange(ctx, entries, nbytes)
    elif ctype == "BROADCAST":
        root = list(ctx.ranks).index(ctx.attrs.get("cmemu.root", int(ctx.ranks[0])))
        nbytes = np.zeros((members, members), dtype=np.int64)
        nbytes[root, :] = size
        nbytes[root, root] = 0
        exits = _exchange(ctx, entries, nbytes)
    elif ctype in ("REDUCE_SCATTER", "ALL_REDUCE"):
        share = -(-size // members)
        nbytes = np.full((members, members), share, dtype=np.int64)
        np.fill_diagonal(nbytes, 0)
        # Reduce: add (members - 1) incoming shares into one's own (bf16, one add per element).
        elems = share // 2
        reduce_ps = ctx.vector_ps({"num_ops": (members - 1) * elems, "tensor_size": members * share,
                                   "cmemu.cores": ctx.cores})
        exits = _exchange(ctx, entries, nbytes, after_ps=reduce_ps, after_aiv=ctx.cores)
        if ctype == "ALL_REDUCE":
            exits = _exchange(ctx, exits, nbytes)
    elif ctype == "MOE_DISPATCH":
        exits = _moe(ctx, entries, combine=False)
    elif ctype == "MOE_COMBINE":
        exits = _moe(ctx, entries, combine=True)
    else:  # the trace checker allows nothing else
        raise ValueError(f"unknown comm_type {ctype}")
    b.edges(exits, ops)
    return dict(zip(ops, entries.tolist()))


def _send_writes(ctx, m, start_ops, dst_members, nbytes, lane, group=None):
    """Write messages from member m. Without ``group``, one send op per message, after
    start_ops[i]; with it, message i belongs to the send op of group[i] (one op per distinct
    value, after start_ops[group[i]], ending when all its writes are acknowledged), which is how
    a core's batch of writes is issued. Returns the send ops."""
    n = len(dst_members)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    nbytes = np.broadcast_to(np.asarray(nbytes, dtype=np.int64), (n,))
    dst_members = np.asarray(dst_members)
    if group is None:
        owner, starts, op_bytes = np.arange(n), start_ops, nbytes
    else:
        order = np.argsort(group, kind="stable")
        group, dst_members, nbytes = group[order], dst_members[order], nbytes[order]
        keys, owner = np.unique(group, return_inverse=True)
        starts, op_bytes = np.asarray(start_ops)[keys], np.bincount(owner, weights=nbytes).astype(np.int64)
    sends = ctx.b.ops(len(op_bytes), kind=OP_KIND_SEND, rank=int(ctx.ranks[m]), parent=ctx.ops[m], lane=lane,
                      nbytes=op_bytes)
    ctx.b.edges(starts, sends)
    ctx.b.messages_between(ctx.topo, np.full(n, ctx.ranks[m]), ctx.ranks[dst_members], nbytes, sends[owner], -1,
                           kind=MSG_WRITE)
    return sends


def _issue(ctx, m, start, dst_members, nbytes, lane_bytes=None):
    """Issue member m's writes on its engine after op ``start``. Returns the send ops."""
    b = ctx.b
    if len(dst_members) == 0:
        return np.zeros(0, dtype=np.int64)
    if ctx.engine == "sdma":
        engines = ctx.comm.sdma_engines
        startup = ns_to_ps(ctx.comm.sdma_descriptor_startup_ns)
        rate = ctx.comm.sdma_engine_gbyte_per_s * 1e9
        n = len(dst_members)
        desc = ctx.comp(m, startup, SDMA, count=n)
        busy = ctx.comp(m, np.ceil(np.asarray(nbytes) * 1e12 / rate).astype(np.int64), SDMA, nbytes=nbytes, count=n)
        b.edges(desc, busy)
        # Descriptor j goes to engine j mod E, after that engine's previous descriptor.
        first = np.arange(n) < engines
        b.edges(np.full(int(first.sum()), start), desc[first])
        b.edges(busy[:-engines] if n > engines else [], desc[engines:])
        return _send_writes(ctx, m, desc, dst_members, nbytes, SDMA)
    # AIV-Direct: pieces of at most half a UB, each loaded by one AIV then written.
    chunk = ub_chunk_byte(ctx.die)
    pieces_dst, pieces_bytes = [], []
    for d, nb in zip(dst_members, nbytes):
        k = max(1, -(-int(nb) // chunk))
        pieces_dst += [d] * k
        pieces_bytes += [chunk] * (k - 1) + [int(nb) - chunk * (k - 1)]
    pieces_bytes = np.asarray(pieces_bytes, dtype=np.int64)
    sizes, where = np.unique(pieces_bytes, return_inverse=True)
    load_ps = np.array([ctx.stream_ps(int(nb), 1) for nb in sizes], dtype=np.int64)[where]
    loads = ctx.comp(m, load_ps, AIV, nbytes=pieces_bytes, aiv=1, count=len(pieces_bytes))
    _aiv_chains(ctx, start, loads)
    return _send_writes(ctx, m, loads, np.asarray(pieces_dst), pieces_bytes, AIV)


def _aiv_chains(ctx, start, work):
    """Work item j runs on AIV j mod A, after that AIV's previous item (the first after start)."""
    a = ctx.cores
    n = len(work)
    ctx.b.edges(np.full(min(a, n), start), work[:a])
    if n > a:
        ctx.b.edges(work[:-a], work[a:])


def _flags_and_poll(ctx, entries, sends, count, lane):
    """Fence each member's writes (``sends``, member after member, ``count[m]`` of member m's),
    write a flag to every other member, and poll for theirs.

    Returns, per member, the op that ends when it has seen every other member's flag and its
    own writes and flags are acknowledged."""
    b, members = ctx.b, len(ctx.ops)
    flag = ctx.comm.flag_byte * max(1, ctx.attrs.get("cmemu.experts", members) // members)
    ranks, parents = ctx.ranks, np.asarray(ctx.ops)
    entries = np.asarray(entries)
    fences = b.ops(members, kind=OP_KIND_COMP, rank=ranks, parent=parents, lane=lane)
    b.edges(sends, np.repeat(fences, count))
    b.edges(entries, fences)
    # One send op per member writes its flag to every other member (it ends when all are
    # acknowledged); one receive op per member waits for the flags of all the others.
    recvs = b.ops(members, kind=OP_KIND_RECV, rank=ranks, parent=parents, lane=lane, nbytes=flag * (members - 1))
    b.edges(entries, recvs)
    sends = b.ops(members, kind=OP_KIND_SEND, rank=ranks, parent=parents, lane=lane, nbytes=flag * (members - 1))
    b.edges(fences, sends)
    src = np.repeat(np.arange(members), members - 1)
    dst = (src + np.tile(np.arange(1, members), members)) % members  # m+1, m+2, ... (staggered)
    b.messages_between(ctx.topo, ranks[src], ranks[dst], flag, sends[src], recvs[dst])
    # The member sees the last flag at most one poll interval after it lands.
    seen = b.ops(members, kind=OP_KIND_COMP, dur=ns_to_ps(ctx.comm.flag_poll_interval_ns), rank=ranks, parent=parents,
                 lane=lane)
    b.edges(recvs, seen)
    b.edges(sends, seen)
    return seen


def _exchange(ctx, starts, nbytes, after_ps=0, after_aiv=0):
    """Member i writes nbytes[i, j] to member j (staggered order), then flags; returns exits."""
    members = len(ctx.ops)
    sends_of = []
    for m in range(members):
        order = [(m + k) % members for k in range(1, members)]
        dst = np.array([d for d in order if nbytes[m, d] > 0], dtype=np.int64)
        sends_of.append(_issue(ctx, m, starts[m], dst, nbytes[m, dst]))
    seen = _flags_and_poll(ctx, starts, np.concatenate(sends_of), [len(s) for s in sends_of],
                           SDMA if ctx.engine == "sdma" else AIV)
    if not after_ps:
        return seen
    done = ctx.b.ops(members, kind=OP_KIND_COMP, dur=after_ps, rank=ctx.ranks, parent=ctx.ops, lane=VECTOR, nbytes=0,
                     hbm=0, aiv=after_aiv)
    ctx.b.edges(seen, done)
    return done


def _moe(ctx, entries, combine: bool):
    a = ctx.attrs
    members = len(ctx.ops)
    tokens, top_k, hidden = a["cmemu.tokens"], a["cmemu.top_k"], a["cmemu.hidden"]
    experts = a.get("cmemu.experts", members)
    skew, seed = float(a.get("cmemu.skew", 0.0)), a.get("cmemu.seed", 0)
    if ctx.engine == "aiv":
        from cmemu.lower.moe import moe_aiv

        return moe_aiv(ctx, entries, combine, moe_experts(tokens, top_k, experts, members, skew, seed),
                       experts // members)
    routing = moe_routing(tokens, top_k, experts, members, skew, seed)
    payload = a.get("cmemu.payload_bytes", 2 * hidden if combine else dispatch_payload_byte(hidden))
    b = ctx.b
    if not combine:
        # Source m writes each (token, expert) pair to the expert's member: pair j is token
        # j // top_k, its (j % top_k)-th expert.
        dst = routing.reshape(members, -1)
        counts = np.full(members, dst.shape[1], dtype=np.int64)
        dst = dst.ravel()
        received = np.bincount(dst, minlength=members) * payload
        quantise = hidden
    else:
        # The expert's member writes each pair's output back to the token's source.
        flat = routing.ravel()
        by_holder = _stable_order(flat)  # pairs grouped by the member holding them
        holder = flat[by_holder]
        src_of_pair = by_holder // (tokens * top_k)  # in source order within a holder
        # Each holder starts with the next member's pairs, as for every staggered exchange: in
        # source order every expert would first write to member 0 at once (an incast).
        staggered = _stable_order((src_of_pair - holder) % members)
        dst = src_of_pair[staggered[_stable_order(holder[staggered])]]  # by holder, then stagger
        counts = np.bincount(holder, minlength=members)
        received = np.full(members, tokens * top_k * payload, dtype=np.int64)
        quantise = 0
    ends = np.cumsum(counts)
    sends_of = [_moe_writes_sdma(ctx, m, entries[m], dst[ends[m] - counts[m]:ends[m]], payload, quantise,
                                 0 if combine else tokens) for m in range(members)]
    sends, sends_count = np.concatenate(sends_of), [len(s) for s in sends_of]
    seen = _flags_and_poll(ctx, entries, sends, sends_count, SDMA)
    if combine:
        # Weighted sum of each token's top_k outputs (a multiply-add per element), plus writing it.
        def work(nbytes):
            return ctx.vector_ps({"num_ops": 2 * tokens * top_k * hidden,
                                  "tensor_size": nbytes + tokens * 2 * hidden, "cmemu.cores": ctx.cores})
    else:
        def work(nbytes):
            return ctx.stream_ps(2 * nbytes, ctx.cores)  # read the window, write expert order
    sizes, where = np.unique(received, return_inverse=True)
    work_ps = np.array([work(int(nb)) for nb in sizes], dtype=np.int64)[where]
    done = b.ops(members, kind=OP_KIND_COMP, dur=work_ps, rank=ctx.ranks, parent=ctx.ops, lane=VECTOR, nbytes=received,
                 hbm=received, aiv=ctx.cores)
    b.edges(seen, done)
    return done


def _stable_order(keys) -> np.ndarray:
    """``np.argsort(keys, kind="stable")``; keys below 2**16 are sorted as uint16, which numpy
    radix-sorts (a member or batch number: 5-10x faster than the int64 merge sort)."""
    keys = np.asarray(keys)
    if keys.size and 0 <= keys.min() and keys.max() < 2**16:
        keys = keys.astype(np.uint16)
    return np.argsort(keys, kind="stable")


def _moe_writes_sdma(ctx, m, start, dst_of_pair, payload, quantise, tokens):
    """Member m's pair writes on SDMA: quantise (or gather) every pair into a staging buffer on
    the AIVs, then one descriptor per destination with all its pairs. Returns its send ops."""
    b = ctx.b
    dst_of_pair = np.asarray(dst_of_pair, dtype=np.int64)
    remote = dst_of_pair != m
    n = len(dst_of_pair)
    stage_ps = ctx.stream_ps(2 * n * payload, ctx.cores)  # gather the pairs per destination
    if quantise and tokens:
        stage_ps += ctx.vector_ps({"cmemu.op": "quant_int8", "cmemu.rows": tokens, "cmemu.cols": quantise,
                                   "cmemu.cores": ctx.cores})
    stage = ctx.comp(m, stage_ps, VECTOR, nbytes=n * payload, aiv=ctx.cores)
    b.edges(start, stage)
    counts = np.bincount(dst_of_pair[remote], minlength=len(ctx.ops))
    members = len(ctx.ops)
    order = np.array([(m + k) % members for k in range(1, members)])
    dst = order[counts[order] > 0]
    return _issue(ctx, m, stage, dst, counts[dst] * payload)
