"""kv-transfer: moving a request's KV cache from a prefill die to a decode die (docs/machine.md 2.8).

CloudMatrix-Infer moves each request's KV cache once, prefill -> decode, over the RDMA plane
(200 Gb/s per die). For each prompt length, the KV cache of all ``--layers`` layers (576 INT8
values per token and layer) is written from die 0 to a die in another node as packets on the
engine, over RDMA, and for comparison over UB; reported: bytes and time per plane.
"""
from __future__ import annotations

import click
import numpy as np

from cmemu.errors import CmemuError
from cmemu.fabric import build_fabric
from cmemu.lower import lowered_from_parts
from cmemu.lower.comm import MessageTable
from cmemu.run.pipeline import simulate
from cmemu.scenarios.common import scenario_command
from cmemu.scenarios.ems import KV_BYTES_PER_TOKEN_LAYER
from cmemu.topology import build_topology
from cmemu.units import parse_sizes
from cmemu.vocab import OP_KIND_RECV, OP_KIND_SEND
from cmemu.workload.deepseek import LAYERS


def transfer_ps(topo, fabric, src, dst, nbytes, plane) -> int:
    table = MessageTable()
    table.add(topo, src, dst, nbytes, plane, send_op=0, recv_op=1)
    lowered = lowered_from_parts([OP_KIND_SEND, OP_KIND_RECV], [0, 0], [], [], table, op_msg=[0, 0], rank=[src, dst])
    engine = simulate(lowered, fabric)
    return int(np.asarray(engine.op_end_ps)[1])


@scenario_command("kv-transfer", default_system="mini")
@click.option("--prompts", default="1K,4K,16K", show_default=True, help="Prompt lengths in tokens (K = 1024).")
@click.option("--layers", type=click.IntRange(1, LAYERS), default=LAYERS, show_default=True)
def command(spec, prompts, layers):
    """Prefill -> decode KV-cache transfer of one request over RDMA (and over UB for comparison)."""
    topo = build_topology(spec)
    if spec.nodes < 2:
        raise CmemuError(f"kv-transfer needs two nodes; {spec.name} has {spec.nodes}")
    fabric = build_fabric(topo)
    dst = spec.npus_per_node * spec.dies_per_npu  # first die of the next node
    rows = []
    for tokens in parse_sizes(prompts):
        nbytes = tokens * KV_BYTES_PER_TOKEN_LAYER * layers
        row = {"prompt_tokens": tokens, "kv_bytes": nbytes}
        for plane in ("rdma", "ub"):
            t = transfer_ps(topo, fabric, 0, dst, nbytes, plane)
            row[f"{plane}_us"] = round(t / 1e6, 1)
            row[f"{plane}_gbyte_per_s"] = round(nbytes / (t / 1e12) / 1e9, 1)
        rows.append(row)
    return {"layers": layers, "from_die": 0, "to_die": dst}, rows
