"""UB packet-model benchmarks (issue 3). Gates are ratios measured in the same run.

- EP320 dispatch volume as one all-to-all on cloudmatrix384: 320 dies, each with 96 tokens
  routed to 8 distinct other dies, 7.5 KB per token copy, aggregated per (source, destination)
  pair (budget: <= 2 s wall for lowering and simulation, reported, not gated);
- its cost per event against the same kernel on a small traffic workload in the same run: the
  full system's working set (26 K links, 1.4 M virtual output queues, ~0.3 M packets in flight)
  no longer fits the caches, which may cost a few times per event but must not grow without bound.
"""
import time

import numpy as np

from cmemu._core import make_engine
from cmemu._core.synthetic import traffic_workload
from cmemu.fabric import build_fabric
from cmemu.lower import lowered_from_parts
from cmemu.lower.comm import MessageTable
from cmemu.spec import load_system
from cmemu.topology import build_topology
from cmemu.vocab import OP_KIND_RECV, OP_KIND_SEND

EP = 320
TOKENS_PER_DIE = 96
TOP_K = 8
DISPATCH_BYTES_PER_TOKEN = 7680  # docs/machine.md 2.5: 7,168 B INT8 + scale, padded to 7.5 KB
MAX_COST_RATIO = 8.0


def ep320_dispatch_lowered(topo, seed=0):
    """The dispatch volume of EP320 as one all-to-all: bytes per (source, destination) die."""
    rng = np.random.default_rng(seed)
    # Each token picks TOP_K distinct destinations among the other EP - 1 dies.
    picks = np.argpartition(rng.random((EP * TOKENS_PER_DIE, EP - 1)), TOP_K, axis=1)[:, :TOP_K]
    src = np.repeat(np.arange(EP), TOKENS_PER_DIE * TOP_K)
    dst = picks.ravel()
    dst = dst + (dst >= src)  # skip the source itself
    pairs = np.bincount(src * EP + dst, minlength=EP * EP).reshape(EP, EP)
    s, d = np.nonzero(pairs)
    # Staggered order per source (to die + 1, + 2, ...), as a collective library posts them.
    order = np.lexsort(((d - s) % EP, s))
    s, d = s[order], d[order]
    n = s.size
    table = MessageTable()
    send = np.arange(0, 2 * n, 2)
    table.add_many(topo, s, d, pairs[s, d] * DISPATCH_BYTES_PER_TOKEN, send, send + 1)
    kinds = np.tile([OP_KIND_SEND, OP_KIND_RECV], n)
    return lowered_from_parts(kinds, np.zeros(2 * n), [], [], table, op_msg=np.repeat(np.arange(n), 2),
                              rank=np.stack([s, d], axis=1).ravel())


def _timed_run(lowered, fabric):
    engine = make_engine(lowered, fabric)
    t0 = time.perf_counter()
    engine.run()
    return engine, time.perf_counter() - t0


def test_ep320_dispatch_all_to_all(benchmark):
    topo = build_topology(load_system("cloudmatrix384"))
    fabric = build_fabric(topo)
    t0 = time.perf_counter()
    lowered = ep320_dispatch_lowered(topo)
    lower_s = time.perf_counter() - t0
    engine, sim_s = benchmark.pedantic(_timed_run, args=(lowered, fabric), rounds=1, iterations=1)
    assert engine.ops_done == lowered.num_ops and engine.packets_live == 0
    full_rate = engine.events / sim_s

    mini = build_topology(load_system("mini"))
    small = traffic_workload(mini, messages=3000, seed=1)
    small_fabric = build_fabric(mini)
    small_rate = max(e.events / dt for e, dt in (_timed_run(small, small_fabric) for _ in range(3)))

    total_bytes = int(lowered.msg_bytes.sum())
    ratio = small_rate / full_rate
    benchmark.extra_info.update(
        messages=lowered.num_messages, bytes=total_bytes, events=engine.events, packets_sent=engine.packets_sent,
        lower_s=round(lower_s, 3), simulate_s=round(sim_s, 3), simulated_us=engine.now / 1e6,
        events_per_s=round(full_rate), cost_ratio_vs_mini=round(ratio, 2),
    )
    print(f"\nEP320 dispatch all-to-all: {lowered.num_messages:,} messages, {total_bytes / 1e9:.2f} GB, "
          f"{engine.packets_sent:,} packet-hops, {engine.events:,} events; lowering {lower_s:.2f} s + "
          f"simulation {sim_s:.2f} s = {lower_s + sim_s:.2f} s wall (budget 2 s); "
          f"{full_rate / 1e6:.2f} M events/s vs {small_rate / 1e6:.2f} on mini ({ratio:.1f}x per event); "
          f"simulated {engine.now / 1e6:.1f} us")
    assert ratio <= MAX_COST_RATIO
