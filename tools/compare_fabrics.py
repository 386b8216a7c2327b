"""The message-level fabric against the packet model (the reference), on the cases of
docs/model.md's comparison table: MoE dispatch then combine (96 tokens per die, top-8, the decode
kernels' 16 AIVs on AIV-Direct, or SDMA), EP 32 and 320, uniform and skewed routing; an incast
(N dies writing to one); and optionally the DeepSeek-R1 prefill step on mini.

Run: python tools/compare_fabrics.py [--cases moe,incast,prefill] [--ep 32,320] [--set PATH=VALUE]
[--message-model message|message-bp|message,message-bp] (message-bp: with back-pressure)

Prints, per case, the latency of the slowest rank on each fabric (us), the difference, and the
events of each run. Reads nothing but the presets; writes nothing.
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from cmemu.fabric import build_fabric
from cmemu.lower import lowered_from_parts
from cmemu.lower.comm import MessageTable
from cmemu.run import simulate
from cmemu.scenarios.common import trace_doc
from cmemu.scenarios.moe_comm import moe_nodes, run_collectives
from cmemu.spec import load_system
from cmemu.topology import build_topology
from cmemu.vocab import OP_KIND_RECV, OP_KIND_SEND


def _latency(L, e, first, n):
    part = np.arange(first, first + n)
    begin = np.where(L.op_report_start[part] >= 0, L.op_report_start[part], part)
    return int((e.op_end_ps[part] - e.op_start_ps[begin]).max())


def moe_case(spec, ep, engine, skew, model):
    ranks = list(range(ep))
    nodes = moe_nodes(ranks, 96, 8, 7168, engine, 16 if engine == "aiv" else None, skew, 0, True)
    t = time.perf_counter()
    L, e = run_collectives(trace_doc(spec, nodes, groups={"ep": ranks}), spec, model)
    return {"dispatch": _latency(L, e, 0, ep), "combine": _latency(L, e, ep, ep), "events": e.events,
            "wall_s": time.perf_counter() - t}


def incast_case(spec, senders, size, model):
    """``senders`` dies (spread over both nodes of mini, or the first ones) each write ``size``
    bytes to die 0 at once: the receiver's seven ports are the bottleneck, the switches' buffers
    fill, and the senders are held back by credits on the packet model."""
    topo = build_topology(spec)
    table = MessageTable()
    src = np.arange(1, senders + 1) * max(1, topo.num_dies // (senders + 1))
    n = src.size
    send = np.arange(0, 2 * n, 2)
    table.add_many(topo, src, np.zeros(n), np.full(n, size), send, send + 1)
    L = lowered_from_parts(np.tile([OP_KIND_SEND, OP_KIND_RECV], n), np.zeros(2 * n), [], [], table,
                           op_msg=np.repeat(np.arange(n), 2), rank=np.stack([src, np.zeros(n, dtype=np.int64)], 1).ravel())
    t = time.perf_counter()
    e = simulate(L, build_fabric(topo, model=model))
    return {"incast": int(np.asarray(e.op_end_ps).max()), "events": e.events, "wall_s": time.perf_counter() - t}


def prefill_case(spec, model):
    from cmemu.scenarios.common import run_doc
    from cmemu.trace.deepseek import PrefillConfig, prefill_trace

    cfg = PrefillConfig(ep=min(32, spec.dies), layers=2)
    t = time.perf_counter()
    r = run_doc(prefill_trace(cfg, spec.name, spec.dies), spec, fabric_model=model)
    return {"ttft": int(r.sim_end_ps), "events": r.events, "wall_s": time.perf_counter() - t}


def row(name, p, ms, keys):
    """One case: the packet model's figures ``p``, then each message-level model's in ``ms``."""
    cells = []
    for k in keys:
        cells.append(f"{k} {p[k] / 1e6:,.2f} -> " + " / ".join(f"{m[k] / 1e6:,.2f}" for m in ms) + " us ("
                     + ", ".join(f"{100 * (m[k] / p[k] - 1):+.1f}%" for m in ms) + ")")
    print(f"{name:<28} " + "; ".join(cells) + f"; events {p['events'] / 1e6:.2f} M -> "
          + " / ".join(f"{m['events'] / 1e6:.3f} M" for m in ms)
          + f" ({p['wall_s']:.1f} s -> " + " / ".join(f"{m['wall_s']:.1f} s" for m in ms) + ")", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="moe,incast,prefill")
    ap.add_argument("--ep", default="32,320")
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    ap.add_argument("--message-model", default="message",
                    help="message, message-bp, or both (message,message-bp): each against the packet model")
    args = ap.parse_args()
    models = ("packet",) + tuple(args.message_model.split(","))
    for m in models[1:]:
        if m not in ("message", "message-bp"):
            ap.error(f"--message-model: {m!r} is not message or message-bp")
    cases = args.cases.split(",")
    if "moe" in cases:
        spec = load_system("cloudmatrix384", args.overrides)
        for ep in [int(x) for x in args.ep.split(",")]:
            for engine in ("aiv", "sdma"):
                for skew in (0.0, 1.0):
                    p, *ms = (moe_case(spec, ep, engine, skew, model) for model in models)
                    row(f"EP{ep} {engine} skew {skew:g}", p, ms, ("dispatch", "combine"))
    if "incast" in cases:
        spec = load_system("mini", args.overrides)
        for senders in (7, 15, 31):
            p, *ms = (incast_case(spec, senders, 1 << 20, model) for model in models)
            row(f"incast {senders} dies x 1 MiB", p, ms, ("incast",))
    if "prefill" in cases:
        spec = load_system("mini", args.overrides)
        p, *ms = (prefill_case(spec, model) for model in models)
        row("prefill step, mini, 2 layers", p, ms, ("ttft",))


if __name__ == "__main__":
    main()
