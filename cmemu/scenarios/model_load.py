"""model-load: loading a model into serving instances with no cache, a local DRAM cache per node,
or the EMS pool ([CM] 4.4: model caching), and switching instances among several models.

The model's ``--model-gbyte`` of INT8 weights go to ``--instances`` instances that split the
system's dies between them; each die holds an equal shard (shard = model / dies per instance).
Weights are kept in DRAM in blocks of ``--block-mbyte`` (assumed: [CM] does not say how EMS cuts a
model), so a shard is read as many blocks:

- **no cache**: every load reads the model from object storage;
- **local DRAM cache**: each node keeps in its CPUs' DRAM the shards its own dies hold, block j on
  its CPU j mod CPUs per node; a load that hits reads them from there over UB, within the node.
  Every instance keeps its own copy (instances x model in all), and a node holds the shards of as
  many models as its DRAM takes (``cpus_per_node`` x ``ems.dram_gbyte_per_cpu``);
- **EMS**: one copy of the model in the pool (the DRAM of every CPU), each block on the socket
  consistent hashing gives it (cmemu.ems); a load that hits reads every block from its socket
  over UB, wherever it is. The pool holds as many models as all its DRAM takes.

Object storage is outside the supernode and is not simulated: it serves
``ems.object_storage_gbyte_per_s`` per bucket ([CM]: 2.5 GB/s), shared by everyone loading from
it; what it sends crosses the VPC plane into the nodes at up to 50 GB/s a node, which at that rate
never binds, and is not simulated either. Reads from DRAM into the dies are simulated on the
packet engine on samples: every block is read as a message of ``--sample-kbyte``, then of twice
that (all the dies of the loading instances at once, from the sockets that hold their blocks),
and the time is extended linearly to the block's size from the two (the reads are
bandwidth-bound: the sockets' 160 GB/s of UB ports, or a die's 196 GB/s, bind; the start-up and
latencies are counted once). A cold start reads object storage (once per instance without the pool,
once with it) and then, with a cache, DRAM into the dies; a warm start only the latter.

Switching: ``--switches`` times, an instance (in turn) switches to a model drawn uniformly from
``--models`` (seeded, never the one it runs); caches start empty and keep models in LRU order. A
hit loads that instance from DRAM (simulated: that instance alone); a miss from object storage,
through the cache when there is one. Reported: hit rate and average switch latency.
"""
from __future__ import annotations

from collections import OrderedDict

import click
import numpy as np

from cmemu.ems import EMSPool
from cmemu.errors import CmemuError
from cmemu.fabric import build_fabric
from cmemu.lower import lowered_from_parts
from cmemu.lower.comm import MessageTable
from cmemu.run.pipeline import simulate
from cmemu.scenarios.common import check_positive, scenario_command
from cmemu.topology import build_topology
from cmemu.vocab import MSG_READ, OP_KIND_RECV

STRATEGIES = ("no cache", "local DRAM cache", "EMS")


def load_ps(topo, fabric, dies, owners, sample: int) -> int:
    """Every die of ``dies`` reads one ``sample``-byte message from each CPU endpoint of its row
    of ``owners``, all at once: the time until the last is in HBM."""
    src = np.concatenate([np.asarray(o) for o in owners])
    dst = np.repeat(np.asarray(dies), [len(o) for o in owners])
    op = np.repeat(np.arange(len(dies)), [len(o) for o in owners])
    table = MessageTable()
    table.add_many(topo, src, dst, np.full(src.size, sample), np.full(src.size, -1), op, kind=MSG_READ)
    n = len(dies)
    lowered = lowered_from_parts([OP_KIND_RECV] * n, np.zeros(n), [], [], table, op_msg=np.full(n, -1),
                                 rank=np.asarray(dies))
    return int(np.asarray(simulate(lowered, fabric).op_end_ps).max())


@scenario_command("model-load")
@click.option("--model-gbyte", type=click.FloatRange(min=0, min_open=True), default=671.0, show_default=True,
              help="Model weights (GB, INT8 DeepSeek-R1).")
@click.option("--instances", type=click.IntRange(min=1), default=8, show_default=True)
@click.option("--block-mbyte", type=click.FloatRange(min=0, min_open=True), default=64.0, show_default=True,
              help="Weights per DRAM block (MB; assumed, not published).")
@click.option("--sample-kbyte", type=click.IntRange(min=1), default=32, show_default=True,
              help="Bytes each block read is simulated with (KB); the time is scaled by block / sample.")
@click.option("--models", type=click.IntRange(min=2), default=8, show_default=True,
              help="Models the instances switch among.")
@click.option("--switches", type=click.IntRange(min=1), default=64, show_default=True)
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True)
def command(spec, model_gbyte, instances, block_mbyte, sample_kbyte, models, switches, seed):
    """Cold and warm start of a model into N instances and switching among models: no cache, a
    local DRAM cache per node, EMS."""
    check_positive("model_gbyte", model_gbyte)  # (a FloatRange lets NaN and infinity through)
    check_positive("block_mbyte", block_mbyte)
    topo = build_topology(spec)
    fabric = build_fabric(topo)
    if instances > spec.dies:
        raise CmemuError(f"--instances {instances}: {spec.name} has only {spec.dies} dies")
    model = model_gbyte * 1e9
    per = spec.dies // instances
    shard = model / per
    if shard > spec.die.hbm_capacity_gbyte * 1e9:
        raise CmemuError(f"{instances} instances of {per} dies: {shard / 1e9:,.1f} GB of weights per die do not fit "
                         f"its {spec.die.hbm_capacity_gbyte:,.0f} GB of HBM; use fewer instances")
    dram_cpu = spec.ems.dram_gbyte_per_cpu * 1e9
    node_dram = spec.cpus_per_node * dram_cpu
    dies_per_node = spec.npus_per_node * spec.dies_per_npu
    node_share = shard * min(per, dies_per_node)  # what one node's dies of one instance hold
    pool_models = int(spec.cpus * dram_cpu // model)
    # The instances that share a node share its DRAM.
    node_models = int(node_dram // (node_share * max(1, dies_per_node // per)))
    if pool_models < 1:
        raise CmemuError(f"the pool's DRAM ({spec.cpus * dram_cpu / 1e9:,.0f} GB) cannot hold the "
                         f"{model_gbyte:,.0f} GB model")
    block = block_mbyte * 1e6
    blocks = max(1, round(shard / block))  # per shard
    sample = sample_kbyte * 1024
    if 2 * sample > shard / blocks:
        raise CmemuError(f"--sample-kbyte {sample_kbyte}: more than half a block ({shard / blocks / 1e6:,.1f} MB)")
    scale = shard / blocks / sample
    pool = EMSPool([topo.cpu_endpoint(c) for c in range(spec.cpus)], int(dram_cpu), max(1, int(shard / blocks)))

    def owners(strategy, d):
        if strategy == "EMS":
            return [pool.owner(f"model/shard{d % per}/block{j}") for j in range(blocks)]
        node = topo.die_node(d)
        return [topo.cpu_endpoint(node * spec.cpus_per_node + j % spec.cpus_per_node) for j in range(blocks)]

    def dram_load_s(strategy, dies):
        # Bandwidth-bound, so linear in the size: from two samples, extended to the block.
        rows = [owners(strategy, d) for d in dies]
        t1, t2 = (load_ps(topo, fabric, dies, rows, k * sample) for k in (1, 2))
        return (t1 + (t2 - t1) * (scale - 1)) / 1e12

    all_dies = list(range(instances * per))
    one = list(range(per))
    warm = {s: dram_load_s(s, all_dies) for s in STRATEGIES[1:]}
    warm_one = {s: dram_load_s(s, one) for s in STRATEGIES[1:]}
    obs = spec.ems.object_storage_gbyte_per_s * 1e9
    obs_once = model / obs
    start_rows = [
        {"strategy": "no cache", "cold_start_s": round(instances * obs_once, 1), "warm_start_s": round(
            instances * obs_once, 1), "dram_used_x_model": 0.0, "dram_to_npus_gbyte_per_s_per_die": None},
        {"strategy": "local DRAM cache", "cold_start_s": round(instances * obs_once + warm["local DRAM cache"], 1),
         "warm_start_s": round(warm["local DRAM cache"], 3), "dram_used_x_model": float(instances),
         "dram_to_npus_gbyte_per_s_per_die": round(shard / warm["local DRAM cache"] / 1e9, 1)},
        {"strategy": "EMS", "cold_start_s": round(obs_once + warm["EMS"], 1), "warm_start_s": round(warm["EMS"], 3),
         "dram_used_x_model": 1.0, "dram_to_npus_gbyte_per_s_per_die": round(shard / warm["EMS"] / 1e9, 1)},
    ]
    # Switching among models: the same draws for every strategy.
    rng = np.random.default_rng(seed)
    current = [0] * instances
    draws = []
    for k in range(switches):
        i = k % instances
        m = int(rng.integers(models - 1))
        m += m >= current[i]  # never the model it runs
        current[i] = m
        draws.append((i, m))
    switch_rows = []
    for strategy, capacity in zip(STRATEGIES, (0, node_models, pool_models)):
        caches = {} if strategy != "local DRAM cache" else {i: OrderedDict() for i in range(instances)}
        pool_lru = OrderedDict()
        hits, total = 0, 0.0
        for i, m in draws:
            lru = caches[i] if strategy == "local DRAM cache" else pool_lru
            hit = capacity > 0 and m in lru
            if capacity:
                lru[m] = True
                lru.move_to_end(m)
                while len(lru) > capacity:
                    lru.popitem(last=False)
            hits += hit
            dram = warm_one.get(strategy, 0.0)
            total += dram if hit else obs_once + dram
        switch_rows.append({"strategy": strategy, "models_cached_per_instance": capacity if strategy != "EMS" else None,
                            "models_cached_in_pool": capacity if strategy == "EMS" else None,
                            "hit_rate_percent": round(100 * hits / switches, 1),
                            "avg_switch_latency_s": round(total / switches, 2),
                            "hit_latency_s": round(warm_one[strategy], 3) if strategy in warm_one else None})
    params = {"model_gbyte": model_gbyte, "instances": instances, "dies_per_instance": per,
              "shard_gbyte_per_die": round(shard / 1e9, 3), "blocks_per_shard": blocks,
              "block_mbyte": round(shard / blocks / 1e6, 2), "sample_kbyte": sample_kbyte,
              "object_storage_gbyte_per_s": spec.ems.object_storage_gbyte_per_s, "models": models,
              "switches": switches, "seed": seed}
    return params, {"start (all instances at once)": start_rows, "model switching (one instance at a time)": switch_rows}
