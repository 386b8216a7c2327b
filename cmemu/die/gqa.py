"""Grouped-query attention (GQA; MHA when every query head has its own K/V head) on one die:
decode over a paged K/V cache and causal prefill, both on the flash-attention tile schedule of
``cmemu.die.kernels.attention_cost`` (clusters of 1 AIC + 2 AIV: MTE2 loads a K/V block, the
cube computes S = Q Kᵀ, the AIVs the online softmax, the cube P V, the AIVs fold it into the
running output; software-pipelined; Numba kernels, with their pure-Python references when
``native`` is False). K and V are separate tensors of ``head_dim`` values per position and K/V
head; their blocks go through the L2 model (``l2.lru_miss_byte``) as objects of one K/V head's
block, so the query heads of a group that share a K/V head read it from HBM once.

Decode (``gqa_attention_cost``), as CANN's attention kernels lay out GQA (read for this model,
not copied, from an ops-transformer mirror, repo-mirror-test/ops-transformer:
``attention/common/op_kernel/arch32/fia_block_cube_nonquant_gqa.h``, whose plan loops over B x S1
x G x S2 blocks with the query tokens and the group's heads on one M axis, and the
IncreFlashAttention host tiling's ``IFATiling::SplitBNS``, which splits the KV length when there
are fewer batch x K/V-head items than cores): a work item is one request and one K/V head, with
the ``heads / kv_heads`` query heads of that K/V head and the request's ``queries_per_request``
query tokens (MTP: 2) on one M axis (tiles of at most 128 rows: the template's L0 tile); each
item visits the K/V blocks of the request's ``kv_len`` cached positions. When there are fewer
items than cores, each item's KV length is split over ``cores // items`` cores, fewer while a
split would hold under 512 positions (``SplitBNS``), and a combine phase after the tiles merges
the splits' partial outputs with their softmax sums (one vector pass per split over the rows'
partials, on the AIVs). Paged K/V: pages of ``PAGE_POSITIONS`` positions (assumed 128); a K/V
block is a whole number of pages (at most 512 positions, as L1 allows) and MTE2 loads it as one
copy per page for K and one for V, each with its start-up.

Prefill (``gqa_prefill_attention_cost``): per query head, the last ``tokens`` of a causal
sequence of ``kv_len`` positions (the earlier ones a reused prefix) in query blocks of 128 rows,
each against the K/V blocks at or before its last row; causal masking on whole tiles as
``cmemu.die.mla`` describes (a block the diagonal crosses is computed whole and masked; MACs
count the lower triangle only). Query heads of one K/V head are consecutive units, so they run
at the same time on neighbouring clusters and share the K/V blocks in L2.

Left out: the KV-cache write of the new tokens, the attention mask of speculative tokens, L2
contention with other ops, and jitter between the cores (as for MLA, ``cmemu.die.fia_mla``).
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from cmemu.die.kernels import attention_cost, vector_cost
from cmemu.die.mla import PREFILL_Q_BLOCK, _combine, _kv_block, _mla_cores
from cmemu.die.model import DTYPE_BYTES, DieModel, OpCost, ceil_div, check_size

M_TILE = 128  # query rows per decode work item at most (the cube's 128-row tile)
# Paged K/V: positions per page (assumed, as for MLA: CloudMatrix-Infer's page size is not
# published; 128 is one of the sizes CANN's attention allows).
PAGE_POSITIONS = 128
COMBINE_LSE = 2  # a split's softmax max and sum, fp32, per row


def _check(heads: int, kv_heads: int, head_dim: int) -> None:
    if heads <= 0 or kv_heads <= 0 or head_dim <= 0 or heads % kv_heads:
        raise ValueError(f"GQA needs heads a multiple of kv_heads and head_dim > 0, got heads {heads}, kv_heads "
                         f"{kv_heads}, head_dim {head_dim}")


SPLIT_MIN_POSITIONS = 512  # IFA's tiling keeps at least this many positions per split ("经验值")


def decode_split(items: int, kv_len: int, cores: int) -> int:
    """Splits of each work item's KV length, as IFA's tiling (IFATiling::SplitBNS) chooses them:
    the cores each item would have, fewer while a split would hold under 512 positions; 1
    when the items fill the cores."""
    if items >= cores:
        return 1
    splits = cores // items
    while splits > 1 and kv_len / splits < SPLIT_MIN_POSITIONS:
        splits -= 1
    return splits


def gqa_attention_cost(model: DieModel, tokens: int, kv_len: int, heads: int, kv_heads: int, head_dim: int,
                       dtype: str = "bf16", cores: int | None = None, native: bool = True,
                       queries_per_request: int = 1) -> OpCost:
    """GQA decode attention: ``tokens`` query tokens, ``queries_per_request`` per request, each
    request's against its ``kv_len`` cached positions (module docstring)."""
    aic = _mla_cores(model, cores)
    _check(heads, kv_heads, head_dim)
    if tokens <= 0 or kv_len <= 0 or queries_per_request <= 0 or tokens % queries_per_request:
        raise ValueError(f"GQA decode needs tokens > 0 (a multiple of queries_per_request), kv_len > 0, got tokens "
                         f"{tokens}, kv_len {kv_len}, queries_per_request {queries_per_request}")
    requests = tokens // queries_per_request
    rows = heads // kv_heads * queries_per_request  # one K/V head's query heads x the request's tokens
    m = min(M_TILE, rows)
    m_tiles = ceil_div(rows, m)
    ib = DTYPE_BYTES[dtype]
    blk = _kv_block(model, m, head_dim, 2 * head_dim, dtype)
    if blk >= PAGE_POSITIONS:
        blk = blk // PAGE_POSITIONS * PAGE_POSITIONS  # whole pages
    blocks = ceil_div(kv_len, blk)
    items = requests * kv_heads * m_tiles
    splits = min(decode_split(items, kv_len, aic), blocks)
    check_size("this GQA attention", items * (blocks + splits) * 64)
    # Units: (request, K/V head, M tile, split), split innermost; split s takes a contiguous run
    # of the item's blocks.
    per_split = np.array([len(b) for b in np.array_split(np.arange(blocks), splits)], dtype=np.int64)
    kv_blocks = np.tile(per_split, items)
    b_of = np.tile(np.arange(blocks, dtype=np.int64), items)
    lens = np.minimum(blk, kv_len - b_of * blk)
    # Objects: one K/V head's block of one request (its M tiles read the same ones).
    item_of = np.repeat(np.arange(items, dtype=np.int64), splits)
    objs = np.repeat(item_of // m_tiles, kv_blocks) * blocks + b_of
    copies = 2 * -(-lens // PAGE_POSITIONS)  # K and V of each page: a copy each
    cost = attention_cost(model, "gqa_attention.tiles" if splits > 1 else "gqa_attention", items * splits, kv_blocks,
                          m, head_dim, head_dim, blk, lens.astype(np.int64), False, dtype, objs, m * head_dim * ib, aic,
                          native, copies.astype(np.int64))
    useful = requests * heads * queries_per_request
    # attention_cost counts its M tiles' padding rows as work and output: the useful rows only.
    cost = replace(cost, macs=useful * kv_len * 2 * head_dim,
                   hbm_write_byte=useful * head_dim * ib if splits == 1 else 0)
    if splits == 1:
        return cost
    # FlashDecoding combine: per query row, its splits' partial outputs (fp32) and softmax max
    # and sum, weighted and summed on the AIVs; the output written once.
    comb = vector_cost(model, "flash_combine", useful, splits * (head_dim + COMBINE_LSE), 2 * aic, native, "fp32")
    comb = replace(comb, op="gqa_attention.combine", hbm_write_byte=useful * head_dim * ib)
    return _combine("gqa_attention", model, [cost, comb], aic, 2 * aic, dtype)


def gqa_prefill_attention_macs(tokens: int, kv_len: int, heads: int, head_dim: int) -> int:
    """Useful MACs of causal prefill attention: the last ``tokens`` of ``kv_len`` positions, each
    query row against its own position and every one before it, Q Kᵀ and P V of head_dim each."""
    prefix = kv_len - tokens
    return heads * (tokens * prefix + tokens * (tokens + 1) // 2) * 2 * head_dim


def gqa_prefill_attention_cost(model: DieModel, tokens: int, kv_len: int, heads: int, kv_heads: int,
                               head_dim: int, dtype: str = "bf16", cores: int | None = None,
                               native: bool = True) -> OpCost:
    """Causal GQA prefill attention of one request (module docstring): Q, K and V read from GM
    as the trace's projection and RoPE left them."""
    aic = _mla_cores(model, cores)
    _check(heads, kv_heads, head_dim)
    if tokens <= 0 or kv_len < tokens:
        raise ValueError(f"GQA prefill attention needs 0 < tokens <= kv_len, got tokens {tokens}, kv_len {kv_len}")
    ib = DTYPE_BYTES[dtype]
    prefix = kv_len - tokens
    bq = min(PREFILL_Q_BLOCK, tokens)
    blk = _kv_block(model, bq, head_dim, 2 * head_dim, dtype)
    nq = ceil_div(tokens, bq)
    check_size("this prefill attention", heads * nq * 64)
    hi = prefix + np.minimum(tokens, (np.arange(nq, dtype=np.int64) + 1) * bq)
    per_q = -(-hi // blk)
    check_size("this prefill attention", heads * int(per_q.sum()) * 64)
    kv_blocks = np.tile(per_q, heads)
    q_of = np.repeat(np.arange(nq), per_q)
    b_of = np.arange(int(per_q.sum()), dtype=np.int64) - np.repeat(np.cumsum(per_q) - per_q, per_q)
    lens = np.tile(np.minimum(blk, hi[q_of] - b_of * blk), heads)
    group = heads // kv_heads
    kv_head = np.repeat(np.arange(heads, dtype=np.int64) // group, len(b_of))
    objs = kv_head * ceil_div(kv_len, blk) + np.tile(b_of, heads)
    cost = attention_cost(model, "gqa_prefill_attention", heads * nq, kv_blocks, bq, head_dim, head_dim, blk,
                          lens.astype(np.int64), False, dtype, objs, bq * head_dim * ib, aic, native)
    # attention_cost counts whole loaded blocks; the masked part of diagonal tiles is no work.
    return replace(cost, macs=gqa_prefill_attention_macs(tokens, kv_len, heads, head_dim))
