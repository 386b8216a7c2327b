"""One step generator for every model: a decode step (``decode_step``) or a prefill step
(``prefill_step``) of a ``ModelDescription`` in a deployment (``DecodeDeployment``,
``PrefillDeployment``), as a trace document (docs/trace-format.md).

The deployment is CloudMatrix-Infer's shape, with its choices as options (docs/machine.md 2.8): every die
of the EP group serves its own requests (data-parallel attention) and holds
``experts_per_die`` expert slots (routed experts, copies of the shared expert when it is placed
among the EP ranks, redundant copies); the MoE routes each token to its top-k experts (plus the
shared expert, drawn as one more destination, when it is placed in the EP group). Per layer and
micro-batch, on each die (op names as docs/trace-format.md lists them per attention kind):

Decode (stream 0: attention, ``attn_aic`` AIC + twice as many AIV; stream 1: FFN or MoE,
``moe_aic`` AIC + twice as many AIV; micro-batch 1's attention overlaps micro-batch 0's MoE):
- MLA (DeepSeek-V3, Kimi K2): input RMSNorm, q_down, q_up, kv_down, RMSNorm of the latent, RoPE,
  absorption of W_UK, ``mla_attention`` over the KV latents, absorption of W_UV, o_proj;
- GQA/MHA (Qwen3, Llama): input RMSNorm, the fused q/k/v projection, the per-head q/k RMSNorm
  (Qwen3), RoPE of q and k, ``gqa_attention`` over the paged K/V cache, o_proj;
- then the post-attention RMSNorm and a dense FFN (the dense layers; every layer of a dense
  model), or the gate, MoE dispatch, the die's expert MLP (grouped GEMMs and SwiGLU on the
  tokens it received), MoE combine; a shared expert not placed in the EP group runs as an FFN of
  its size on the die's own tokens after the gate.
- With MTP, each request decodes two tokens per step and the MTP module's layer runs at the end;
  sampling is the LM head (replicated, or sharded over ``lm_head_tp`` dies) and a softmax.

Prefill (SP -> TP -> SP attention; micro-batch i on stream i, every compute op on all the
die's cores): the die's share of its attention-TP group's new tokens is normalised (MLA: and
projected to its latents), all-gathered over the group, each die computes its share of the heads
(``attn_tp`` dies split them; GQA: a die holds its query heads' K/V heads, replicated when the
group has more dies than K/V heads), with a context-cache hit the group's reused KV is fetched
on a copy stream, attention per request runs causally over the new and reused tokens, an
all-to-all returns each token's attention output, and the output projection and FFN or MoE
run on the die's own tokens again. The last token of each request goes through the LM head.

The generator computes the routing (``cmemu.workload.moe.moe_routing``) to size each die's
expert GEMMs: a die's ``experts_per_die`` groups share the tokens it received evenly.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, replace

import numpy as np

from cmemu.errors import CmemuError
from cmemu.models.description import ModelDescription
from cmemu.spec import load_system
from cmemu.workload.moe import moe_routing, moe_routing_bytes

DTYPES = ("int8", "bf16")


def _check_common(model: ModelDescription, d, dies: int) -> None:
    if not 2 <= d.ep <= dies:
        raise CmemuError(f"--ep {d.ep}: must be between 2 and the system's {dies} dies")
    if d.micro_batches not in (1, 2):
        raise CmemuError(f"--micro-batches must be 1 or 2, got {d.micro_batches}")
    if not 1 <= d.layers <= model.layers:
        raise CmemuError(f"--layers must be between 1 and {model.layers} ({model.name}), got {d.layers}")
    if d.dispatch_engine not in ("aiv", "sdma"):
        raise CmemuError(f"--dispatch-engine must be aiv or sdma, got {d.dispatch_engine}")
    if d.weight_dtype not in DTYPES:
        raise CmemuError(f"--weights must be one of {', '.join(DTYPES)}, got {d.weight_dtype}")
    if d.experts_per_die < 1:
        raise CmemuError(f"--experts-per-die must be at least 1, got {d.experts_per_die}")
    if d.shared_expert not in ("ep", "local"):
        raise CmemuError(f"--shared-expert must be ep or local, got {d.shared_expert}")


def dense_layers_of(model: ModelDescription, layers: int) -> int:
    """Dense layers among the first ``layers``: a dense model's all; a MoE model's leading
    ones, but a cut-down trace of a MoE model keeps at least one MoE layer."""
    if not model.moe:
        return layers
    return min(model.dense_first_layers, layers - 1) if layers > 1 else 0


def moe_top_k(model: ModelDescription, d, slots: int) -> int:
    """Destinations per token: its routed experts, plus the shared expert when it is placed in
    the EP group (at most the slots there are)."""
    shared = model.shared_experts and d.shared_expert == "ep"
    return min(model.experts_per_token + (1 if shared else 0), slots)


def check_routing(tokens: int, top_k: int, experts: int, members: int, option: str) -> None:
    """The generator routes the step's tokens to experts (moe_routing) to size the expert GEMMs:
    refuse, before it does, a step whose routing would not fit in memory (3/4 of it, as `cmemu
    run` would allow)."""
    from cmemu.units import default_memory_limit, format_bytes

    need, limit = moe_routing_bytes(tokens, top_k, experts, members), default_memory_limit()
    if need > limit:
        raise CmemuError(f"{option}: routing {tokens:,} tokens at a time to the top {top_k} of {experts:,} experts on "
                         f"{members:,} dies needs about {format_bytes(need)}, more than the memory limit of "
                         f"{format_bytes(limit)} (3/4 of this machine's); generate fewer tokens per step")


def _gqa_heads_per_die(model: ModelDescription, tp: int) -> tuple[int, int]:
    """(query heads, K/V heads) one die of an attention-TP group of ``tp`` holds: its share of
    the query heads and the K/V heads they read (one, replicated, when tp > K/V heads)."""
    q = model.query_heads // tp
    return q, max(1, model.kv_heads // tp)


def _comp(stream, name, op, cores, **shape) -> tuple:
    """A COMP op as ``_Doc.chain`` adds it on any die: (stream, name, type, attrs); ``cores``
    None leaves cmemu.cores out (all the die's)."""
    head = {"cmemu.op": op} if cores is None else {"cmemu.op": op, "cmemu.cores": cores}
    return stream, name, "COMP", {**head, **{f"cmemu.{k}": v for k, v in shape.items()}}


class _Doc:
    """The node list of a trace and its helpers."""

    def __init__(self):
        self.nodes: list[dict] = []

    def add(self, rank, stream, name, ntype, attrs, deps=()):
        node = {"id": len(self.nodes), "name": name, "type": ntype, "rank": rank, "stream": stream, "attrs": attrs}
        deps = [d for d in deps if d is not None]
        if deps:
            node["data_deps"] = deps
        self.nodes.append(node)
        return node["id"]

    def comp(self, rank, stream, name, op, cores, deps=(), **shape):
        """A COMP op (``_comp``)."""
        return self.add(rank, *_comp(stream, name, op, cores, **shape), deps)

    def chain(self, rank, ops, prev) -> int:
        """The ops ``ops`` (``_comp``'s) on ``rank``, each depending on the one before and the first
        on ``prev`` (None: on nothing): the last one's id. A step's dies run the same ops, made
        once and shared by all their nodes (the 61-layer decode step's 594,560 COMP nodes share
        31,000 attrs dicts; made per node, they took three quarters of its generation)."""
        nodes = self.nodes
        for stream, name, ntype, attrs in ops:
            node = {"id": len(nodes), "name": name, "type": ntype, "rank": rank, "stream": stream, "attrs": attrs}
            if prev is not None:
                node["data_deps"] = [prev]
            nodes.append(node)
            prev = node["id"]
        return prev


# --- decode --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DecodeDeployment:
    """A decode step's deployment. ``tokens_per_die`` counts every token a die processes in the
    step, speculative (MTP) ones included; ``layers`` 0 means all the model's."""

    ep: int = 320
    tokens_per_die: int = 96
    kv_len: int = 4096
    micro_batches: int = 2
    mtp: bool = False
    mtp_acceptance: float = 0.7
    weight_dtype: str = "int8"
    dispatch_engine: str = "aiv"
    skew: float = 0.0
    layers: int = 0
    seed: int = 0
    lm_head_tp: int = 1
    experts_per_die: int = 1
    shared_expert: str = "ep"
    attn_aic: int | None = None  # None: stream_aic's
    moe_aic: int | None = None
    attn_tp: int = 1

    def check(self, model: ModelDescription, dies: int) -> None:
        _check_common(model, self, dies)
        if self.lm_head_tp < 1 or self.ep % self.lm_head_tp:
            raise CmemuError(f"--lm-head-tp {self.lm_head_tp}: must be at least 1 and divide the EP degree {self.ep}")
        if self.tokens_per_die < self.micro_batches:
            raise CmemuError("--tokens-per-die must be at least the number of micro-batches")
        if not 0.0 <= self.mtp_acceptance <= 1.0:
            raise CmemuError(f"--mtp-acceptance must be between 0 and 1, got {self.mtp_acceptance}")
        if self.mtp and not model.mtp_layers:
            raise CmemuError(f"--mtp: {model.name} has no MTP module (num_nextn_predict_layers 0); use --no-mtp")
        if (self.attn_aic is not None and self.attn_aic < 1) or (self.moe_aic is not None and self.moe_aic < 1):
            raise CmemuError(f"--attn-aic and --moe-aic must be at least 1, got {self.attn_aic} and {self.moe_aic}")
        tp, heads, kv = self.attn_tp, model.query_heads, model.kv_heads
        if tp < 1 or self.ep % tp or heads % tp:
            raise CmemuError(f"--attn-tp {tp}: must be at least 1 and divide both the EP degree ({self.ep}) and the "
                             f"{heads} heads")
        if model.attention == "gqa" and ((tp < kv and kv % tp) or (tp > kv and tp % kv)):
            raise CmemuError(f"--attn-tp {tp}: must divide the {kv} K/V heads, or be a multiple of them")
        if tp > 1 and self.lm_head_tp > 1:
            raise CmemuError("--lm-head-tp with --attn-tp above 1 is not modelled (the LM head runs on each die's "
                             "share of its group's tokens)")

    def dense_layers(self, model: ModelDescription) -> int:
        return dense_layers_of(model, self.layers)

    @property
    def requests_per_die(self) -> float:
        return self.tokens_per_die / (2 if self.mtp else 1)

    def hbm_per_die_byte(self, model: ModelDescription) -> tuple[int, int]:
        """(weights, KV cache) bytes one die holds in this deployment, for a check that they fit
        its HBM (the trace itself does not allocate). Weights: every layer's attention (its share
        under attention TP), its dense FFNs (the same share), its expert slots' routed experts
        (``experts_per_die`` of them, each 3 matrices; a slot holding a shared-expert copy is
        counted as one of the same size) and the router, the embedding and the LM head (its
        vocabulary share with --lm-head-tp), at the matmuls' dtype (norms and biases, under
        0.01%, left out). KV cache: its requests' ``kv_len`` positions in every layer, BF16 as
        the attention reads them (MLA: the latent and rope key; GQA: K and V of its K/V heads).
        All the model's layers, however many the trace simulates; its MTP module not counted."""
        b = 1 if self.weight_dtype == "int8" else 2
        h, tp = model.hidden_values, self.attn_tp
        dense, layers = model.dense_first_layers, model.layers  # the whole model, whatever --layers simulates
        moe = layers - dense
        w = layers * model.attention_params() // tp + dense * model.ffn_params(dense=True) // tp
        if model.moe:
            w += moe * (h * model.routed_experts + self.experts_per_die * 3 * h * model.expert_ffn_values)
        head = model.vocab_tokens * h
        w += head + (0 if model.tied_embeddings else head // self.lm_head_tp)
        if model.attention == "mla":
            per_token = model.kv_lora_values + model.qk_rope_values
        else:
            per_token = 2 * _gqa_heads_per_die(model, tp)[1] * model.head_values
        requests = self.requests_per_die * tp if tp > 1 else self.requests_per_die  # a TP group's requests
        kv = int(round(requests * self.kv_len)) * per_token * 2 * layers
        return w * b, kv

    def stream_aic(self, die_aic: int) -> tuple[int, int]:
        """AIC of the attention stream and of the FFN/MoE stream (each with two AIV), where not
        set: with two micro-batches CloudMatrix-Infer's split of the die, two thirds and one third
        (16 and 8 of the 910C die's 24: micro-batch 1's attention runs beside micro-batch 0's MoE,
        docs/model.md); with one, nothing runs beside an op, so each takes the whole die."""
        if self.micro_batches == 1:
            attn, moe = die_aic, die_aic
        else:
            attn = max(1, die_aic * 2 // 3)
            moe = max(1, die_aic - attn)
        return (attn if self.attn_aic is None else self.attn_aic, moe if self.moe_aic is None else self.moe_aic)

    @property
    def accepted_per_step(self) -> float:
        """Tokens each request gains per step: one, plus the accepted speculative one."""
        return 1.0 + (self.mtp_acceptance if self.mtp else 0.0)


def _decode_attention(model: ModelDescription, d: DecodeDeployment, tag, t, wdt) -> list:
    """Stream 0 of one layer and micro-batch on a die (``t`` tokens: its attention-TP group's;
    the die's share of the heads): its ops in order (``_Doc.chain``), the last the output
    projection (its partial sum when ``attn_tp`` > 1)."""
    aic, aiv = d.attn_aic, 2 * d.attn_aic
    ops = []

    def comp(name, op, cores, **shape):
        ops.append(_comp(0, f"{tag}.{name}", op, cores, **shape))

    comp("rmsnorm_in", "rmsnorm", aiv, rows=t, cols=model.hidden_values)
    H = model.query_heads // d.attn_tp
    if model.attention == "mla":
        qk = model.qk_nope_values + model.qk_rope_values
        if model.q_lora_values:
            comp("q_down", "gemm", aic, m=t, n=model.q_lora_values, k=model.hidden_values, dtype=wdt)
            comp("q_up", "gemm", aic, m=t, n=H * qk, k=model.q_lora_values, dtype=wdt)
        else:
            comp("q_proj", "gemm", aic, m=t, n=H * qk, k=model.hidden_values, dtype=wdt)
        comp("kv_down", "gemm", aic, m=t, n=model.kv_lora_values + model.qk_rope_values, k=model.hidden_values,
             dtype=wdt)
        comp("rmsnorm_kv", "rmsnorm", aiv, rows=t, cols=model.kv_lora_values)
        comp("rope", "rope", aiv, rows=t * (H + 1), cols=model.qk_rope_values)
        comp("absorb_uk", "grouped_gemm", aic, m=t, n=model.kv_lora_values, k=model.qk_nope_values, groups=H,
             dtype="bf16")
        # With MTP a request's two query tokens share its KV reads (queries_per_request 2).
        # An odd micro-batch has a request whose other token is in the other micro-batch:
        # counted as a whole request here (its KV is read in both, as it would be; its
        # cube work one query too many).
        mtp = {"queries_per_request": 2} if d.mtp else {}
        comp("attention", "mla_attention", aic, tokens=t + t % 2 if d.mtp else t, kv_len=d.kv_len, heads=H, **mtp)
        comp("absorb_uv", "grouped_gemm", aic, m=t, n=model.v_head_values, k=model.kv_lora_values, groups=H,
             dtype="bf16")
        comp("o_proj", "gemm", aic, m=t, n=model.hidden_values, k=H * model.v_head_values, dtype=wdt)
        return ops
    hd, kv = model.head_values, _gqa_heads_per_die(model, d.attn_tp)[1]
    comp("qkv_proj", "gemm", aic, m=t, n=(H + 2 * kv) * hd, k=model.hidden_values, dtype=wdt)
    if model.qk_norm:
        comp("rmsnorm_qk", "rmsnorm", aiv, rows=t * (H + kv), cols=hd)
    comp("rope", "rope", aiv, rows=t * (H + kv), cols=hd)
    mtp = {"queries_per_request": 2} if d.mtp else {}
    comp("attention", "gqa_attention", aic, tokens=t + t % 2 if d.mtp else t, kv_len=d.kv_len, heads=H, kv_heads=kv,
         head_dim=hd, **mtp)
    comp("o_proj", "gemm", aic, m=t, n=model.hidden_values, k=H * hd, dtype=wdt)
    return ops


def _ffn(stream, tag, ffn, hidden, t, aic, aiv, wdt, prefix="") -> list:
    """A dense SwiGLU FFN of ``ffn`` intermediate values on ``t`` tokens: its ops (``_Doc.chain``)."""
    return [_comp(stream, f"{tag}.{prefix}ffn_up", "gemm", aic, m=t, n=2 * ffn, k=hidden, dtype=wdt),
            _comp(stream, f"{tag}.{prefix}swiglu", "swiglu", aiv, rows=t, cols=ffn),
            _comp(stream, f"{tag}.{prefix}ffn_down", "gemm", aic, m=t, n=hidden, k=ffn, dtype=wdt)]


def _expert_mlp(model, stream, tag, received, epd, aic, aiv, wdt) -> list:
    """A die's expert GEMMs on the ``received`` token-expert pairs, over its ``epd`` slots: its
    ops (``_Doc.chain``)."""
    m = max(1, -(-received // epd))
    return [_comp(stream, f"{tag}.expert_up", "grouped_gemm", aic, m=m, n=2 * model.expert_ffn_values,
                  k=model.hidden_values, groups=epd, dtype=wdt),
            _comp(stream, f"{tag}.expert_swiglu", "swiglu", aiv, rows=max(1, received), cols=model.expert_ffn_values),
            _comp(stream, f"{tag}.expert_down", "grouped_gemm", aic, m=m, n=model.hidden_values,
                  k=model.expert_ffn_values, groups=epd, dtype=wdt)]


def decode_step(model: ModelDescription, d: DecodeDeployment, system: str, dies: int, generator: dict | None = None,
                description: str | None = None) -> dict:
    """The trace document of one decode step of ``model`` deployed as ``d``."""
    if not d.layers:
        d = replace(d, layers=model.layers)
    d.check(model, dies)
    attn_aic, moe_aic = d.stream_aic(load_system(system).die.aic_cores)
    d = replace(d, attn_aic=attn_aic, moe_aic=moe_aic)
    ranks = list(range(d.ep))
    wdt = d.weight_dtype
    doc = _Doc()
    add, comp, chain = doc.add, doc.comp, doc.chain
    tokens = d.tokens_per_die
    mb_tokens = [tokens // d.micro_batches + (1 if i < tokens % d.micro_batches else 0)
                 for i in range(d.micro_batches)]
    slots = d.ep * d.experts_per_die
    received = {}
    if model.moe:
        top_k = moe_top_k(model, d, slots)
        check_routing(max(mb_tokens), top_k, slots, d.ep, "--tokens-per-die")
        for mb, t in enumerate(mb_tokens):
            routing = moe_routing(t, top_k, slots, d.ep, d.skew, d.seed + mb)
            received[mb] = np.bincount(routing.ravel(), minlength=d.ep).tolist()
    dense_layers = d.dense_layers(model)
    moe_aic, moe_aiv = d.moe_aic, 2 * d.moe_aic
    last = {}  # (rank, mb) -> id of the micro-batch's last node so far
    n_layers = d.layers + (1 if d.mtp else 0)
    H = model.hidden_values
    # Attention TP (attn_tp > 1): a group of attn_tp dies serves its dies' tokens together; each
    # die computes its share of the heads (and of a dense FFN) for all of them, the partial sums
    # are all-reduced, and a MoE layer runs on each die's own tokens, all-gathered back after
    # the combine.
    tp = d.attn_tp
    grp = {r: f"tp{r // tp}" for r in ranks}

    def reduce(r, stream, name, rows, dep):
        return add(r, stream, name, "COMM_COLL", {"comm_type": "ALL_REDUCE", "cmemu.group": grp[r],
                                                  "comm_size": rows * H * 2}, [dep])

    for layer in range(n_layers):
        dense = layer < dense_layers or not model.moe
        tag = f"L{layer}" if layer < d.layers else "MTP"
        for mb, t in enumerate(mb_tokens):
            at = f"{tag}.mb{mb}"
            # The micro-batch's ops, the same on every die (but its expert MLP's), made once.
            attention = _decode_attention(model, d, at, t * tp, wdt)
            # Stream 1: FFN (dense) or MoE.
            ffn = [_comp(1, f"{at}.rmsnorm_ffn", "rmsnorm", moe_aiv, rows=t * tp if dense else t, cols=H)]
            if dense:
                ffn += _ffn(1, at, model.dense_ffn_values // tp, H, t * tp, moe_aic, moe_aiv, wdt)
            else:
                ffn.append(_comp(1, f"{at}.gate", "gemm", moe_aic, m=t, n=model.routed_experts, k=H, dtype="bf16"))
                if model.shared_experts and d.shared_expert == "local":
                    ffn += _ffn(1, at, model.shared_ffn_values, H, t, moe_aic, moe_aiv, wdt, prefix="shared_")
            for r in ranks:
                a = chain(r, attention, last.get((r, mb)))
                if tp > 1:
                    a = reduce(r, 0, f"{at}.attn_reduce", t * tp, a)
                f = chain(r, ffn, a)
                last[(r, mb)] = reduce(r, 1, f"{at}.ffn_reduce", t * tp, f) if dense and tp > 1 else f
            if dense:
                continue
            moe = {"cmemu.group": "ep", "cmemu.tokens": t, "cmemu.top_k": top_k, "cmemu.hidden": H,
                   "cmemu.experts": slots, "cmemu.skew": d.skew, "cmemu.seed": d.seed + mb, "cmemu.cores": moe_aiv}
            dispatch = {"comm_type": "MOE_DISPATCH", "cmemu.engine": d.dispatch_engine, **moe}
            disp = {r: add(r, 1, f"{at}.dispatch", "COMM_COLL", dispatch, [last[(r, mb)]]) for r in ranks}
            experts = {}  # tokens a die received -> its expert MLP's ops
            for r in ranks:
                n = received[mb][r]
                ops = experts.get(n)
                if ops is None:
                    ops = experts[n] = _expert_mlp(model, 1, at, n, d.experts_per_die, moe_aic, moe_aiv, wdt)
                last[(r, mb)] = chain(r, ops, disp[r])
            combine = {"comm_type": "MOE_COMBINE", "cmemu.engine": d.dispatch_engine, **moe}
            for r in ranks:
                last[(r, mb)] = add(r, 1, f"{at}.combine", "COMM_COLL", combine, [last[(r, mb)]])
            if tp > 1:
                for r in ranks:
                    last[(r, mb)] = add(r, 1, f"{at}.moe_gather", "COMM_COLL",
                                        {"comm_type": "ALL_GATHER", "cmemu.group": grp[r], "comm_size": t * H * 2},
                                        [last[(r, mb)]])
    # Sampling: the LM head and a softmax over the vocabulary, per micro-batch. Replicated
    # (lm_head_tp 1): each die multiplies its own tokens by the whole head. Sharded over groups of
    # lm_head_tp dies: the group's hidden states are all-gathered, each die multiplies them by its
    # share of the vocabulary, and the logits go back to their tokens' dies (an all-to-all) for
    # the softmax.
    tp, V = d.lm_head_tp, model.vocab_tokens
    shard = -(-V // tp)
    groups = {"ep": ranks}
    if tp > 1:
        groups.update({f"lm{g}": ranks[g * tp:(g + 1) * tp] for g in range(d.ep // tp)})
    aic, aiv = d.attn_aic, 2 * d.attn_aic
    if d.attn_tp > 1:
        groups.update({f"tp{g}": ranks[g * d.attn_tp:(g + 1) * d.attn_tp] for g in range(d.ep // d.attn_tp)})
    for mb, t in enumerate(mb_tokens):
        head = [_comp(0, f"sample.mb{mb}.lm_head", "gemm", aic, m=t, n=V, k=H, dtype=wdt) if tp == 1 else
                _comp(0, f"sample.mb{mb}.lm_head", "gemm", aic, m=t * tp, n=shard, k=H, dtype=wdt)]
        softmax = [_comp(0, f"sample.mb{mb}.softmax", "softmax", aiv, rows=t, cols=V)]
        for r in ranks:
            if tp == 1:
                s = chain(r, head, last[(r, mb)])
            else:
                grp = f"lm{r // tp}"
                g = add(r, 0, f"sample.mb{mb}.lm_gather", "COMM_COLL",
                        {"comm_type": "ALL_GATHER", "cmemu.group": grp, "comm_size": t * H * 2}, [last[(r, mb)]])
                s = chain(r, head, g)
                s = add(r, 0, f"sample.mb{mb}.lm_scatter", "COMM_COLL",
                        {"comm_type": "ALL_TO_ALL", "cmemu.group": grp, "comm_size": t * shard * 2}, [s])
            chain(r, softmax, s)
    return {
        "schema": "cmemu.trace", "version": 1, "time_unit": "ns", "system": system,
        "description": description or (
            f"{model.name} decode step: EP{d.ep}, {d.tokens_per_die} tokens/die, KV {d.kv_len}, "
            f"{d.micro_batches} micro-batch(es), {d.layers} layer(s), MTP {'on' if d.mtp else 'off'}"),
        "groups": groups,
        "cmemu.generator": generator or {"name": "model", "model": model.name, "phase": "decode", **asdict(d)},
        "nodes": doc.nodes,
    }


# --- prefill -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PrefillDeployment:
    """A prefill step's deployment: ``requests`` prompts of ``prompt_len`` tokens, ``reuse`` of
    each prompt's KV from the EMS context cache (fetched, not recomputed), ``attn_tp`` dies
    splitting one request's attention heads; ``layers`` 0 means all the model's."""

    ep: int = 32
    prompt_len: int = 4096
    requests: int = 8
    attn_tp: int = 8
    micro_batches: int = 2
    weight_dtype: str = "int8"
    reuse: float = 0.0
    dispatch_engine: str = "sdma"
    skew: float = 0.0
    layers: int = 0
    seed: int = 0
    experts_per_die: int = 10
    shared_expert: str = "ep"

    def check(self, model: ModelDescription, dies: int) -> None:
        _check_common(model, self, dies)
        if not 0.0 <= self.reuse <= 1.0:
            raise CmemuError(f"--reuse must be between 0 and 1, got {self.reuse}")
        if self.prompt_len < 1:
            raise CmemuError(f"--prompt-len must be at least 1, got {self.prompt_len}")
        heads = model.query_heads
        if not (2 <= self.attn_tp <= self.ep and self.ep % self.attn_tp == 0 and heads % self.attn_tp == 0):
            raise CmemuError(f"--attn-tp {self.attn_tp}: must divide both the EP degree ({self.ep}) and the "
                             f"{heads} heads, and be at least 2")
        if model.attention == "gqa" and self.attn_tp < model.kv_heads and model.kv_heads % self.attn_tp:
            raise CmemuError(f"--attn-tp {self.attn_tp}: must divide the {model.kv_heads} K/V heads, or be a "
                             "multiple of them")
        slots = self.micro_batches * self.tp_groups
        if self.requests % slots:
            raise CmemuError(f"--requests {self.requests}: must be a multiple of micro-batches x attention TP "
                             f"groups = {self.micro_batches} x {self.tp_groups} = {slots}, so that every die "
                             "holds the same share of tokens")

    def dense_layers(self, model: ModelDescription) -> int:
        return dense_layers_of(model, self.layers)

    @property
    def tp_groups(self) -> int:
        return self.ep // self.attn_tp

    @property
    def reused_tokens(self) -> int:
        """Tokens of each prompt whose KV comes from the context cache (at least one token is new:
        the last one, whose logits give the first output token)."""
        return min(round(self.reuse * self.prompt_len), self.prompt_len - 1)

    @property
    def new_tokens(self) -> int:
        return self.prompt_len - self.reused_tokens

    @property
    def prompt_tokens_per_step(self) -> int:
        return self.prompt_len * self.requests

    @property
    def requests_per_group(self) -> int:
        """Requests each attention TP group serves per micro-batch."""
        return self.requests // (self.micro_batches * self.tp_groups)

    @property
    def tokens_per_die(self) -> int:
        """New (computed) tokens each die holds per micro-batch in the sequence-parallel stages
        (its group's tokens split evenly, padded up to a multiple of the TP degree)."""
        return -(-self.requests_per_group * self.new_tokens // self.attn_tp)

    def kv_byte_per_token_layer(self, model: ModelDescription) -> int:
        """KV-cache bytes per token and layer one die reads for its heads: MLA's latent and rope
        key (all heads'); GQA's K and V of the die's K/V heads."""
        b = 1 if self.weight_dtype == "int8" else 2
        if model.attention == "mla":
            return (model.kv_lora_values + model.qk_rope_values) * b
        return 2 * _gqa_heads_per_die(model, self.attn_tp)[1] * model.head_values * b


def _prefill_sp_attention(doc: _Doc, model, d: PrefillDeployment, r, mb, tag, S, prev, wdt):
    """The SP stage before the all-gather: its last node and the bytes per token it gathers."""
    comp = doc.comp
    H = model.hidden_values
    a = comp(r, mb, f"{tag}.rmsnorm_in", "rmsnorm", None, [prev], rows=S, cols=H)
    if model.attention == "gqa":
        return a, H * 2
    latent = model.kv_lora_values + model.qk_rope_values
    q_in = model.q_lora_values
    if q_in:
        a = comp(r, mb, f"{tag}.q_down", "gemm", None, [a], m=S, n=q_in, k=H, dtype=wdt)
        a = comp(r, mb, f"{tag}.rmsnorm_q", "rmsnorm", None, [a], rows=S, cols=q_in)
    a = comp(r, mb, f"{tag}.kv_down", "gemm", None, [a], m=S, n=latent, k=H, dtype=wdt)
    a = comp(r, mb, f"{tag}.rmsnorm_kv", "rmsnorm", None, [a], rows=S, cols=model.kv_lora_values)
    a = comp(r, mb, f"{tag}.rope_k", "rope", None, [a], rows=S, cols=model.qk_rope_values)
    return a, ((q_in or H) + latent) * 2


def _prefill_tp_attention(doc: _Doc, model, d: PrefillDeployment, r, mb, tag, a, wdt):
    """The TP stage (the die's heads, every request of its group): its last node and the
    attention output values per token and head."""
    comp = doc.comp
    r_g, G = d.requests_per_group, d.attn_tp
    heads = model.query_heads // G
    if model.attention == "mla":
        qk = model.qk_nope_values + model.qk_rope_values
        a = [comp(r, mb, f"{tag}.q_up", "gemm", None, a, m=r_g * d.new_tokens, n=heads * qk,
                  k=model.q_lora_values or model.hidden_values, dtype=wdt)]
        a = [comp(r, mb, f"{tag}.kv_up", "gemm", None, a, m=r_g * d.prompt_len,
                  n=heads * (model.qk_nope_values + model.v_head_values), k=model.kv_lora_values, dtype=wdt)]
        a = [comp(r, mb, f"{tag}.rope_q", "rope", None, a, rows=r_g * d.new_tokens * heads, cols=model.qk_rope_values)]
        for _ in range(r_g):
            a = [comp(r, mb, f"{tag}.attention", "mla_prefill_attention", None, a, tokens=d.new_tokens,
                      kv_len=d.prompt_len, heads=heads)]
        return a, model.v_head_values
    q, kv = _gqa_heads_per_die(model, G)
    hd = model.head_values
    a = [comp(r, mb, f"{tag}.qkv_proj", "gemm", None, a, m=r_g * d.new_tokens, n=(q + 2 * kv) * hd,
              k=model.hidden_values, dtype=wdt)]
    if model.qk_norm:
        a = [comp(r, mb, f"{tag}.rmsnorm_qk", "rmsnorm", None, a, rows=r_g * d.new_tokens * (q + kv), cols=hd)]
    a = [comp(r, mb, f"{tag}.rope_qk", "rope", None, a, rows=r_g * d.new_tokens * (q + kv), cols=hd)]
    for _ in range(r_g):
        a = [comp(r, mb, f"{tag}.attention", "gqa_prefill_attention", None, a, tokens=d.new_tokens,
                  kv_len=d.prompt_len, heads=q, kv_heads=kv, head_dim=hd)]
    return a, hd


def prefill_step(model: ModelDescription, d: PrefillDeployment, system: str, dies: int,
                 generator: dict | None = None, description: str | None = None) -> dict:
    """The trace document of one prefill step of ``model`` deployed as ``d`` (module docstring)."""
    if not d.layers:
        d = replace(d, layers=model.layers)
    d.check(model, dies)
    ranks = list(range(d.ep))
    G = d.attn_tp
    wdt = d.weight_dtype
    doc = _Doc()
    add, comp, chain = doc.add, doc.comp, doc.chain
    S = d.tokens_per_die
    heads = model.query_heads // G
    H = model.hidden_values
    slots = d.ep * d.experts_per_die
    groups = {"ep": ranks, **{f"tp{g}": ranks[g * G:(g + 1) * G] for g in range(d.tp_groups)}}
    if model.moe:
        top_k = moe_top_k(model, d, slots)
        check_routing(S, top_k, slots, d.ep, "--prompt-len x --requests")
        received = {mb: np.bincount(moe_routing(S, top_k, slots, d.ep, d.skew, d.seed + mb).ravel(),
                                    minlength=d.ep) for mb in range(d.micro_batches)}
    last = {}

    def coll(rank, stream, name, group, deps, **attrs):
        return add(rank, stream, name, "COMM_COLL", {"cmemu.group": group, **attrs}, deps)

    r_g = d.requests_per_group
    dense_layers = d.dense_layers(model)
    for layer in range(d.layers):
        dense = layer < dense_layers or not model.moe
        for mb in range(d.micro_batches):
            tag = f"L{layer}.mb{mb}"
            for r in ranks:
                a, gathered = _prefill_sp_attention(doc, model, d, r, mb, tag, S, last.get((r, mb)), wdt)
                a = coll(r, mb, f"{tag}.attn_gather", f"tp{r // G}", [a], comm_type="ALL_GATHER",
                         comm_size=S * gathered, **{"cmemu.engine": "sdma"})
                if d.reused_tokens:
                    # Prefetched on a copy stream of its own, so that it overlaps the SP stage.
                    kv = add(r, d.micro_batches + mb, f"{tag}.kv_fetch", "MEM_LOAD",
                             {"tensor_size": r_g * d.reused_tokens * d.kv_byte_per_token_layer(model)})
                    a = [a, kv]
                else:
                    a = [a]
                a, out_values = _prefill_tp_attention(doc, model, d, r, mb, tag, a, wdt)
                a = coll(r, mb, f"{tag}.attn_a2a", f"tp{r // G}", a, comm_type="ALL_TO_ALL",
                         comm_size=S * heads * out_values * 2, **{"cmemu.engine": "sdma"})
                a = comp(r, mb, f"{tag}.o_proj", "gemm", None, [a], m=S, n=H, k=model.query_heads * out_values,
                         dtype=wdt)
                f = comp(r, mb, f"{tag}.rmsnorm_ffn", "rmsnorm", None, [a], rows=S, cols=H)
                if dense:
                    f = chain(r, _ffn(mb, tag, model.dense_ffn_values, H, S, None, None, wdt), f)
                else:
                    f = comp(r, mb, f"{tag}.gate", "gemm", None, [f], m=S, n=model.routed_experts, k=H, dtype="bf16")
                    if model.shared_experts and d.shared_expert == "local":
                        f = chain(r, _ffn(mb, tag, model.shared_ffn_values, H, S, None, None, wdt, prefix="shared_"), f)
                last[(r, mb)] = f
            if dense:
                continue
            moe = {"cmemu.tokens": S, "cmemu.top_k": top_k, "cmemu.hidden": H, "cmemu.experts": slots,
                   "cmemu.skew": d.skew, "cmemu.seed": d.seed + mb, "cmemu.engine": d.dispatch_engine}
            disp = {r: coll(r, mb, f"{tag}.dispatch", "ep", [last[(r, mb)]], comm_type="MOE_DISPATCH", **moe)
                    for r in ranks}
            mlp = {r: chain(r, _expert_mlp(model, mb, tag, int(received[mb][r]), d.experts_per_die, None, None, wdt),
                            disp[r]) for r in ranks}
            for r in ranks:
                last[(r, mb)] = coll(r, mb, f"{tag}.combine", "ep", [mlp[r]], comm_type="MOE_COMBINE", **moe)
    # The first output token: the LM head and a softmax for the last token of each request, on
    # the die whose share holds it (a group's tokens lie request after request, S per die).
    V = model.vocab_tokens
    for mb in range(d.micro_batches):
        for r in ranks:
            local = r % G
            owned = sum(1 for q in range(r_g) if ((q + 1) * d.new_tokens - 1) // S == local)
            if owned:
                s = comp(r, mb, f"sample.mb{mb}.lm_head", "gemm", None, [last[(r, mb)]], m=owned, n=V, k=H, dtype=wdt)
                comp(r, mb, f"sample.mb{mb}.softmax", "softmax", None, [s], rows=owned, cols=V)
    return {
        "schema": "cmemu.trace", "version": 1, "time_unit": "ns", "system": system,
        "description": description or (
            f"{model.name} prefill step: EP{d.ep}, {d.requests} request(s) x {d.prompt_len} tokens "
            f"(reuse {d.reuse:g}), attention TP{G}, {d.micro_batches} micro-batch(es), {d.layers} layer(s)"),
        "groups": groups,
        "cmemu.generator": generator or {"name": "model", "model": model.name, "phase": "prefill", **asdict(d)},
        "nodes": doc.nodes,
    }


# --- from command-line options ---------------------------------------------------------------------


def default_experts_per_die(model: ModelDescription, ep: int, shared_expert: str) -> int:
    """Slots per die enough for every routed expert (and one copy of the shared expert when it
    is placed in the EP group): no die holds two experts where EP allows one each."""
    if not model.moe:
        return 1
    return -(-(model.routed_experts + (1 if model.shared_experts and shared_expert == "ep" else 0)) // ep)


def decode_deployment_from_options(model: ModelDescription, dies: int, ep=None, experts_per_die=None,
                                   shared_expert="ep", mtp=None, layers=None, dispatch_engine=None,
                                   **options) -> DecodeDeployment:
    """A decode deployment with the command line's defaults: EP 320 (or every die if fewer),
    slots for every expert, MTP if the model has it, every layer, AIV dispatch."""
    ep = ep or min(320, dies)
    return DecodeDeployment(
        ep=ep, experts_per_die=experts_per_die or default_experts_per_die(model, ep, shared_expert),
        shared_expert=shared_expert, mtp=bool(model.mtp_layers) if mtp is None else mtp,
        layers=layers or model.layers, dispatch_engine=dispatch_engine or "aiv", **options)


def prefill_deployment_from_options(model: ModelDescription, ep=None, experts_per_die=None, shared_expert="ep",
                                    layers=None, dispatch_engine=None, **options) -> PrefillDeployment:
    """A prefill deployment with the command line's defaults: EP 32, slots for every expert,
    every layer, SDMA dispatch."""
    ep = ep or 32
    return PrefillDeployment(
        ep=ep, experts_per_die=experts_per_die or default_experts_per_die(model, ep, shared_expert),
        shared_expert=shared_expert, layers=layers or model.layers, dispatch_engine=dispatch_engine or "sdma",
        **options)


DECODE_OPTIONS = ("tokens_per_die", "kv_len", "micro_batches", "mtp_acceptance", "weight_dtype", "skew", "seed",
                  "lm_head_tp", "attn_aic", "moe_aic", "attn_tp")
PREFILL_OPTIONS = ("prompt_len", "requests", "attn_tp", "micro_batches", "weight_dtype", "reuse", "skew", "seed")


def model_step_from_options(model: ModelDescription, phase: str, spec, **options):
    """(trace document, deployment) of `cmemu trace gen model`'s options (those of the other
    phase are ignored; ``attn_tp`` None: 1 in decode, 8 in prefill)."""
    common = {k: options[k] for k in ("ep", "experts_per_die", "shared_expert", "layers", "dispatch_engine")}
    if options.get("attn_tp") is None:  # decode: data-parallel attention; prefill: CloudMatrix-Infer's TP8
        options = {**options, "attn_tp": 1 if phase == "decode" else 8}
    if phase == "decode":
        d = decode_deployment_from_options(model, spec.dies, mtp=options["mtp"], **common,
                                           **{k: options[k] for k in DECODE_OPTIONS})
        return decode_step(model, d, spec.name, spec.dies), d
    d = prefill_deployment_from_options(model, **common, **{k: options[k] for k in PREFILL_OPTIONS})
    return prefill_step(model, d, spec.name, spec.dies), d
