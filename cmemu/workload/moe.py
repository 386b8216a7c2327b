"""MoE workload models: the payload of a dispatched token, which experts each token picks
(seeded, uniform or Zipf-skewed) and which member holds each, and the memory a routing takes.
The trace generators size their expert GEMMs with them; the lowering routes dispatch and combine
with them (the same routing for both)."""
from __future__ import annotations

from functools import lru_cache

import numpy as np

DISPATCH_SCALE_BYTE = 4  # the per-token fp32 scale written beside the INT8 token
DISPATCH_ALIGN_BYTE = 512  # token slots are padded to 512 B: 7,168 + 4 -> 7,680 (docs/machine.md 2.5)


def dispatch_payload_byte(hidden: int) -> int:
    return -(-(hidden + DISPATCH_SCALE_BYTE) // DISPATCH_ALIGN_BYTE) * DISPATCH_ALIGN_BYTE


@lru_cache(maxsize=16)
def moe_routing(tokens: int, top_k: int, experts: int, members: int, skew: float, seed: int) -> np.ndarray:
    """Destination member of every (token, k) pair of every source: int array [members, tokens, top_k].
    Expert e lives on member e // (experts / members), in contiguous blocks as the fused kernels
    place them ([OT] moe_distribute_dispatch_v2.h: toRankId = expert / moeExpertNumPerRank)."""
    out = moe_experts(tokens, top_k, experts, members, skew, seed) // (experts // members)
    out.setflags(write=False)
    return out


@lru_cache(maxsize=16)
def moe_experts(tokens: int, top_k: int, experts: int, members: int, skew: float, seed: int) -> np.ndarray:
    """The expert of every (token, k) pair of every source: int array [members, tokens, top_k].

    Each token picks ``top_k`` distinct experts, with probability proportional to
    (rank of the expert + 1) ** -skew (uniform for skew 0), by the Gumbel top-k trick.
    """
    rng = np.random.default_rng(seed)
    logp = -skew * np.log(np.arange(1, experts + 1))
    out = np.empty((members, tokens, top_k), dtype=np.int64)
    for m in range(members):
        if top_k >= experts:
            chosen = np.tile(np.arange(experts), (tokens, 1))
        else:
            # Gumbel keys log p + G with G = -log(-log U); with skew 0 every log p is equal and
            # the top k of U are the top k of the keys (a monotone map), so skip the logs.
            u = rng.random(size=(tokens, experts), dtype=np.float32)
            keys = u if skew == 0 else logp - np.log(-np.log(np.maximum(u, np.float32(1e-38))))
            chosen = np.argpartition(-keys, top_k - 1, axis=1)[:, :top_k]
        out[m] = chosen
    out.setflags(write=False)  # shared by every caller with the same arguments (cached)
    return out


def moe_routing_bytes(tokens: int, top_k: int, experts: int, members: int) -> int:
    """Memory of one MoE routing (moe_routing): the destinations of every
    member's (token, expert) pairs (int64), and while one member's are drawn, a key per token and
    expert (float32 draws, float64 keys with skew and their negation, int64 partition) and three
    per expert (its log-probability)."""
    pairs = members * tokens * min(top_k, experts) * 8
    scratch = tokens * experts * (4 + 8 + 8 + 8) if top_k < experts else tokens * experts * 16
    return pairs + scratch + experts * 24
