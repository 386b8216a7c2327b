"""collectives: latency and bandwidth of collectives over UB by size, on SDMA or AIV-Direct.

``--ranks`` dies (the first N of the system) run one collective of each size; the latency is the
slowest member's, from start to end. Reported bandwidths follow the usual conventions:
``algbw`` = size / time; ``busbw`` scales it by the bytes each rank must move for that collective
(all-gather and reduce-scatter (N-1)/N, all-reduce 2(N-1)/N, all-to-all (N-1)/N of N x size...),
so that busbw is comparable with a die's link bandwidth.
"""
from __future__ import annotations

import click

from cmemu.errors import CmemuError
from cmemu.scenarios.common import run_doc, scenario_command, trace_doc
from cmemu.units import parse_sizes

OPS = {
    # name: (comm_type, what comm_size means, factor: bus bytes per rank / size)
    "all_gather": ("ALL_GATHER", "bytes per rank", lambda n: n - 1),
    "reduce_scatter": ("REDUCE_SCATTER", "buffer bytes", lambda n: (n - 1) / n),
    "all_reduce": ("ALL_REDUCE", "buffer bytes", lambda n: 2 * (n - 1) / n),
    "all_to_all": ("ALL_TO_ALL", "bytes per destination", lambda n: n - 1),
    "broadcast": ("BROADCAST", "buffer bytes", lambda n: 1.0),
}


@scenario_command("collectives")
@click.option("--op", "ops", default="all_gather,reduce_scatter,all_reduce,all_to_all,broadcast", show_default=True,
              help=f"Collectives ({', '.join(OPS)}).")
@click.option("--ranks", type=click.IntRange(min=2), default=16, show_default=True, help="Dies in the group.")
@click.option("--sizes", default="4K,64K,1M,16M", show_default=True, help="comm_size values (B; K/M suffixes).")
@click.option("--engine", type=click.Choice(["aiv", "sdma", "both"]), default="both", show_default=True)
def command(spec, ops, ranks, sizes, engine):
    """Collectives over UB (all-gather, reduce-scatter, all-reduce, all-to-all, broadcast) by size
    and engine: latency, algorithm and bus bandwidth."""
    names = [o.strip() for o in ops.split(",") if o.strip()]
    for o in names:
        if o not in OPS:
            raise CmemuError(f"--op {o}: not a collective ({', '.join(OPS)})")
    if ranks > spec.dies:
        raise CmemuError(f"--ranks {ranks}: {spec.name} has {spec.dies} dies")
    engines = ["aiv", "sdma"] if engine == "both" else [engine]
    group = list(range(ranks))
    rows = []
    for o in names:
        ctype, meaning, factor = OPS[o]
        for size in parse_sizes(sizes):
            for eng in engines:
                nodes = [{"id": r, "name": o, "type": "COMM_COLL", "rank": r,
                          "attrs": {"comm_type": ctype, "comm_size": size, "cmemu.group": "g", "cmemu.engine": eng}}
                         for r in group]
                res = run_doc(trace_doc(spec, nodes, groups={"g": group}), spec)
                t_ps = int((res.op_end_ps - res.op_start_ps).max())
                algbw = size / (t_ps / 1e12)
                rows.append({"op": o, "engine": eng, "size_byte": size, "latency_us": round(t_ps / 1e6, 2),
                             "algbw_gbyte_per_s": round(algbw / 1e9, 2),
                             "busbw_gbyte_per_s": round(algbw * factor(ranks) / 1e9, 2)})
    return {"ranks": ranks, "comm_size": {o: OPS[o][1] for o in names}}, rows
