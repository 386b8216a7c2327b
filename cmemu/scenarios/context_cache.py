"""context-cache: CloudMatrix-Infer's EMS context-caching experiment ([CM] 5.4.3), as simulated steps.

DeepSeek-R1 prefill (EP32, attention SP -> TP8 -> SP, two micro-batches, INT8), ``--prompt-len``
token prompts, ``--tokens-per-npu`` prompt tokens per NPU per step (the paper's 4K and 16K: 64
requests on 16 NPUs). For each reuse rate, the same step is simulated (cmemu.scenarios.prefill,
cmemu.trace.ems_fetch) with the reused prefix's KV fetched from the EMS pool over UB, and over
the VPC plane; without context caching every prompt token is computed, whatever the rate (one
step, the reuse-0 one). The reused tokens are whole EMS blocks: a rate is rounded down to a
multiple of ``ems.block_tokens`` (90% of 4,096 is 3,584 tokens, 87.5%), and the column says how
many. At a rate of 0 there is nothing to fetch: the three are the same step, so every gain is 1.

Reported per rate: prompt tokens/s per NPU (every prompt token counts, reused ones too) and TTFT
for each of the three, the gains of UB and VPC over no caching (tokens/s ratios), UB over VPC,
and when the fetched prefixes were in HBM. With ``--layers`` below 61 the figures are the
prefill scenario's extrapolation to 61 layers (from the last simulated dense and MoE layer),
as the table's title says; with 61 they are the simulated step's.
"""
from __future__ import annotations

import click

from cmemu.errors import CmemuError
from cmemu.scenarios.common import run_options, scenario_command
from cmemu.scenarios.prefill import run_prefill
from cmemu.trace.deepseek import LAYERS, PrefillConfig
from cmemu.trace.ems_fetch import ems_reuse

RATES = "0,0.125,0.25,0.5,0.75,0.9"
EP = 32  # docs/machine.md 2.8: prefill on 16 NPUs
ATTN_TP = 8


def _figures(metrics: dict, layers: int) -> tuple[float, float]:
    """(tokens/s per NPU, TTFT in ms) of a step: extrapolated to 61 layers below 61."""
    if layers < LAYERS:
        return metrics["tokens_per_s_per_npu_61_layers_extrapolated"], metrics["ttft_61_layers_extrapolated_ms"]
    return metrics["tokens_per_s_per_npu"], metrics["ttft_ms"]


def parse_rates(text: str) -> list[float]:
    try:
        rates = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise CmemuError(f"--reuse {text}: expected numbers from 0 to 1, comma-separated") from None
    if not rates or any(not 0 <= r < 1 for r in rates):
        raise CmemuError(f"--reuse {text}: every rate must be at least 0 and below 1 (one token is always new)")
    return rates


@scenario_command("context-cache")
@click.option("--prompt-len", type=click.IntRange(min=1), default=4096, show_default=True, help="Tokens per prompt.")
@click.option("--tokens-per-npu", type=click.IntRange(min=1), default=16384, show_default=True,
              help="Prompt tokens per NPU per step (a whole number of prompts per micro-batch and TP group).")
@click.option("--reuse", default=RATES, show_default=True, help="Token reuse rates (comma-separated, 0 <= r < 1).")
@click.option("--pool-nodes", type=click.IntRange(min=1), default=None,
              help="Nodes whose CPUs form the EMS pool [default: all].")
@click.option("--ems-fetch", type=click.Choice(["whole", "layerwise"]), default="whole", show_default=True,
              help="The fetch waited for whole before layer 0, or read and waited for layer by layer.")
@run_options
@click.option("--layers", type=click.IntRange(3, LAYERS), default=3, show_default=True,
              help="Layers to simulate (3 or more: layer 0 waits for the fetch, so layer 1 is the dense layer "
                   "the extrapolation to 61 takes).")
def command(spec, prompt_len, tokens_per_npu, reuse, pool_nodes, ems_fetch, fabric, max_memory, layers):
    """EMS context caching in DeepSeek-R1 prefill by token reuse rate: prompt tokens/s per NPU and
    TTFT with EMS over UB, over VPC and without caching, and the gains."""
    rates = parse_rates(reuse)
    npus = EP // spec.dies_per_npu
    requests, rest = divmod(tokens_per_npu * npus, prompt_len)
    if rest or requests < 1:
        raise CmemuError(f"--tokens-per-npu {tokens_per_npu}: {npus} NPUs x {tokens_per_npu} tokens is not a whole "
                         f"number of {prompt_len}-token prompts")
    base = dict(ep=EP, prompt_len=prompt_len, requests=requests, attn_tp=ATTN_TP, layers=layers)
    PrefillConfig(**base).check(spec.dies)  # a clear error before any run

    def step(rate, plane):
        metrics, _, _ = run_prefill(spec, PrefillConfig(reuse=rate, **base), fabric, max_memory, ems_plane=plane,
                                    pool_nodes=pool_nodes, layerwise=ems_fetch == "layerwise")
        return metrics

    none_tps, none_ttft = _figures(step(0.0, "hbm"), layers)
    rows = []
    for r in rates:
        eff = ems_reuse(r, prompt_len, spec.ems.block_tokens)
        row = {"reuse": r, "reused_tokens_per_prompt": round(eff * prompt_len),
               "no_cache_tokens_per_s_per_npu": none_tps, "no_cache_ttft_ms": none_ttft}
        for plane in ("ub", "vpc"):
            if eff == 0:  # nothing to fetch: the step without caching
                tps, ttft, ready = none_tps, none_ttft, None
            else:
                m = step(r, plane)
                (tps, ttft), ready = _figures(m, layers), m.get("ems_prefix_in_hbm_ms")
            row[f"{plane}_tokens_per_s_per_npu"] = tps
            row[f"{plane}_ttft_ms"] = ttft
            row[f"{plane}_prefix_in_hbm_ms"] = ready
        for plane in ("ub", "vpc"):
            row[f"{plane}_gain_ratio"] = round(row[f"{plane}_tokens_per_s_per_npu"] / none_tps, 3)
        row["ub_over_vpc_ratio"] = round(row["ub_tokens_per_s_per_npu"] / row["vpc_tokens_per_s_per_npu"], 3)
        rows.append(row)
    params = {"ep": EP, "npus": npus, "attn_tp": ATTN_TP, "prompt_len": prompt_len, "requests": requests,
              "prompt_tokens_per_npu": tokens_per_npu, "block_tokens": spec.ems.block_tokens,
              "pool_nodes": pool_nodes or spec.nodes, "ems_fetch": ems_fetch, "layers_simulated": layers,
              "fabric": fabric}
    title = ("by reuse rate (61 layers, extrapolated from the last simulated dense and MoE layer)" if layers < LAYERS
             else "by reuse rate (61 layers, simulated)")
    return params, {title: rows}
