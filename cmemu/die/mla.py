"""Multi-head latent attention (MLA, DeepSeek-V3 [DSV3]) on one die: decode in the absorbed form
and prefill in the plain form, each as its phases run back to back on the op's cores.

Decode (absorbed; per step, ``tokens`` queries, ``queries_per_request`` of them per request (MTP:
2), each request's attending to its ``kv_len`` cached positions; ``mla_attention_cost`` is its
attention phase alone, for traces that write the projections as ops of their own):
  prologue (MLAProlog): RMSNorm(x) -> q_a projection -> RMSNorm -> q_b projection (heads x
  (nope + rope)); kv_a projection -> RMSNorm of the latent; RoPE on q_pe and k_pe; absorb W_uk
  into q (per head nope x kv_lora);
  attention: per request, all heads of all its query tokens on one M axis against the
  compressed cache (kv_lora + rope values per position, K and V the same latent), as CANN's
  FusedInferAttentionScore MLA template splits and pipelines it (``cmemu.die.fia_mla``: work
  blocks of <= 256 rows x 512 positions over the cores by FIA's cost rule, FlashDecode and its
  combine when a request is split over cores);
  epilogue: W_uv per head (kv_lora -> v_head). The output projection is a separate op (gemm).
Prefill (not absorbed; the last ``tokens`` of a causal sequence of ``kv_len`` positions, the
  earlier ones a reused prefix whose K and V are given): the same projections, kv_b projection to
  per-head K (nope) and V, RoPE, then attention per head in query blocks of 128 rows against the
  KV blocks at or before them (``mla_prefill_cost``; ``mla_prefill_attention_cost`` is the
  attention alone, for traces that write the projections and RoPE as ops of their own).

Causal masking works on whole tiles: a KV block wholly after a query block's last row is
skipped; a block the diagonal crosses is computed whole by the cube and masked in the softmax on
the AIVs (the time of a full tile, as on the hardware), and only the KV positions below the
query block's last row are loaded. MACs count the useful work alone: per query row, its own
position and those before it (the lower triangle, diagonal included), times heads x (192 + 128).

Projections run as int8 GEMMs with bf16 output (docs/machine.md 2.8: everything large is INT8); the
attention matmuls in the op's dtype (bf16 default). Left out: the KV cache write of the new
token (decode attention's own omissions: ``cmemu.die.fia_mla``). In prefill each
head's K carries the 64 rope values every head shares: they travel with that head's KV block,
so the L2 model (objects per head and block) charges their first HBM read once per head, not
once: (heads - 1) x 64 values per position too many HBM bytes, under a fifth of the op's KV
reads (the op is cube-bound at 128 query rows, so its time hardly moves). Q is loaded at the L2
rate, as in decode: the projection that wrote it ran just before.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from types import MappingProxyType

import numpy as np

from cmemu.die.gemm import gemm_cost
from cmemu.die.fia_mla import HEAD_DIM, ROPE_DIM, decode_attention_cost
from cmemu.die.kernels import attention_cost, vector_cost
from cmemu.die.model import DTYPE_BYTES, DieModel, OpCost, ceil_div, check_size
from cmemu.workload.deepseek import HEADS, HIDDEN, KV_LORA, Q_LORA, QK_NOPE, QK_ROPE, V_HEAD


@dataclass(frozen=True)
class MLAShape:
    """DeepSeek-V3 attention dimensions [DSV3] (docs/machine.md 2.7); traces may override them."""

    heads: int = HEADS
    hidden: int = HIDDEN
    q_lora_rank: int = Q_LORA
    kv_lora_rank: int = KV_LORA
    qk_nope: int = QK_NOPE
    qk_rope: int = QK_ROPE
    v_head: int = V_HEAD


PREFILL_Q_BLOCK = 128  # query rows per attention unit in prefill (the cube's natural 128-row tile)


def _kv_block(model: DieModel, m: int, d_qk: int, d_kv_per_pos: int, dtype: str) -> int:
    """KV positions per block: Q resident in L1 plus three KV blocks (the software-pipelined
    cube reads two, S of one and P V of the one before, while MTE2 loads the next), in
    multiples of 16 and at most 512; S of one block (m x block fp32) must fit L0C."""
    d = model.die
    ib = DTYPE_BYTES[dtype]
    room = (d.l1_buffer_kib << 10) - m * d_qk * ib
    blk = room // (3 * d_kv_per_pos * ib) // 16 * 16
    l0c_cap = (d.l0c_buffer_kib << 10) // (ceil_div(m, 16) * 16 * 4) // 16 * 16
    blk = min(blk, 512, l0c_cap)
    if blk < 16:
        raise ValueError(f"{m} query rows of {d_qk} values leave no room for KV blocks in L1")
    return blk


def _combine(op: str, model: DieModel, phases: list[OpCost], aic: int, aiv: int, dtype: str) -> OpCost:
    busy = {}
    for p in phases:
        for k, v in p.pipe_busy_cycles.items():
            busy[k] = busy.get(k, 0) + v
    cycles = sum(p.duration_cycles for p in phases)
    return OpCost(op=op, duration_ps=model.cycles_to_ps(cycles), duration_cycles=cycles, aic_cores=aic, aiv_cores=aiv,
                  pipe_busy_cycles=MappingProxyType(busy), hbm_read_byte=sum(p.hbm_read_byte for p in phases),
                  hbm_write_byte=sum(p.hbm_write_byte for p in phases), l2_hit_byte=sum(p.l2_hit_byte for p in phases),
                  macs=sum(p.macs for p in phases), vector_byte=sum(p.vector_byte for p in phases),
                  cube_peak_macs_per_cycle=model.macs_per_cycle(dtype), phases=tuple(phases))


def _prologue(model, tokens, s: MLAShape, aic, aiv, native, absorbed: bool):
    g = dict(cores=aic, native=native)
    v = dict(cores=aiv, native=native)
    qk_head = s.qk_nope + s.qk_rope
    phases = [
        vector_cost(model, "rmsnorm", tokens, s.hidden, **v),
        gemm_cost(model, tokens, s.q_lora_rank, s.hidden, 1, "int8", op="q_a_proj", **g),
        vector_cost(model, "rmsnorm", tokens, s.q_lora_rank, **v),
        gemm_cost(model, tokens, s.heads * qk_head, s.q_lora_rank, 1, "int8", op="q_b_proj", **g),
        gemm_cost(model, tokens, s.kv_lora_rank + s.qk_rope, s.hidden, 1, "int8", op="kv_a_proj", **g),
        vector_cost(model, "rmsnorm", tokens, s.kv_lora_rank, **v),
        vector_cost(model, "rope", tokens * (s.heads + 1), s.qk_rope, **v),
    ]
    if absorbed:
        # q_nope (tokens x nope) @ W_uk (nope x kv_lora), one group per head.
        phases.append(gemm_cost(model, tokens, s.kv_lora_rank, s.qk_nope, s.heads, "bf16", op="absorb_uk", **g))
    return phases


def _mla_cores(model: DieModel, cores: int | None) -> int:
    d = model.die
    aic = d.aic_cores if cores is None else cores
    if not 1 <= aic <= d.aic_cores or 2 * aic > d.aiv_cores:
        raise ValueError(f"{aic} AIC (+{2 * aic} AIV) requested, the die has {d.aic_cores} AIC, {d.aiv_cores} AIV")
    return aic


def mla_attention_cost(model: DieModel, tokens: int, kv_len: int, shape: MLAShape = MLAShape(),
                       dtype: str = "bf16", cores: int | None = None, native: bool = True,
                       queries_per_request: int = 1) -> OpCost:
    """The attention core of absorbed MLA decode alone (no projections): ``tokens`` query tokens,
    ``queries_per_request`` per request (MTP: 2), each request's queries (all heads, kv_lora +
    rope values each) against its ``kv_len`` cached latents, as CANN's FusedInferAttentionScore
    MLA template schedules it (``cmemu.die.fia_mla``)."""
    aic = _mla_cores(model, cores)
    if tokens <= 0 or kv_len <= 0 or queries_per_request <= 0:
        raise ValueError(f"MLA decode needs tokens > 0, kv_len > 0 and queries_per_request > 0, got {tokens}, "
                         f"{kv_len}, {queries_per_request}")
    if tokens % queries_per_request:
        raise ValueError(f"MLA decode of {tokens} tokens: not a whole number of requests of {queries_per_request} "
                         "queries (cmemu.tokens must be a multiple of cmemu.queries_per_request)")
    s = shape
    if s.kv_lora_rank != HEAD_DIM or s.qk_rope != ROPE_DIM:
        raise ValueError(f"FIA's MLA kernel is written for {HEAD_DIM} latent + {ROPE_DIM} rope values per position, "
                         f"got {s.kv_lora_rank} + {s.qk_rope}")
    return decode_attention_cost(model, tokens // queries_per_request, queries_per_request, s.heads, kv_len, dtype,
                                 aic, native)


def mla_decode_cost(model: DieModel, tokens: int, kv_len: int, shape: MLAShape = MLAShape(), dtype: str = "bf16",
                    cores: int | None = None, native: bool = True, queries_per_request: int = 1) -> OpCost:
    """One absorbed MLA decode op (prologue, attention, W_uv) on ``cores`` AIC (and twice as
    many AIV); ``queries_per_request`` query tokens per request (MTP: 2) share its KV reads."""
    aic = _mla_cores(model, cores)
    aiv = 2 * aic
    s = shape
    attn = mla_attention_cost(model, tokens, kv_len, shape, dtype, aic, native, queries_per_request)
    phases = _prologue(model, tokens, s, aic, aiv, native, absorbed=True)
    phases.append(attn)
    phases.append(gemm_cost(model, tokens, s.v_head, s.kv_lora_rank, s.heads, "bf16", cores=aic, native=native,
                            op="absorb_uv"))
    return _combine("mla_decode", model, phases, aic, aiv, dtype)


def prefill_attention_macs(tokens: int, kv_len: int, shape: MLAShape = MLAShape()) -> int:
    """Useful MACs of causal prefill attention: the last ``tokens`` of ``kv_len`` positions, each
    query row against its own position and every one before it, Q K^T (192) and P V (128) per
    head."""
    prefix = kv_len - tokens
    pairs = tokens * prefix + tokens * (tokens + 1) // 2
    return shape.heads * pairs * (shape.qk_nope + shape.qk_rope + shape.v_head)


def mla_prefill_attention_cost(model: DieModel, tokens: int, kv_len: int | None = None,
                               shape: MLAShape = MLAShape(), dtype: str = "bf16", cores: int | None = None,
                               native: bool = True) -> OpCost:
    """The attention of non-absorbed MLA prefill alone (no projections, no RoPE): per head, the
    last ``tokens`` of a causal sequence of ``kv_len`` positions (default ``tokens``: no prefix)
    attend to their own K/V and a reused prefix's, flash-style in query blocks of 128 rows.
    Q (192 values per head), K (192) and V (128) are read from GM, as the trace's q_b and kv_b
    projections and RoPE left them."""
    aic = _mla_cores(model, cores)
    kv_len = tokens if kv_len is None else kv_len
    if tokens <= 0 or kv_len < tokens:
        raise ValueError(f"MLA prefill attention needs 0 < tokens <= kv_len, got tokens {tokens}, kv_len {kv_len}")
    s = shape
    d_qk = s.qk_nope + s.qk_rope
    ib = DTYPE_BYTES[dtype]
    prefix = kv_len - tokens
    bq = min(PREFILL_Q_BLOCK, tokens)
    blk = _kv_block(model, bq, d_qk, d_qk + s.v_head, dtype)
    nq = ceil_div(tokens, bq)
    # Each query block sees at least one KV block: refuse a huge op before its arrays are made.
    check_size("this prefill attention", s.heads * nq * 64)
    # Causal: query block q (rows up to hi, after the prefix) sees the KV blocks holding the
    # positions below prefix + hi; the block the diagonal crosses is loaded up to that row.
    hi = prefix + np.minimum(tokens, (np.arange(nq, dtype=np.int64) + 1) * bq)
    per_q = -(-hi // blk)
    check_size("this prefill attention", s.heads * int(per_q.sum()) * 64)
    kv_blocks = np.tile(per_q, s.heads)
    q_of = np.repeat(np.arange(nq), per_q)
    b_of = np.arange(int(per_q.sum()), dtype=np.int64) - np.repeat(np.cumsum(per_q) - per_q, per_q)
    lens = np.tile(np.minimum(blk, hi[q_of] - b_of * blk), s.heads)
    objs = np.repeat(np.arange(s.heads, dtype=np.int64), len(b_of)) * ceil_div(kv_len, blk) + np.tile(b_of, s.heads)
    cost = attention_cost(model, "mla_prefill_attention", s.heads * nq, kv_blocks, bq, d_qk, s.v_head, blk,
                          lens.astype(np.int64), False, dtype, objs, bq * d_qk * ib, aic, native)
    # attention_cost counts whole loaded blocks; the masked part of diagonal tiles is no work.
    return replace(cost, macs=prefill_attention_macs(tokens, kv_len, s))


def mla_prefill_cost(model: DieModel, tokens: int, shape: MLAShape = MLAShape(), dtype: str = "bf16",
                     cores: int | None = None, native: bool = True) -> OpCost:
    """MLA prefill of one causal sequence of ``tokens`` (not absorbed) on ``cores`` AIC: the
    prologue (input RMSNorm, q_a, q_b, kv_a projections, RMSNorms, RoPE), the kv_b projection
    and ``mla_prefill_attention_cost``, back to back."""
    aic = _mla_cores(model, cores)
    if tokens <= 0:
        raise ValueError(f"MLA prefill needs tokens > 0, got {tokens}")
    aiv = 2 * aic
    s = shape
    attn = mla_prefill_attention_cost(model, tokens, tokens, s, dtype, aic, native)  # first: it refuses huge ops
    phases = _prologue(model, tokens, s, aic, aiv, native, absorbed=False)
    # kv_b: latent -> per-head K nope and V.
    phases.append(gemm_cost(model, tokens, s.heads * (s.qk_nope + s.v_head), s.kv_lora_rank, 1, "int8",
                            cores=aic, native=native, op="kv_b_proj"))
    phases.append(attn)
    return _combine("mla_prefill", model, phases, aic, aiv, dtype)
