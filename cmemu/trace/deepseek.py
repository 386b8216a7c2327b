"""Trace generator: one decode step (``decode_trace``) or one prefill step (``prefill_trace``, below)
of DeepSeek-R1 in the CloudMatrix-Infer deployment.

DeepSeek-R1 (docs/machine.md 2.7, [DSV3]): hidden 7168, 61 layers (the first 3 dense, FFN 18432), 256
routed experts + 1 shared, top-8, expert FFN 2048, 128 heads, MLA with q_lora_rank 1536,
kv_lora_rank 512, qk_nope 128, qk_rope 64, v_head 128, vocab 129280, one MTP module.

The deployment (docs/machine.md 2.8): every die of the EP group serves its own requests (DP for
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
every token a die processes in the step (docs/machine.md 2.8: up to 96), speculative ones included.

Simplifications (docs/model.md): the shared expert is treated as a ninth expert of the routing
(CloudMatrix-Infer places 32 copies of it among the 320 EP ranks); the LM head runs on each die
for its own tokens; the KV cache length is the same for every request.
"""
from __future__ import annotations

from functools import cached_property

from dataclasses import asdict, dataclass

from cmemu.errors import CmemuError
from cmemu.trace.read import gc_paused
from cmemu.workload.deepseek import DENSE_LAYERS, HEADS, KV_LORA, LAYERS, QK_ROPE



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


def preset_model():
    """DeepSeek-R1's description, from its shipped config.json (cmemu/models/configs)."""
    from cmemu.models.description import load_model

    return load_model("deepseek-r1")


def decode_deployment(cfg: DecodeConfig):
    """CloudMatrix-Infer's decode deployment (docs/machine.md 2.8) with ``cfg``'s options: one expert
    slot per die (at EP320: 256 routed experts, 32 copies of the shared expert, 32 redundant),
    the shared expert drawn as a ninth destination of the routing, attention on 16 AIC + 32 AIV
    and the MoE on 8 AIC + 16 AIV of each die with two micro-batches, each on the whole die with
    one (DecodeDeployment.stream_aic)."""
    from cmemu.models.step import DecodeDeployment

    return DecodeDeployment(ep=cfg.ep, tokens_per_die=cfg.tokens_per_die, kv_len=cfg.kv_len,
                            micro_batches=cfg.micro_batches, mtp=cfg.mtp, mtp_acceptance=cfg.mtp_acceptance,
                            weight_dtype="int8" if cfg.int8 else "bf16", dispatch_engine=cfg.dispatch_engine,
                            skew=cfg.skew, layers=cfg.layers, seed=cfg.seed, lm_head_tp=cfg.lm_head_tp,
                            experts_per_die=1, shared_expert="ep")


@gc_paused()  # a document of dicts, no cycle: the collector would rescan it as it grows
def decode_trace(cfg: DecodeConfig, system: str, dies: int) -> dict:
    """The trace document of one decode step (docs/trace-format.md): the model step generator
    (cmemu.models.step) with DeepSeek-R1's config and CloudMatrix-Infer's deployment."""
    from cmemu.models.step import decode_step

    cfg.check(dies)
    return decode_step(
        preset_model(), decode_deployment(cfg), system, dies,
        generator={"name": "deepseek-r1", "phase": "decode", **asdict(cfg)},
        description=(f"DeepSeek-R1 decode step: EP{cfg.ep}, {cfg.tokens_per_die} tokens/die, KV {cfg.kv_len}, "
                     f"{cfg.micro_batches} micro-batch(es), {cfg.layers} layer(s), MTP {'on' if cfg.mtp else 'off'}"))


# --- Prefill -------------------------------------------------------------------------------------

PREFILL_EXPERTS_PER_DIE = 10  # docs/machine.md 2.8: 8 routed + 1 shared + 1 redundant per die at EP32
KV_LATENT = KV_LORA + QK_ROPE  # 576 values per token per layer in the KV cache


@dataclass(frozen=True)
class PrefillConfig:
    """One prefill step of DeepSeek-R1 in CloudMatrix-Infer (docs/machine.md 2.8).

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

    @cached_property
    def _deployment(self):
        return prefill_deployment(self)

    # The step's shares are the model generator's (PrefillDeployment), for this preset.
    tp_groups = property(lambda self: self._deployment.tp_groups)
    reused_tokens = property(lambda self: self._deployment.reused_tokens,
                             doc="Tokens of each prompt whose KV comes from the context cache.")
    new_tokens = property(lambda self: self._deployment.new_tokens)
    prompt_tokens_per_step = property(lambda self: self._deployment.prompt_tokens_per_step)
    requests_per_group = property(lambda self: self._deployment.requests_per_group,
                                  doc="Requests each attention TP group serves per micro-batch.")
    tokens_per_die = property(lambda self: self._deployment.tokens_per_die,
                              doc="New tokens each die holds per micro-batch in the sequence-parallel stages.")

    @property
    def kv_byte_per_token_layer(self) -> int:
        return KV_LATENT * (1 if self.int8 else 2)


def prefill_deployment(cfg: PrefillConfig):
    """CloudMatrix-Infer's prefill deployment (docs/machine.md 2.8) with ``cfg``'s options: 10 expert
    slots per die (at EP32: 8 routed, 1 shared, 1 redundant), the shared expert drawn as a ninth
    destination of the routing, every op on all the die's cores."""
    from cmemu.models.step import PrefillDeployment

    return PrefillDeployment(ep=cfg.ep, prompt_len=cfg.prompt_len, requests=cfg.requests, attn_tp=cfg.attn_tp,
                             micro_batches=cfg.micro_batches, weight_dtype="int8" if cfg.int8 else "bf16",
                             reuse=cfg.reuse, dispatch_engine=cfg.dispatch_engine, skew=cfg.skew, layers=cfg.layers,
                             seed=cfg.seed, experts_per_die=PREFILL_EXPERTS_PER_DIE, shared_expert="ep")


@gc_paused()  # as decode_trace
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
    from cmemu.models.step import prefill_step

    cfg.check(dies)
    return prefill_step(
        preset_model(), prefill_deployment(cfg), system, dies,
        generator={"name": "deepseek-r1", "phase": "prefill", **asdict(cfg)},
        description=(f"DeepSeek-R1 prefill step: EP{cfg.ep}, {cfg.requests} request(s) x {cfg.prompt_len} tokens "
                     f"(reuse {cfg.reuse:g}), attention TP{cfg.attn_tp}, {cfg.micro_batches} micro-batch(es), "
                     f"{cfg.layers} layer(s)"))
