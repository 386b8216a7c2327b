"""dispatch / combine: MoE token dispatch and combine across an EP group (docs/machine.md 2.5).

Each of the first EP dies of the system holds ``--experts`` / EP experts (contiguous blocks) and
``--tokens`` tokens; every token goes to ``--top-k`` distinct experts drawn from a seeded
distribution (uniform, or skewed by ``--skew``). The scenario runs one MOE_DISPATCH (or a
dispatch then a MOE_COMBINE, whose time is reported) per EP degree, engine and kernel: on
AIV-Direct the fused kernels (cmemu/lower/moe.py: ``low_latency``, the decode kernels, or
``normal``, the prefill ones with their count exchange and pull), or on SDMA. It reports the
collective's latency (the slowest rank, from start to end), its split into the kernel's steps on
that rank, and two bandwidths:

- ``bandwidth_per_rank_gbyte_per_s``: the token bytes each rank wrote to other ranks over the
  latency (for combine, the expert outputs written back);
- ``deepep_bandwidth_gbyte_per_s``: the quantity DeepEP-Ascend's tests print for rank 0
  (sgl-kernel-npu tests/python/deepep): normal kernels, every row rank 0 received (its own
  included) counted at BF16 size (2 x hidden) over rank 0's time (test_intranode.py); low-latency
  kernels, rank 0's selections x (hidden + hidden / 128 x 4 + 16) B for dispatch and x 2 x hidden
  for combine, over its time (test_low_latency.py).

The steps (``*_us``) partition the slowest rank's latency in the kernel's order, each from the
end of the step before to the end of its own last op: ``load_quantise`` is the busiest core's own
work in the send loop (loading, quantising, local copies), ``writes`` the rest of the send loop
(its remote writes' round trips and the links); then the barrier, the status flags, the wait
for the other ranks' flags, and the local copy into expert order (a pull of remote reads in the
normal kernel); the normal dispatch starts with its count exchange and host synchronisations
(``notify``); combine ends with the receive loop (``sum``: polling each token's flags and the
weighted sums after the last send).
"""
from __future__ import annotations

import click
import numpy as np

from cmemu.errors import CmemuError
from cmemu.options import RUN_OPTIONS
from cmemu.workload.deepseek import HIDDEN
from cmemu.workload.moe import dispatch_payload_byte, moe_routing
from cmemu.scenarios.common import scenario_command, trace_doc

DEEPSEEK_EXPERTS = 256  # [DSV3] routed experts


def default_experts(ep: int) -> int:
    """DeepSeek's 256 routed experts when the EP degree divides them, else the next multiple of
    EP (whole experts per rank: e.g. 320 at EP320, one per die as CloudMatrix-Infer places them)."""
    return DEEPSEEK_EXPERTS if DEEPSEEK_EXPERTS % ep == 0 else ep * -(-DEEPSEEK_EXPERTS // ep)


def moe_nodes(ranks, tokens, top_k, hidden, engine, cores, skew, seed, combine, experts=None, kernel=None):
    nodes = []
    kinds = ["MOE_DISPATCH", "MOE_COMBINE"] if combine else ["MOE_DISPATCH"]
    for ctype in kinds:
        for r in ranks:
            attrs = {"comm_type": ctype, "cmemu.group": "ep", "cmemu.tokens": tokens, "cmemu.top_k": top_k,
                     "cmemu.hidden": hidden, "cmemu.engine": engine, "cmemu.skew": skew, "cmemu.seed": seed}
            if experts:
                attrs["cmemu.experts"] = experts
            if kernel and engine == "aiv":
                attrs["cmemu.kernel"] = kernel
            if cores:
                attrs["cmemu.cores"] = cores
            nodes.append({"id": len(nodes), "name": ctype.lower(), "type": "COMM_COLL", "rank": int(r),
                          "stream": 0, "attrs": attrs})
    return nodes


def run_collectives(doc: dict, spec, fabric_model: str = "packet"):
    """Lower and run a trace document keeping every internal op's times (the collectives'
    steps): (lowered, engine)."""
    from cmemu.fabric import build_fabric
    from cmemu.lower import lower
    from cmemu.run.diagnostics import check_clock_range
    from cmemu.run.pipeline import simulate
    from cmemu.topology import build_topology
    from cmemu.trace.check import load_trace
    from cmemu.trace.read import TraceDocument

    source = TraceDocument(doc, f"<{spec.name} scenario trace>")
    trace = load_trace(source.name, spec.dies, read=source.take())
    topo = build_topology(spec)
    lowered = lower(trace, topo)
    fabric = build_fabric(topo, model=fabric_model)
    check_clock_range(lowered, fabric)
    return lowered, simulate(lowered, fabric)


# The steps in the kernels' order (cmemu.lower.moe.PHASES), and the columns they are reported as.
_STEPS = ("notify", "host", "send", "barrier", "status", "wait", "copy", "sum")


def kernel_steps(L, engine, op: int) -> dict:
    """The latency of trace op ``op`` (a MoE collective's member) split into its kernel's steps,
    in us (module docstring)."""
    from cmemu.lower.moe import PHASE

    start, end = engine.op_start_ps, engine.op_end_ps
    entry = int(L.op_report_start[op]) if L.op_report_start[op] >= 0 else op
    t = int(start[entry])
    mine = np.flatnonzero(L.op_parent == op)
    out = {}
    for step in _STEPS:
        sel = mine[L.op_phase[mine] == PHASE[step]]
        if sel.size == 0:
            continue
        last = int(end[sel].max())
        dur = max(0, last - t)
        if step == "send":
            own = _own_work_ps(L, engine, sel)
            out["load_quantise_us"] = round(min(own, dur) / 1e6, 3)
            out["writes_us"] = round(max(0, dur - own) / 1e6, 3)
        else:
            key = "pull_us" if step == "copy" and np.any(L.op_kind[sel] == 2) else f"{step}_us"
            out[key] = round(out.get(key, 0) + dur / 1e6, 3)
        t = max(t, last)
    return out


def _own_work_ps(L, engine, send_ops) -> int:
    """The busiest core's own work in its send loop: its writes' prep (cmemu.lower.comm) and its
    loop's last local steps; the core is the one whose loop ended last."""
    end = engine.op_end_ps
    last = int(send_ops[np.argmax(end[send_ops])])
    # A core's loop is its SEND op and the COMP op of its last local steps after it (if any).
    preds = L.succ_idx  # find the SEND op this tail follows
    core_ops = [last]
    if L.op_kind[last] == 0:
        src = np.repeat(np.arange(L.num_ops), np.diff(L.succ_ptr))
        before = src[preds == last]
        core_ops += [int(p) for p in before if p in set(send_ops.tolist()) and L.op_kind[p] == 1]
    own = 0
    for o in core_ops:
        if L.op_kind[o] == 1:
            own += int(L.msg_prep[L.msg_send_op == o].sum())
        else:
            own += int(L.op_dur_ps[o])
    return own


def moe_rows(spec, eps, tokens, top_k, hidden, engines, cores, skew, seed, combine, kernels=("low_latency",),
             experts=None, fabric_model="packet"):
    from cmemu.lower.moe import dispatch_write_byte

    rows = []
    for ep in eps:
        if not 2 <= ep <= spec.dies:
            raise CmemuError(f"--ep {ep}: the EP degree must be between 2 and {spec.dies} (dies of {spec.name})")
        n_exp = experts or default_experts(ep)
        if n_exp % ep:
            raise CmemuError(f"--experts {n_exp} is not a multiple of the EP degree {ep}")
        if top_k > n_exp:
            raise CmemuError(f"--top-k {top_k} is larger than the number of experts {n_exp}")
        ranks = list(range(ep))
        routing = moe_routing(tokens, top_k, n_exp, ep, skew, seed)
        for engine in engines:
            for kernel in (kernels if engine == "aiv" else (None,)):
                nodes = moe_nodes(ranks, tokens, top_k, hidden, engine, cores, skew, seed, combine, n_exp, kernel)
                L, e = run_collectives(trace_doc(spec, nodes, groups={"ep": ranks}), spec, fabric_model)
                which = ep if combine else 0
                part = np.arange(which, which + ep)
                begin = np.where(L.op_report_start[part] >= 0, L.op_report_start[part], part)
                dur = e.op_end_ps[part] - e.op_start_ps[begin]
                slowest = int(np.argmax(dur))
                # Token bytes each rank wrote to other ranks (the same routing the lowering draws).
                remote = (routing != np.arange(ep)[:, None, None]).sum(axis=(1, 2))
                payload = 2 * hidden if combine else (dispatch_write_byte(hidden) if engine == "aiv"
                                                      else dispatch_payload_byte(hidden))
                sent = int(remote.mean() * payload)
                t0 = int(dur[0])
                if kernel == "normal":
                    deepep = int((routing == 0).sum()) * 2 * hidden
                else:
                    per_sel = 2 * hidden if combine else hidden + hidden // 128 * 4 + 16
                    deepep = tokens * top_k * per_sel
                row = {"ep": ep, "engine": engine, "kernel": kernel or "-", "tokens_per_rank": tokens,
                       "experts": n_exp, "latency_us": round(int(dur.max()) / 1e6, 2),
                       "latency_mean_us": round(float(dur.mean()) / 1e6, 2)}
                if engine == "aiv":
                    row.update(kernel_steps(L, e, int(part[slowest])))
                row.update({
                    "bytes_to_other_ranks_per_rank": sent,
                    "bandwidth_per_rank_gbyte_per_s": round(sent / (int(dur.max()) / 1e12) / 1e9, 1) if dur.max() else 0.0,
                    "deepep_bandwidth_gbyte_per_s": round(deepep / (t0 / 1e12) / 1e9, 1) if t0 else 0.0,
                    "events": e.events,
                })
                rows.append(row)
    return rows


def _command(name, combine):
    @scenario_command(name)
    @click.option("--ep", default="8,32,128", show_default=True, help="EP degrees (comma-separated).")
    @click.option("--tokens", type=click.IntRange(min=1), default=128, show_default=True, help="Tokens per rank.")
    @click.option("--top-k", type=click.IntRange(min=1), default=8, show_default=True)
    @click.option("--hidden", type=click.IntRange(min=1), default=HIDDEN, show_default=True)
    @click.option("--experts", type=click.IntRange(min=1), default=None,
                  help="Experts in all, a multiple of EP [default: 256 where EP divides it, else the next multiple "
                       "of EP].")
    @click.option("--engine", type=click.Choice(["aiv", "sdma", "both"]), default="both", show_default=True)
    @click.option("--kernel", type=click.Choice(["low-latency", "normal", "both"]), default="low-latency",
                  show_default=True,
                  help="AIV-Direct kernel: low-latency (decode, MoeDistributeDispatchV2/CombineV2) or normal "
                       "(prefill: count exchange, pull-based dispatch).")
    @click.option("--cores", type=click.IntRange(min=1), default=None, help="AIVs per rank [default: all].")
    @click.option("--skew", type=click.FloatRange(min=0), default=0.0, show_default=True,
                  help="Zipf exponent of expert popularity (0: uniform).")
    @click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True)
    @RUN_OPTIONS["fabric_model"].option("--fabric", help="Fabric model (as `cmemu run --fabric`).")
    def command(spec, ep, tokens, top_k, hidden, experts, engine, kernel, cores, skew, seed, fabric):
        try:
            eps = [int(x) for x in str(ep).split(",") if x.strip()]
        except ValueError:
            raise CmemuError(f"--ep must be integers separated by commas, got {ep!r}") from None
        engines = ["aiv", "sdma"] if engine == "both" else [engine]
        kernels = ["low_latency", "normal"] if kernel == "both" else [kernel.replace("-", "_")]
        params = {"tokens_per_rank": tokens, "top_k": top_k, "hidden": hidden, "skew": skew, "seed": seed,
                  "fabric": fabric}
        return params, moe_rows(spec, eps, tokens, top_k, hidden, engines, cores, skew, seed, combine, kernels,
                                experts, fabric)

    command.help = (("MoE combine (after a dispatch with the same routing)" if combine else "MoE dispatch")
                    + ": latency, its kernel steps and bandwidth per rank by EP degree, engine (AIV-Direct or "
                      "SDMA) and kernel.")
    return command
