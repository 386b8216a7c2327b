"""model-load: cold and warm start of a model into several serving instances, with and without
the EMS pool (docs/machine.md 2.6).

The model's ``--model-gbyte`` of INT8 weights go to ``--instances`` instances that split the
system's dies between them; each die holds an equal shard. Object storage is outside the
supernode and is not simulated: it serves ``ems.object_storage_gbyte_per_s`` per bucket, shared
by everyone loading from it. Moving shards from the pool to the dies is simulated on the packet
engine: every die reads a sample of ``--sample-mbyte`` from the CPU that owns its shard
(consistent hashing over the pool), all at once, over UB; the bulk time is that sample's time
scaled to the shard (the transfer is bandwidth-bound).

- without the pool, every start (cold or warm) reads the model once per instance from object
  storage;
- with the pool, a cold start reads it once from object storage into the pool's DRAM, then every
  instance from the pool; a warm start (the model already in the pool) only the latter.
"""
from __future__ import annotations

import click
import numpy as np

from cmemu.ems import EMSPool
from cmemu.errors import CmemuError
from cmemu.lower import lowered_from_parts
from cmemu.lower.comm import MessageTable
from cmemu.lower.fabric import build_fabric
from cmemu.run import simulate
from cmemu.scenarios.common import scenario_command
from cmemu.topology import build_topology
from cmemu.vocab import MSG_READ, OP_KIND_RECV


@scenario_command("model-load")
@click.option("--model-gbyte", type=click.FloatRange(min=0, min_open=True), default=671.0, show_default=True,
              help="Model weights (GB, INT8 DeepSeek-R1).")
@click.option("--instances", type=click.IntRange(min=1), default=8, show_default=True)
@click.option("--sample-mbyte", type=click.IntRange(min=1), default=1, show_default=True,
              help="Bytes per die actually simulated from the pool (MB).")
def command(spec, model_gbyte, instances, sample_mbyte):
    """Cold and warm start of a model into N instances, with and without the EMS pool."""
    topo = build_topology(spec)
    fabric = build_fabric(topo)
    if instances > spec.dies:
        raise CmemuError(f"--instances {instances}: {spec.name} has only {spec.dies} dies")
    model = model_gbyte * 1e9
    members = [topo.cpu_endpoint(c) for c in range(spec.cpus)]
    pool_bytes = spec.cpus * spec.ems.dram_gbyte_per_cpu * 1e9
    if pool_bytes < model:
        raise CmemuError(f"the pool's DRAM ({pool_bytes / 1e9:,.0f} GB) cannot hold the {model_gbyte:,.0f} GB model")
    dies_per_instance = spec.dies // instances
    shard = model / dies_per_instance
    if shard > spec.die.hbm_capacity_gbyte * 1e9:
        raise CmemuError(f"{instances} instances of {dies_per_instance} dies: {shard / 1e9:,.1f} GB of weights per die "
                         f"do not fit its {spec.die.hbm_capacity_gbyte:,.0f} GB of HBM; use fewer instances")
    sample = sample_mbyte * 2**20
    pool = EMSPool(members, int(spec.ems.dram_gbyte_per_cpu * 1e9), sample)
    owners = [pool.owner(f"weights/shard{d % dies_per_instance}") for d in range(instances * dies_per_instance)]
    # All dies of all instances read their sample at once.
    n = len(owners)
    table = MessageTable()
    table.add_many(topo, np.asarray(owners), np.arange(n), np.full(n, sample), np.full(n, -1), np.arange(n),
                   kind=MSG_READ)
    engine = simulate(lowered_from_parts([OP_KIND_RECV] * n, np.zeros(n), [], [], table, op_msg=np.arange(n),
                                         rank=np.arange(n)), fabric)
    sample_s = int(np.asarray(engine.op_end_ps).max()) / 1e12
    pool_to_dies_s = sample_s * shard / sample
    obs = spec.ems.object_storage_gbyte_per_s * 1e9
    obs_once_s = model / obs
    rows = [
        {"start": "cold", "pool": "no", "object_storage_s": round(instances * obs_once_s, 1), "pool_to_npus_s": 0.0,
         "total_s": round(instances * obs_once_s, 1)},
        {"start": "cold", "pool": "yes", "object_storage_s": round(obs_once_s, 1),
         "pool_to_npus_s": round(pool_to_dies_s, 2), "total_s": round(obs_once_s + pool_to_dies_s, 1)},
        {"start": "warm", "pool": "no", "object_storage_s": round(instances * obs_once_s, 1), "pool_to_npus_s": 0.0,
         "total_s": round(instances * obs_once_s, 1)},
        {"start": "warm", "pool": "yes", "object_storage_s": 0.0, "pool_to_npus_s": round(pool_to_dies_s, 2),
         "total_s": round(pool_to_dies_s, 2)},
    ]
    params = {"model_gbyte": model_gbyte, "instances": instances, "dies_per_instance": dies_per_instance,
              "shard_gbyte_per_die": round(shard / 1e9, 3), "object_storage_gbyte_per_s": spec.ems.object_storage_gbyte_per_s,
              "pool_read_gbyte_per_s_per_die": round(sample / sample_s / 1e9, 1)}
    return params, rows
