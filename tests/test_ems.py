"""EMS pool: placement, hits and misses, LRU eviction; UB vs VPC bulk transfers."""
import pytest

from cmemu.ems import EMSPool, prefix_keys
from cmemu.fabric import build_fabric
from cmemu.scenarios.ems import fetch_ps
from cmemu.spec import load_system
from cmemu.topology import build_topology


def test_prefix_keys_are_full_blocks():
    assert prefix_keys("r", 300, 128) == ["r/prefix:128", "r/prefix:256"]


def test_consistent_hashing_places_deterministically_and_moves_little():
    keys = [f"k{i}" for i in range(2000)]
    a = EMSPool([1, 2, 3, 4], 10**12, 10)
    b = EMSPool([1, 2, 3, 4], 10**12, 10)
    assert [a.owner(k) for k in keys] == [b.owner(k) for k in keys]
    counts = {m: sum(a.owner(k) == m for k in keys) for m in (1, 2, 3, 4)}
    assert min(counts.values()) > 300  # spread over every member
    # Adding a member moves only the keys it takes over (about a fifth), never between old members.
    c = EMSPool([1, 2, 3, 4, 5], 10**12, 10)
    moved = [k for k in keys if a.owner(k) != c.owner(k)]
    assert all(c.owner(k) == 5 for k in moved) and 0.1 < len(moved) / len(keys) < 0.35


def test_hits_misses_and_lru_eviction_order():
    pool = EMSPool(["cpu"], dram_bytes_per_member=3 * 100, block_bytes=100)  # 3 blocks of DRAM
    for k in "abc":
        assert pool.put(k) == []
    assert pool.get("a") == "dram"  # a is now the most recently used: b is the oldest
    assert pool.put("d") == ["b"]
    assert pool.put("e") == ["c"]
    assert pool.evicted == ["b", "c"]
    assert pool.get("b") == "ssd"  # promoted back to DRAM, evicting the least recently used (a)
    assert pool.evicted[-1] == "a"
    assert pool.get("zzz") == "miss"


def test_bulk_transfer_over_vpc_vs_ub_in_the_ratio_of_their_rates():
    spec = load_system("mini")
    topo = build_topology(spec)
    fabric = build_fabric(topo)
    cpu = topo.cpu_endpoint(0)
    size = 64 * 2**20
    ub = fetch_ps(topo, fabric, [cpu], 0, size, "ub")
    vpc = fetch_ps(topo, fabric, [cpu], 0, size, "vpc")
    # Over UB the CPU's 7 ports (160 GB/s) carry 4 KB reads with 28 B headers (whole 20 B flits:
    # 4140 B); over VPC the die's 32 GB/s link to the DPU carries 4 KB frames with 78 B of framing.
    ub_rate = 160e9 * 4096 / 4140
    vpc_rate = spec.vpc.host_link_gbyte_per_s * 1e9 * 4096 / (4096 + 78)
    assert vpc / ub == pytest.approx(ub_rate / vpc_rate, rel=0.05)
