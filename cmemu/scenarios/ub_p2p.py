"""ub-p2p: point-to-point bandwidth and latency over UB, and an all-to-all.

The shape of [CM] table 1 (docs/machine.md 3): for reads and writes from die 0 to another die in its node
(die 2: another NPU, so the path turns at an L1 chip), to a die in the next node (L1 -> L2 -> L1),
and to a CPU in either node, per message size:

- latency: one message on an idle fabric, from the op's start to its completion: for a write,
  until the last ack is back at the writer; for a read, until the last response has arrived;
- bandwidth: many messages of that size in flight at once; the steady-state rate is the slope
  between a run of K messages and one of K/2 (so start-up and drain do not count), in GB/s
  (1e9 B/s) of payload, one direction.

The all-to-all: each of the first N dies writes ``--a2a-bytes`` to every other one of them, all
posted at once in staggered order (die i writes to i+1, i+2, ...); per die, the bytes it sent
over the time its last write was acknowledged.
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
from cmemu.topology import build_topology
from cmemu.units import parse_size, parse_sizes
from cmemu.vocab import MSG_ATOMIC, MSG_READ, MSG_WRITE, OP_KIND_RECV, OP_KIND_SEND

DEFAULT_SIZES = "64,256,512,1K,4K,16K,64K,256K,1M"
BANDWIDTH_BYTES = 4 * 2**20  # at least this much data in the larger bandwidth run
MIN_MESSAGES, MAX_MESSAGES = 64, 8192


def _messages_run(topo, fabric, src, dst, size, count, kind):
    """``count`` concurrent messages of ``size`` bytes src -> dst; returns (ops end, engine).

    A write has a send op (on src) and a receive op (on dst); a read has only its receive op,
    on the reader, which starts it. Every message has its own ops and no dependencies, so all
    start at time 0 and queue at the initiator.
    """
    table = MessageTable()
    if kind == MSG_WRITE:
        kinds = [OP_KIND_SEND, OP_KIND_RECV] * count
        send_op = np.arange(0, 2 * count, 2)
        recv_op = send_op + 1
        op_msg = np.repeat(np.arange(count), 2)
        rank = [src, dst] * count
    else:  # a read or an atomic: started by the receive, on the reader
        kinds = [OP_KIND_RECV] * count
        send_op = np.full(count, -1)
        recv_op = np.arange(count)
        op_msg = np.arange(count)
        rank = [dst] * count
    table.add_many(topo, np.full(count, src), np.full(count, dst), np.full(count, size), send_op, recv_op, kind=kind)
    # Ranks are only labels here (a CPU endpoint has no rank): clip them into the die range.
    rank = np.minimum(np.asarray(rank), topo.num_dies - 1)
    lowered = lowered_from_parts(kinds, np.zeros(len(kinds)), [], [], table, op_msg=op_msg, rank=rank)
    engine = simulate(lowered, fabric)
    return lowered, engine


def latency_ps(topo, fabric, src, dst, size, kind) -> int:
    """One message on an idle fabric: start to completion (ack back, or response in)."""
    _, engine = _messages_run(topo, fabric, src, dst, size, 1, kind)
    return int(np.asarray(engine.op_end_ps).max())


def bandwidth_byte_per_s(topo, fabric, src, dst, size, kind) -> float:
    """Steady-state payload rate with many messages in flight (slope between K/2 and K)."""
    count = int(np.clip(-(-BANDWIDTH_BYTES // size), MIN_MESSAGES, MAX_MESSAGES))
    count -= count % 2
    ends = []
    for k in (count // 2, count):
        lowered, engine = _messages_run(topo, fabric, src, dst, size, k, kind)
        ends.append(int(np.asarray(engine.msg_delivered_ps).max()))
    return (count // 2) * size * 1e12 / (ends[1] - ends[0])


def endpoints(topo):
    """The table's four targets from die 0: (path label, locality, endpoint)."""
    spec = topo.spec
    if spec.nodes < 2:
        raise CmemuError(f"ub-p2p needs at least 2 nodes for inter-node paths; {spec.name} has {spec.nodes}")
    dies_per_node = spec.npus_per_node * spec.dies_per_npu
    return [
        ("NPU->NPU", "intra", 2 if spec.dies_per_npu == 2 else 1),
        ("NPU->NPU", "inter", dies_per_node),
        ("NPU->CPU", "intra", topo.cpu_endpoint(0)),
        ("NPU->CPU", "inter", topo.cpu_endpoint(spec.cpus_per_node)),
    ]


def p2p_table(topo, fabric, sizes, ops=("read", "write")):
    rows = []
    for path, locality, target in endpoints(topo):
        for op in ops:
            for size in sizes:
                if op == "write":
                    src, dst, kind = 0, target, MSG_WRITE
                else:  # die 0 reads (or updates atomically) the target's memory
                    src, dst, kind = target, 0, MSG_READ if op == "read" else MSG_ATOMIC
                lat = latency_ps(topo, fabric, src, dst, size, kind)
                bw = bandwidth_byte_per_s(topo, fabric, src, dst, size, kind)
                rows.append({"path": path, "op": op, "locality": locality, "size_byte": size,
                             "bandwidth_gbyte_per_s": round(bw / 1e9, 2), "latency_us": round(lat / 1e6, 3)})
    return rows


def all_to_all(topo, fabric, dies: int, nbytes: int) -> dict:
    """Each of the first ``dies`` dies writes ``nbytes`` to every other; per-die bandwidth.

    Each die posts its writes in the usual staggered order (to die + 1, die + 2, ...), so that
    at any moment the dies write to different destinations rather than all to the same one.
    """
    src = np.repeat(np.arange(dies), dies - 1)
    dst = (src + np.tile(np.arange(1, dies), dies)) % dies
    n = src.size
    table = MessageTable()
    send_op = np.arange(0, 2 * n, 2)
    table.add_many(topo, src, dst, np.full(n, nbytes), send_op, send_op + 1)
    kinds = np.tile([OP_KIND_SEND, OP_KIND_RECV], n)
    rank = np.stack([src, dst], axis=1).ravel()
    lowered = lowered_from_parts(kinds, np.zeros(2 * n), [], [], table, op_msg=np.repeat(np.arange(n), 2), rank=rank)
    engine = simulate(lowered, fabric)
    send_end = np.asarray(engine.op_end_ps)[send_op]
    per_die_end = np.zeros(dies, dtype=np.int64)
    np.maximum.at(per_die_end, src, send_end)
    bw = (dies - 1) * nbytes * 1e12 / per_die_end
    return {
        "dies": dies,
        "bytes_per_destination": nbytes,
        "completion_us": round(int(per_die_end.max()) / 1e6, 3),
        "bandwidth_per_die_min_gbyte_per_s": round(float(bw.min()) / 1e9, 2),
        "bandwidth_per_die_mean_gbyte_per_s": round(float(bw.mean()) / 1e9, 2),
        "bandwidth_per_die_max_gbyte_per_s": round(float(bw.max()) / 1e9, 2),
        "events": int(engine.events),
    }


@scenario_command("ub-p2p")
@click.option("--sizes", default=DEFAULT_SIZES, show_default=True, help="Message sizes (B; K/M suffixes).")
@click.option("--op", "ops", type=click.Choice(["read", "write", "atomic", "both", "all"]), default="both",
              show_default=True, help="both: read and write; all: read, write and atomic.")
@click.option("--a2a-dies", type=int, default=32, show_default=True,
              help="Dies in the all-to-all (0 to skip it).")
@click.option("--a2a-bytes", default="16K", show_default=True, help="Bytes each die writes to each other die.")
def command(spec, sizes, ops, a2a_dies, a2a_bytes):
    """UB point-to-point bandwidth and latency (read/write, intra/inter node, NPU and CPU
    targets) by message size, and an all-to-all among N dies."""
    topo = build_topology(spec)
    fabric = build_fabric(topo)
    size_list = parse_sizes(sizes)
    op_list = {"both": ("read", "write"), "all": ("read", "write", "atomic")}.get(ops, (ops,))
    tables = {"point-to-point from die 0": p2p_table(topo, fabric, size_list, op_list)}
    params = {"sizes_byte": size_list, "load_balancing": spec.ub.load_balancing}
    if a2a_dies:
        if not 2 <= a2a_dies <= topo.num_dies:
            raise CmemuError(f"--a2a-dies must be between 2 and {topo.num_dies}, got {a2a_dies}")
        a2a_size = parse_size(a2a_bytes, "--a2a-bytes")
        tables["all-to-all"] = [all_to_all(topo, fabric, a2a_dies, a2a_size)]
    return params, tables
