"""ems: fetching a prompt's reused KV cache from the EMS pool, over UB or over the VPC plane.

A ``--prompt``-token prompt whose first ``reuse`` share of tokens was seen before: the pool
(cmemu.ems: the DRAM of every CPU of ``--pool-nodes`` nodes) holds its full blocks (warm), placed
by consistent hashing. Die 0 reads every reused block from the CPU that owns it, all at once, as
read messages on the packet engine: over UB (the NPU-CPU paths through the L1 chips) or over the
VPC plane (through both nodes' DPUs at 400 Gb/s). A block on SSD would first be read at the node's
SSD rate (not the case in a warm pool).

Reported per reuse rate: the KV bytes fetched, the time to fetch them over each plane, and the
prefill compute the reused tokens no longer need: the die model's time for one die to run their
projections, MLA prefill attention and their share of expert MLPs, for every layer, one after the
other (an estimate from op times, not a simulated prefill).
"""
from __future__ import annotations

import click
import numpy as np

from cmemu.ems import EMSPool, prefix_keys
from cmemu.errors import CmemuError
from cmemu.fabric import build_fabric
from cmemu.lower import lowered_from_parts
from cmemu.lower.comm import MessageTable
from cmemu.run.pipeline import simulate
from cmemu.scenarios.common import scenario_command
from cmemu.topology import build_topology
from cmemu.vocab import MSG_READ, OP_KIND_RECV
from cmemu.workload.deepseek import EXPERT_FFN, HEADS, HIDDEN, KV_LORA, LAYERS, Q_LORA, QK_NOPE, QK_ROPE, V_HEAD

KV_BYTES_PER_TOKEN_LAYER = KV_LORA + QK_ROPE  # INT8 latent + rope key, docs/machine.md 2.7
EXPERTS_PER_TOKEN = 9  # 8 routed + the shared one


def fetch_ps(topo, fabric, owners, die: int, block_bytes: int, plane: str) -> int:
    """Time for ``die`` to read one block from each owner CPU endpoint, all at once."""
    n = len(owners)
    if n == 0:
        return 0
    table = MessageTable()
    table.add_many(topo, np.asarray(owners), np.full(n, die), np.full(n, block_bytes), np.full(n, -1),
                   np.arange(n), kind=MSG_READ, plane=plane)
    lowered = lowered_from_parts([OP_KIND_RECV] * n, np.zeros(n), [], [], table, op_msg=np.arange(n),
                                 rank=np.full(n, die))
    engine = simulate(lowered, fabric)
    return int(np.asarray(engine.op_end_ps).max())


def prefill_compute_ps(die, tokens: int, prompt: int, layers: int) -> int:
    """Die-model time of the reused tokens' prefill work on one die, layer after layer."""
    from cmemu.die.ops import node_cost

    if tokens == 0:
        return 0

    def t(op, **shape):
        try:
            return node_cost(die, {"cmemu.op": op, "cmemu.dtype": shape.pop("dtype", "int8"),
                                   **{f"cmemu.{k}": v for k, v in shape.items()}}).duration_ps
        except ValueError as exc:  # (the die model's size limit: cmemu.die.model.check_size)
            raise CmemuError(f"--prompt {prompt}: the prefill of {tokens:,} reused tokens on one die is more than "
                             f"the die model evaluates ({exc}); give a shorter --prompt") from None

    per_layer = (t("gemm", m=tokens, n=Q_LORA, k=HIDDEN) + t("gemm", m=tokens, n=HEADS * (QK_NOPE + QK_ROPE), k=Q_LORA)
                 + t("gemm", m=tokens, n=KV_LORA + QK_ROPE, k=HIDDEN)
                 + t("gemm", m=tokens, n=HEADS * (QK_NOPE + V_HEAD), k=KV_LORA)
                 + t("mla_prefill_attention", tokens=tokens, kv_len=tokens, heads=HEADS, dtype="bf16")
                 + t("gemm", m=tokens, n=HIDDEN, k=HEADS * V_HEAD)
                 + t("grouped_gemm", m=tokens * EXPERTS_PER_TOKEN, n=2 * EXPERT_FFN, k=HIDDEN, groups=1)
                 + t("grouped_gemm", m=tokens * EXPERTS_PER_TOKEN, n=HIDDEN, k=EXPERT_FFN, groups=1))
    del prompt
    return per_layer * layers


@scenario_command("ems", default_system="mini")
@click.option("--prompt", type=click.IntRange(min=1), default=4096, show_default=True, help="Prompt tokens.")
@click.option("--reuse", default="0,0.1,0.25,0.5,0.75,0.9", show_default=True,
              help="Shares of the prompt found in the pool (comma-separated, 0..1).")
@click.option("--pool-nodes", type=click.IntRange(min=1), default=None, help="Nodes whose CPUs form the pool [default: all].")
@click.option("--layers", type=click.IntRange(1, LAYERS), default=LAYERS, show_default=True)
def command(spec, prompt, reuse, pool_nodes, layers):
    """KV-cache fetch from the EMS pool for a prompt at reuse rates from 0 to 90%, over UB vs the
    VPC plane: time to load the reused part, and the prefill compute it saves."""
    try:
        rates = [float(x) for x in reuse.split(",") if x.strip()]
    except ValueError:
        raise CmemuError(f"--reuse {reuse}: expected numbers between 0 and 1, comma-separated") from None
    if any(not 0 <= r <= 1 for r in rates):
        raise CmemuError(f"--reuse {reuse}: every rate must be between 0 and 1")
    nodes = pool_nodes or spec.nodes
    if nodes > spec.nodes:
        raise CmemuError(f"--pool-nodes {nodes}: {spec.name} has {spec.nodes} nodes")
    topo = build_topology(spec)
    fabric = build_fabric(topo)
    block_tokens = spec.ems.block_tokens
    block_bytes = block_tokens * KV_BYTES_PER_TOKEN_LAYER * layers
    members = [topo.cpu_endpoint(c) for c in range(nodes * spec.cpus_per_node)]
    pool = EMSPool(members, int(spec.ems.dram_gbyte_per_cpu * 1e9), block_bytes)
    keys = prefix_keys("request", prompt, block_tokens)
    for k in keys:
        pool.put(k)  # a warm pool: the prompt was seen before
    rows = []
    for r in rates:
        reused = int(r * prompt) // block_tokens * block_tokens
        blocks = keys[: reused // block_tokens]
        where = [pool.get(k) for k in blocks]
        ssd = sum(w == "ssd" for w in where)
        owners = [pool.owner(k) for k in blocks]
        row = {"reuse": r, "reused_tokens": reused, "blocks": len(blocks), "kv_bytes": len(blocks) * block_bytes,
               "from_ssd_blocks": ssd}
        for plane in ("ub", "vpc"):
            row[f"fetch_{plane}_us"] = round(fetch_ps(topo, fabric, owners, 0, block_bytes, plane) / 1e6, 1)
        row["prefill_compute_saved_us"] = round(prefill_compute_ps(spec.die, reused, prompt, layers) / 1e6, 1)
        rows.append(row)
    params = {"prompt_tokens": prompt, "block_tokens": block_tokens, "block_bytes": block_bytes,
              "pool_cpus": len(members), "layers": layers}
    return params, rows
