"""Trace generator: one decode step (``decode_trace``) or one prefill step (``prefill_trace``, below)
of DeepSeek-R1 in the CloudMatrix-Infer deployment.

DeepSeek-R1 (SPEC.md 2.7, [DSV3]): hidden 7168, 61 layers (the first 3 dense, FFN 18432), 256
routed experts + 1 shared, top-8, expert FFN 2048, 128 heads, MLA with q_lora_rank 1536,
kv_lora_rank 512, qk_nope 128, qk_rope 64, v_head 128, vocab 129280, one MTP module.

The deployment (SPEC.md 2.8): every die of the EP group serves its own requests (DP for
attention) and holds one expert (EP for MoE). Per layer and micro-batch, on each die:

- stream 0 (16 AIC + 32 AIV): MLAProlog (RMSNorm, Q down/up projections, KV down projection,
  RMSNorm of the latent, RoPE, and the absorption of W_UK into the query), MLA decode attention
  over the KV cache (absorbed form: 512 + 64 values per token), the absorption of W_UV, and the
  output projection;
- stream 1 (8 AIC + 16 AIV): gate, MoE dispatch (AIV-Direct by default), the expert MLP
  (grouped INT8 GEMMs and SwiGLU on the tokens this die received), MoE combine.

With two micro-batches, micro-batch 1's attention runs while micro-batch 0 is in its MoE part.
The first three layers are dense (an FFN of 18432 on the die's own tokens, on stream 1). With
MTP, each request decodes its token plus one speculative token (twice the tokens per step) and
one extra layer runs at the end; sampling is the LM head and a softmax. ``tokens_per_die`` counts
every token a die processes in the step (SPEC.md 2.8: up to 96), speculative ones included.

Simplifications (docs/model.md): the shared expert is treated as a ninth expert of the routing
(CloudMatrix-Infer places 32 copies of it among the 320 EP ranks); the LM head runs on each die
for its own tokens; the KV cache length is the same for every request.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from cmemu.errors import CmemuError
from cmemu.workload.deepseek import (DENSE_FFN, DENSE_LAYERS, EXPERT_FFN, HEADS, HIDDEN, KV_LORA, LAYERS, Q_LORA, QK_NOPE,
                                     QK_ROPE, ROUTED_TOP_K, V_HEAD, VOCAB)
from cmemu.workload.moe import moe_routing, moe_routing_bytes


def _check_step(cfg, dies: int) -> None:
    """What a decode and a prefill step share: EP degree, micro-batches, layers, engine."""
    if not 2 <= cfg.ep <= dies:
        raise CmemuError(f"--ep {cfg.ep}: must be between 2 and the system's {dies} dies")
    if cfg.micro_batches not in (1, 2):
        raise CmemuError(f"--micro-batches must be 1 or 2, got {cfg.micro_batches}")
    if not 1 <= cfg.layers <= LAYERS:
        raise CmemuError(f"--layers must be between 1 and {LAYERS}, got {cfg.layers}")
    if cfg.dispatch_engine not in ("aiv", "sdma"):
        raise CmemuError(f"--dispatch-engine must be aiv or sdma, got {cfg.dispatch_engine}")


def _dense_layers(layers: int) -> int:
    """The first three layers are dense; a cut-down trace keeps at least one MoE layer."""
    return min(DENSE_LAYERS, layers - 1) if layers > 1 else 0


@dataclass(frozen=True)
class DecodeConfig:
    ep: int = 320
    tokens_per_die: int = 96
    kv_len: int = 4096
    micro_batches: int = 2
    mtp: bool = True
    mtp_acceptance: float = 0.7
    int8: bool = True
    dispatch_engine: str = "aiv"
    skew: float = 0.0
    layers: int = LAYERS
    seed: int = 0
    lm_head_tp: int = 1

    def check(self, dies: int) -> None:
        _check_step(self, dies)
        if self.lm_head_tp < 1 or self.ep % self.lm_head_tp:
            raise CmemuError(f"--lm-head-tp {self.lm_head_tp}: must be at least 1 and divide the EP degree {self.ep}")
        if self.tokens_per_die < self.micro_batches:
            raise CmemuError("--tokens-per-die must be at least the number of micro-batches")
        if not 0.0 <= self.mtp_acceptance <= 1.0:
            raise CmemuError(f"--mtp-acceptance must be between 0 and 1, got {self.mtp_acceptance}")

    @property
    def dense_layers(self) -> int:
        return _dense_layers(self.layers)

    @property
    def tokens_per_step(self) -> int:
        """Tokens each die processes per step (with MTP, each request contributes two)."""
        return self.tokens_per_die

    @property
    def requests_per_die(self) -> float:
        return self.tokens_per_die / (2 if self.mtp else 1)

    @property
    def accepted_per_step(self) -> float:
        """Tokens each request gains per step: one, plus the accepted speculative one."""
        return 1.0 + (self.mtp_acceptance if self.mtp else 0.0)


def _check_routing(tokens: int, top_k: int, experts: int, members: int, option: str) -> None:
    """The generator routes the step's tokens to experts (moe_routing) to size the expert GEMMs:
    refuse, before it does, a step whose routing would not fit in memory (3/4 of it, as `cmemu
    run` would allow)."""
    from cmemu.units import default_memory_limit, format_bytes

    need, limit = moe_routing_bytes(tokens, top_k, experts, members), default_memory_limit()
    if need > limit:
        raise CmemuError(f"{option}: routing {tokens:,} tokens at a time to the top {top_k} of {experts:,} experts on "
                         f"{members:,} dies needs about {format_bytes(need)}, more than the memory limit of "
                         f"{format_bytes(limit)} (3/4 of this machine's); generate fewer tokens per step")


def decode_trace(cfg: DecodeConfig, system: str, dies: int) -> dict:
    """The trace document of one decode step (docs/trace-format.md)."""
    cfg.check(dies)
    ranks = list(range(cfg.ep))
    wdt = "int8" if cfg.int8 else "bf16"
    nodes: list[dict] = []
    tokens = cfg.tokens_per_step
    mb_tokens = [tokens // cfg.micro_batches + (1 if i < tokens % cfg.micro_batches else 0)
                 for i in range(cfg.micro_batches)]
    top_k = min(ROUTED_TOP_K + 1, cfg.ep)  # the shared expert as a ninth destination (fewer if EP < 9)
    received = {}
    _check_routing(max(mb_tokens), top_k, cfg.ep, cfg.ep, "--tokens-per-die")
    for mb, t in enumerate(mb_tokens):
        routing = moe_routing(t, top_k, cfg.ep, cfg.ep, cfg.skew, cfg.seed + mb)
        counts = [int((routing == r).sum()) for r in range(cfg.ep)]
        received[mb] = counts

    last = {}  # (rank, mb) -> id of the micro-batch's last node so far

    def add(rank, stream, name, ntype, attrs, deps=()):
        node = {"id": len(nodes), "name": name, "type": ntype, "rank": rank, "stream": stream, "attrs": attrs}
        deps = [d for d in deps if d is not None]
        if deps:
            node["data_deps"] = deps
        nodes.append(node)
        return node["id"]

    def comp(rank, stream, name, op, cores, deps=(), **shape):
        attrs = {"cmemu.op": op, "cmemu.cores": cores, **{f"cmemu.{k}": v for k, v in shape.items()}}
        return add(rank, stream, name, "COMP", attrs, deps)

    n_layers = cfg.layers + (1 if cfg.mtp else 0)
    for layer in range(n_layers):
        dense = layer < cfg.dense_layers
        tag = f"L{layer}" if layer < cfg.layers else "MTP"
        for mb, t in enumerate(mb_tokens):
            for r in ranks:
                prev = last.get((r, mb))
                # Stream 0: attention.
                a = comp(r, 0, f"{tag}.mb{mb}.rmsnorm_in", "rmsnorm", 32, [prev], rows=t, cols=HIDDEN)
                a = comp(r, 0, f"{tag}.mb{mb}.q_down", "gemm", 16, [a], m=t, n=Q_LORA, k=HIDDEN, dtype=wdt)
                a = comp(r, 0, f"{tag}.mb{mb}.q_up", "gemm", 16, [a], m=t, n=HEADS * (QK_NOPE + QK_ROPE), k=Q_LORA,
                         dtype=wdt)
                a = comp(r, 0, f"{tag}.mb{mb}.kv_down", "gemm", 16, [a], m=t, n=KV_LORA + QK_ROPE, k=HIDDEN, dtype=wdt)
                a = comp(r, 0, f"{tag}.mb{mb}.rmsnorm_kv", "rmsnorm", 32, [a], rows=t, cols=KV_LORA)
                a = comp(r, 0, f"{tag}.mb{mb}.rope", "rope", 32, [a], rows=t * (HEADS + 1), cols=QK_ROPE)
                a = comp(r, 0, f"{tag}.mb{mb}.absorb_uk", "grouped_gemm", 16, [a], m=t, n=KV_LORA, k=QK_NOPE,
                         groups=HEADS, dtype="bf16")
                # With MTP a request's two query tokens share its KV reads (queries_per_request 2).
                # An odd micro-batch has a request whose other token is in the other micro-batch:
                # counted as a whole request here (its KV is read in both, as it would be; its
                # cube work one query too many).
                mtp = {"queries_per_request": 2} if cfg.mtp else {}
                a = comp(r, 0, f"{tag}.mb{mb}.attention", "mla_attention", 16, [a], tokens=t + t % 2 if cfg.mtp else t,
                         kv_len=cfg.kv_len, heads=HEADS, **mtp)
                a = comp(r, 0, f"{tag}.mb{mb}.absorb_uv", "grouped_gemm", 16, [a], m=t, n=V_HEAD, k=KV_LORA,
                         groups=HEADS, dtype="bf16")
                a = comp(r, 0, f"{tag}.mb{mb}.o_proj", "gemm", 16, [a], m=t, n=HIDDEN, k=HEADS * V_HEAD, dtype=wdt)
                # Stream 1: FFN (dense) or MoE.
                f = comp(r, 1, f"{tag}.mb{mb}.rmsnorm_ffn", "rmsnorm", 16, [a], rows=t, cols=HIDDEN)
                if dense:
                    f = comp(r, 1, f"{tag}.mb{mb}.ffn_up", "gemm", 8, [f], m=t, n=2 * DENSE_FFN, k=HIDDEN, dtype=wdt)
                    f = comp(r, 1, f"{tag}.mb{mb}.swiglu", "swiglu", 16, [f], rows=t, cols=DENSE_FFN)
                    f = comp(r, 1, f"{tag}.mb{mb}.ffn_down", "gemm", 8, [f], m=t, n=HIDDEN, k=DENSE_FFN, dtype=wdt)
                    last[(r, mb)] = f
                else:
                    last[(r, mb)] = comp(r, 1, f"{tag}.mb{mb}.gate", "gemm", 8, [f], m=t, n=256, k=HIDDEN,
                                         dtype="bf16")
            if dense:
                continue
            moe = {"cmemu.group": "ep", "cmemu.tokens": t, "cmemu.top_k": top_k, "cmemu.hidden": HIDDEN,
                   "cmemu.experts": cfg.ep, "cmemu.skew": cfg.skew, "cmemu.seed": cfg.seed + mb, "cmemu.cores": 16}
            disp = {r: add(r, 1, f"{tag}.mb{mb}.dispatch", "COMM_COLL",
                           {"comm_type": "MOE_DISPATCH", "cmemu.engine": cfg.dispatch_engine, **moe},
                           [last[(r, mb)]]) for r in ranks}
            mlp = {}
            for r in ranks:
                m = max(1, received[mb][r])
                e = comp(r, 1, f"{tag}.mb{mb}.expert_up", "grouped_gemm", 8, [disp[r]], m=m, n=2 * EXPERT_FFN,
                         k=HIDDEN, groups=1, dtype=wdt)
                e = comp(r, 1, f"{tag}.mb{mb}.expert_swiglu", "swiglu", 16, [e], rows=m, cols=EXPERT_FFN)
                mlp[r] = comp(r, 1, f"{tag}.mb{mb}.expert_down", "grouped_gemm", 8, [e], m=m, n=HIDDEN,
                              k=EXPERT_FFN, groups=1, dtype=wdt)
            for r in ranks:
                last[(r, mb)] = add(r, 1, f"{tag}.mb{mb}.combine", "COMM_COLL",
                                    {"comm_type": "MOE_COMBINE", "cmemu.engine": cfg.dispatch_engine, **moe},
                                    [mlp[r]])
    # Sampling: the LM head and a softmax over the vocabulary, per micro-batch. Replicated
    # (lm_head_tp 1): each die multiplies its own tokens by the whole head. Sharded over groups of
    # lm_head_tp dies: the group's hidden states are all-gathered, each die multiplies them by its
    # share of the vocabulary, and the logits go back to their tokens' dies (an all-to-all) for
    # the softmax.
    tp = cfg.lm_head_tp
    shard = -(-VOCAB // tp)
    groups = {"ep": ranks}
    if tp > 1:
        groups.update({f"lm{g}": ranks[g * tp:(g + 1) * tp] for g in range(cfg.ep // tp)})
    for mb, t in enumerate(mb_tokens):
        for r in ranks:
            if tp == 1:
                s = comp(r, 0, f"sample.mb{mb}.lm_head", "gemm", 16, [last[(r, mb)]], m=t, n=VOCAB, k=HIDDEN,
                         dtype=wdt)
            else:
                grp = f"lm{r // tp}"
                g = add(r, 0, f"sample.mb{mb}.lm_gather", "COMM_COLL",
                        {"comm_type": "ALL_GATHER", "cmemu.group": grp, "comm_size": t * HIDDEN * 2},
                        [last[(r, mb)]])
                s = comp(r, 0, f"sample.mb{mb}.lm_head", "gemm", 16, [g], m=t * tp, n=shard, k=HIDDEN, dtype=wdt)
                s = add(r, 0, f"sample.mb{mb}.lm_scatter", "COMM_COLL",
                        {"comm_type": "ALL_TO_ALL", "cmemu.group": grp, "comm_size": t * shard * 2}, [s])
            comp(r, 0, f"sample.mb{mb}.softmax", "softmax", 32, [s], rows=t, cols=VOCAB)
    return {
        "schema": "cmemu.trace", "version": 1, "time_unit": "ns", "system": system,
        "description": (f"DeepSeek-R1 decode step: EP{cfg.ep}, {cfg.tokens_per_die} tokens/die, KV {cfg.kv_len}, "
                        f"{cfg.micro_batches} micro-batch(es), {cfg.layers} layer(s), MTP {'on' if cfg.mtp else 'off'}"),
        "groups": groups,
        "cmemu.generator": {"name": "deepseek-r1", "phase": "decode", **asdict(cfg)},
        "nodes": nodes,
    }


# --- Prefill -------------------------------------------------------------------------------------

PREFILL_EXPERTS_PER_DIE = 10  # SPEC.md 2.8: 8 routed + 1 shared + 1 redundant per die at EP32
KV_LATENT = KV_LORA + QK_ROPE  # 576 values per token per layer in the KV cache


@dataclass(frozen=True)
class PrefillConfig:
    """One prefill step of DeepSeek-R1 in CloudMatrix-Infer (SPEC.md 2.8).

    ``requests`` prompts of ``prompt_len`` tokens each; ``reuse`` is the share of each prompt
    whose KV cache comes from the EMS context cache (not recomputed, but fetched);
    ``attn_tp`` dies split one request's attention heads (the TP stage of SP -> TP -> SP).
    """

    ep: int = 32
    prompt_len: int = 4096
    requests: int = 8
    attn_tp: int = 8
    micro_batches: int = 2
    int8: bool = True
    reuse: float = 0.0
    dispatch_engine: str = "sdma"
    skew: float = 0.0
    layers: int = LAYERS
    seed: int = 0

    def check(self, dies: int) -> None:
        _check_step(self, dies)
        if not 0.0 <= self.reuse <= 1.0:
            raise CmemuError(f"--reuse must be between 0 and 1, got {self.reuse}")
        if self.prompt_len < 1:
            raise CmemuError(f"--prompt-len must be at least 1, got {self.prompt_len}")
        if not (2 <= self.attn_tp <= self.ep and self.ep % self.attn_tp == 0 and HEADS % self.attn_tp == 0):
            raise CmemuError(f"--attn-tp {self.attn_tp}: must divide both the EP degree ({self.ep}) and the "
                             f"{HEADS} heads, and be at least 2")
        slots = self.micro_batches * self.tp_groups
        if self.requests % slots:
            raise CmemuError(f"--requests {self.requests}: must be a multiple of micro-batches x attention TP "
                             f"groups = {self.micro_batches} x {self.tp_groups} = {slots}, so that every die "
                             "holds the same share of tokens")

    @property
    def dense_layers(self) -> int:
        return _dense_layers(self.layers)

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

    @property
    def kv_byte_per_token_layer(self) -> int:
        return KV_LATENT * (1 if self.int8 else 2)


def prefill_trace(cfg: PrefillConfig, system: str, dies: int) -> dict:
    """The trace document of one prefill step (docs/trace-format.md).

    Per layer and micro-batch, on each die of the EP group:

    - SP (sequence parallel): the die's share of its TP group's new tokens: input RMSNorm, the
      down projections q_a (7168 -> 1536) and kv_a (7168 -> 512 + 64), RMSNorms of the latents,
      RoPE of the shared rope key (64 values per token);
    - ALL_GATHER over the die's attention TP group of those latents (1536 + 576 values per token,
      BF16): every die of the group now has all its requests' tokens;
    - TP (tensor parallel over heads, 128 / attn_tp of them): with a context-cache hit, a
      MEM_LOAD of the group's reused KV latents (576 B per token and layer in INT8; on a copy
      stream of its own, micro-batches + i, so it is prefetched during the SP stage); the up
      projections for the die's heads, not absorbed: q_b (1536 -> heads x 192) of the new tokens
      and kv_b (512 -> heads x (128 + 128)) of the new and the reused tokens (the prefix's K and V
      are rebuilt from its cached latents); RoPE of the queries; then per request
      ``mla_prefill_attention``: its new tokens, causal, over their own KV and the reused prefix
      (``kv_len`` = prompt length);
    - ALL_TO_ALL over the group: each die gets back its own tokens' attention output for all
      heads (BF16, 128 values per head);
    - SP again: the output projection, then a dense FFN (layers 0-2) or gate, MoE dispatch
      (SDMA by default), the die's 10 experts as grouped INT8 GEMMs, MoE combine.

    Streams: micro-batch i runs on stream i and every compute op takes all the die's cores (the
    default of ``cmemu.cores``): the AIC/AIV split is "whole die, one op at a time". Why: the
    prefill ops are large (thousands of tokens) and fill every core; dispatch, combine and the
    attention collectives go on SDMA and need no core but for staging, so what must overlap is
    one micro-batch's communication with the other's compute, and the core pool of the die
    interleaves the two micro-batches' compute op by op. A static split (as decode's 16 + 8 AIC)
    would run two compute ops at once, which the die model times each as if it had the die's HBM
    and L2 alone: it would overstate what two concurrent ops achieve.

    The MoE routes each token to 9 distinct experts of 10 x EP (8 routed + the shared expert,
    which has a copy on every die and is drawn like the others, as in decode); each die holds 10.
    The last token of every request goes through the LM head and a softmax (the first output
    token). Every projection is an op of its own and runs once per token (q_a and kv_a on the
    token's SP die, q_b and kv_b on each die of its TP group for that die's heads); the attention
    op does attention alone. Simplifications: docs/model.md.
    """
    cfg.check(dies)
    ranks = list(range(cfg.ep))
    G = cfg.attn_tp
    wdt = "int8" if cfg.int8 else "bf16"
    nodes: list[dict] = []
    S = cfg.tokens_per_die
    heads = HEADS // G
    top_k = min(ROUTED_TOP_K + 1, cfg.ep * PREFILL_EXPERTS_PER_DIE)
    experts = cfg.ep * PREFILL_EXPERTS_PER_DIE
    groups = {"ep": ranks, **{f"tp{g}": ranks[g * G:(g + 1) * G] for g in range(cfg.tp_groups)}}
    _check_routing(S, top_k, experts, cfg.ep, "--prompt-len x --requests")
    received = {mb: np.bincount(moe_routing(S, top_k, experts, cfg.ep, cfg.skew, cfg.seed + mb).ravel(),
                                minlength=cfg.ep) for mb in range(cfg.micro_batches)}
    last = {}

    def add(rank, stream, name, ntype, attrs, deps=()):
        node = {"id": len(nodes), "name": name, "type": ntype, "rank": rank, "stream": stream, "attrs": attrs}
        deps = [d for d in deps if d is not None]
        if deps:
            node["data_deps"] = deps
        nodes.append(node)
        return node["id"]

    def comp(rank, stream, name, op, deps=(), **shape):
        return add(rank, stream, name, "COMP", {"cmemu.op": op, **{f"cmemu.{k}": v for k, v in shape.items()}}, deps)

    def coll(rank, stream, name, group, deps, **attrs):
        return add(rank, stream, name, "COMM_COLL", {"cmemu.group": group, **attrs}, deps)

    r_g = cfg.requests_per_group
    latent_byte = (Q_LORA + KV_LATENT) * 2
    for layer in range(cfg.layers):
        dense = layer < cfg.dense_layers
        for mb in range(cfg.micro_batches):
            tag = f"L{layer}.mb{mb}"
            for r in ranks:
                a = comp(r, mb, f"{tag}.rmsnorm_in", "rmsnorm", [last.get((r, mb))], rows=S, cols=HIDDEN)
                a = comp(r, mb, f"{tag}.q_down", "gemm", [a], m=S, n=Q_LORA, k=HIDDEN, dtype=wdt)
                a = comp(r, mb, f"{tag}.rmsnorm_q", "rmsnorm", [a], rows=S, cols=Q_LORA)
                a = comp(r, mb, f"{tag}.kv_down", "gemm", [a], m=S, n=KV_LATENT, k=HIDDEN, dtype=wdt)
                a = comp(r, mb, f"{tag}.rmsnorm_kv", "rmsnorm", [a], rows=S, cols=KV_LORA)
                a = comp(r, mb, f"{tag}.rope_k", "rope", [a], rows=S, cols=QK_ROPE)
                a = coll(r, mb, f"{tag}.attn_gather", f"tp{r // G}", [a], comm_type="ALL_GATHER",
                         comm_size=S * latent_byte, **{"cmemu.engine": "sdma"})
                if cfg.reused_tokens:
                    # Prefetched on a copy stream of its own, so that it overlaps the SP stage.
                    kv = add(r, cfg.micro_batches + mb, f"{tag}.kv_fetch", "MEM_LOAD",
                             {"tensor_size": r_g * cfg.reused_tokens * cfg.kv_byte_per_token_layer})
                    a = [a, kv]
                else:
                    a = [a]
                a = [comp(r, mb, f"{tag}.q_up", "gemm", a, m=r_g * cfg.new_tokens, n=heads * (QK_NOPE + QK_ROPE),
                          k=Q_LORA, dtype=wdt)]
                a = [comp(r, mb, f"{tag}.kv_up", "gemm", a, m=r_g * cfg.prompt_len, n=heads * (QK_NOPE + V_HEAD),
                          k=KV_LORA, dtype=wdt)]
                a = [comp(r, mb, f"{tag}.rope_q", "rope", a, rows=r_g * cfg.new_tokens * heads, cols=QK_ROPE)]
                for q in range(r_g):
                    a = [comp(r, mb, f"{tag}.attention", "mla_prefill_attention", a, tokens=cfg.new_tokens,
                              kv_len=cfg.prompt_len, heads=heads)]
                a = coll(r, mb, f"{tag}.attn_a2a", f"tp{r // G}", a, comm_type="ALL_TO_ALL",
                         comm_size=S * heads * V_HEAD * 2, **{"cmemu.engine": "sdma"})
                a = comp(r, mb, f"{tag}.o_proj", "gemm", [a], m=S, n=HIDDEN, k=HEADS * V_HEAD, dtype=wdt)
                f = comp(r, mb, f"{tag}.rmsnorm_ffn", "rmsnorm", [a], rows=S, cols=HIDDEN)
                if dense:
                    f = comp(r, mb, f"{tag}.ffn_up", "gemm", [f], m=S, n=2 * DENSE_FFN, k=HIDDEN, dtype=wdt)
                    f = comp(r, mb, f"{tag}.swiglu", "swiglu", [f], rows=S, cols=DENSE_FFN)
                    f = comp(r, mb, f"{tag}.ffn_down", "gemm", [f], m=S, n=HIDDEN, k=DENSE_FFN, dtype=wdt)
                else:
                    f = comp(r, mb, f"{tag}.gate", "gemm", [f], m=S, n=256, k=HIDDEN, dtype="bf16")
                last[(r, mb)] = f
            if dense:
                continue
            moe = {"cmemu.tokens": S, "cmemu.top_k": top_k, "cmemu.hidden": HIDDEN, "cmemu.experts": experts,
                   "cmemu.skew": cfg.skew, "cmemu.seed": cfg.seed + mb, "cmemu.engine": cfg.dispatch_engine}
            disp = {r: coll(r, mb, f"{tag}.dispatch", "ep", [last[(r, mb)]], comm_type="MOE_DISPATCH", **moe)
                    for r in ranks}
            mlp = {}
            for r in ranks:
                m = max(1, -(-int(received[mb][r]) // PREFILL_EXPERTS_PER_DIE))
                e = comp(r, mb, f"{tag}.expert_up", "grouped_gemm", [disp[r]], m=m, n=2 * EXPERT_FFN, k=HIDDEN,
                         groups=PREFILL_EXPERTS_PER_DIE, dtype=wdt)
                e = comp(r, mb, f"{tag}.expert_swiglu", "swiglu", [e], rows=max(1, int(received[mb][r])),
                         cols=EXPERT_FFN)
                mlp[r] = comp(r, mb, f"{tag}.expert_down", "grouped_gemm", [e], m=m, n=HIDDEN, k=EXPERT_FFN,
                              groups=PREFILL_EXPERTS_PER_DIE, dtype=wdt)
            for r in ranks:
                last[(r, mb)] = coll(r, mb, f"{tag}.combine", "ep", [mlp[r]], comm_type="MOE_COMBINE", **moe)
    # The first output token: the LM head and a softmax for the last token of each request, on
    # the die whose share holds it (a group's tokens lie request after request, S per die).
    for mb in range(cfg.micro_batches):
        for r in ranks:
            local = r % G
            owned = sum(1 for q in range(r_g) if ((q + 1) * cfg.new_tokens - 1) // S == local)
            if owned:
                s = comp(r, mb, f"sample.mb{mb}.lm_head", "gemm", [last[(r, mb)]], m=owned, n=VOCAB, k=HIDDEN,
                         dtype=wdt)
                comp(r, mb, f"sample.mb{mb}.softmax", "softmax", [s], rows=owned, cols=VOCAB)
    return {
        "schema": "cmemu.trace", "version": 1, "time_unit": "ns", "system": system,
        "description": (f"DeepSeek-R1 prefill step: EP{cfg.ep}, {cfg.requests} request(s) x {cfg.prompt_len} tokens "
                        f"(reuse {cfg.reuse:g}), attention TP{G}, {cfg.micro_batches} micro-batch(es), "
                        f"{cfg.layers} layer(s)"),
        "groups": groups,
        "cmemu.generator": {"name": "deepseek-r1", "phase": "prefill", **asdict(cfg)},
        "nodes": nodes,
    }
