"""dispatch / combine: MoE token dispatch and combine across an EP group (SPEC.md 2.5).

Each of the first EP dies of the system holds one expert's share and ``--tokens`` tokens; every
token goes to ``--top-k`` distinct experts drawn from a seeded distribution (uniform, or skewed by
``--skew``). The scenario runs one MOE_DISPATCH (or a dispatch then a MOE_COMBINE, whose time is
reported) per EP degree and engine, and reports the collective's latency (the slowest rank, from
start to end) and the token bytes each rank wrote to other ranks over that time (for combine,
the expert outputs each rank wrote back; routing is symmetric on average, so per rank this equals
what it received).
"""
from __future__ import annotations

import click
import numpy as np

from cmemu.errors import CmemuError
from cmemu.lower.collectives import dispatch_payload_byte, moe_routing
from cmemu.scenarios.common import run_doc, scenario_command, trace_doc


def moe_nodes(ranks, tokens, top_k, hidden, engine, cores, skew, seed, combine):
    nodes = []
    kinds = ["MOE_DISPATCH", "MOE_COMBINE"] if combine else ["MOE_DISPATCH"]
    for ctype in kinds:
        for r in ranks:
            attrs = {"comm_type": ctype, "cmemu.group": "ep", "cmemu.tokens": tokens, "cmemu.top_k": top_k,
                     "cmemu.hidden": hidden, "cmemu.engine": engine, "cmemu.skew": skew, "cmemu.seed": seed}
            if cores:
                attrs["cmemu.cores"] = cores
            nodes.append({"id": len(nodes), "name": ctype.lower(), "type": "COMM_COLL", "rank": int(r),
                          "stream": 0, "attrs": attrs})
    return nodes


def moe_rows(spec, eps, tokens, top_k, hidden, engines, cores, skew, seed, combine):
    rows = []
    for ep in eps:
        if not 2 <= ep <= spec.dies:
            raise CmemuError(f"--ep {ep}: the EP degree must be between 2 and {spec.dies} (dies of {spec.name})")
        if top_k > ep:
            raise CmemuError(f"--top-k {top_k} is larger than the EP degree {ep}")
        ranks = list(range(ep))
        for engine in engines:
            nodes = moe_nodes(ranks, tokens, top_k, hidden, engine, cores, skew, seed, combine)
            doc = trace_doc(spec, nodes, groups={"ep": ranks})
            r = run_doc(doc, spec)
            which = r.lowered.op_name.index("moe_combine") if combine else 0
            part = np.arange(which, which + ep)
            dur = r.op_end_ps[part] - r.op_start_ps[part]
            # Token bytes each rank wrote to other ranks (the same routing the lowering draws).
            routing = moe_routing(tokens, top_k, ep, ep, skew, seed)
            remote = (routing != np.arange(ep)[:, None, None]).sum(axis=(1, 2))
            payload = 2 * hidden if combine else dispatch_payload_byte(hidden)
            sent = int(remote.mean() * payload)
            rows.append({
                "ep": ep, "engine": engine, "tokens_per_rank": tokens,
                "latency_us": round(int(dur.max()) / 1e6, 2),
                "latency_mean_us": round(float(dur.mean()) / 1e6, 2),
                "bytes_to_other_ranks_per_rank": sent,
                "bandwidth_per_rank_gbyte_per_s": round(sent / (int(dur.max()) / 1e12) / 1e9, 1) if dur.max() else 0.0,
                "events": r.events,
            })
    return rows


def _command(name, combine):
    @scenario_command(name)
    @click.option("--ep", default="8,32,128", show_default=True, help="EP degrees (comma-separated).")
    @click.option("--tokens", type=click.IntRange(min=1), default=96, show_default=True, help="Tokens per rank.")
    @click.option("--top-k", type=click.IntRange(min=1), default=8, show_default=True)
    @click.option("--hidden", type=click.IntRange(min=1), default=7168, show_default=True)
    @click.option("--engine", type=click.Choice(["aiv", "sdma", "both"]), default="both", show_default=True)
    @click.option("--cores", type=click.IntRange(min=1), default=None, help="AIVs per rank [default: all].")
    @click.option("--skew", type=click.FloatRange(min=0), default=0.0, show_default=True,
                  help="Zipf exponent of expert popularity (0: uniform).")
    @click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True)
    def command(spec, ep, tokens, top_k, hidden, engine, cores, skew, seed):
        eps = [int(x) for x in str(ep).split(",") if x.strip()]
        engines = ["aiv", "sdma"] if engine == "both" else [engine]
        params = {"tokens_per_rank": tokens, "top_k": top_k, "hidden": hidden, "skew": skew, "seed": seed}
        return params, moe_rows(spec, eps, tokens, top_k, hidden, engines, cores, skew, seed, combine)

    command.help = (("MoE combine (after a dispatch with the same routing)" if combine else "MoE dispatch")
                    + ": latency and bandwidth per rank by EP degree and engine (AIV-Direct or SDMA).")
    return command
