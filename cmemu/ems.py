"""EMS (Elastic Memory Service): a KV-cache block pool over the DRAM of a set of CPU sockets.

docs/machine.md 2.6: blocks of ``ems.block_tokens`` tokens keyed by the hash of their prefix, placed on a
socket by consistent hashing (each socket owns ``vnodes`` points of a hash ring; a block goes to
the first point at or after its key's hash), kept in LRU order per socket up to its DRAM share,
and evicted least recently used to an SSD tier. ``get`` reports where a block is: in DRAM (a hit:
it becomes the most recently used), on SSD (it is promoted back to DRAM, which may evict
others), or nowhere (a miss). Hashes are SHA-256, so placement is the same in every run.

Moving blocks is the fabric's business: a scenario turns the pool's answers into read messages
from the owning CPU to a die, over UB or over the VPC plane (cmemu/scenarios/ems.py).
"""
from __future__ import annotations

import bisect
import hashlib
from collections import OrderedDict


def _h(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")


def prefix_keys(request: str, tokens: int, block_tokens: int) -> list[str]:
    """Keys of the full blocks of a prompt: block i's key covers tokens [0, (i + 1) * block)."""
    return [f"{request}/prefix:{(i + 1) * block_tokens}" for i in range(tokens // block_tokens)]


class EMSPool:
    def __init__(self, members, dram_bytes_per_member: int, block_bytes: int, vnodes: int = 64):
        if not members:
            raise ValueError("an EMS pool needs at least one member")
        if block_bytes <= 0 or dram_bytes_per_member < block_bytes:
            raise ValueError("each member must hold at least one block")
        self.members = list(members)
        self.block_bytes = block_bytes
        self.capacity = dram_bytes_per_member // block_bytes  # blocks per member
        ring = sorted((_h(f"{m}#{v}"), m) for m in self.members for v in range(vnodes))
        self._points = [p for p, _ in ring]
        self._owners = [m for _, m in ring]
        self.dram = {m: OrderedDict() for m in self.members}
        self.ssd = set()
        self.evicted = []  # keys in the order they went to SSD

    def owner(self, key: str):
        i = bisect.bisect_left(self._points, _h(key))
        return self._owners[i % len(self._owners)]

    def put(self, key: str) -> list[str]:
        """Store a block in its owner's DRAM (most recently used); returns the keys evicted."""
        lru = self.dram[self.owner(key)]
        lru[key] = True
        lru.move_to_end(key)
        self.ssd.discard(key)
        out = []
        while len(lru) > self.capacity:
            old, _ = lru.popitem(last=False)
            self.ssd.add(old)
            self.evicted.append(old)
            out.append(old)
        return out

    def get(self, key: str) -> str:
        """'dram' (a hit), 'ssd' (promoted back to DRAM) or 'miss'."""
        lru = self.dram[self.owner(key)]
        if key in lru:
            lru.move_to_end(key)
            return "dram"
        if key in self.ssd:
            self.put(key)
            return "ssd"
        return "miss"
