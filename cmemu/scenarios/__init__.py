"""Named experiments: `cmemu scenario run NAME`. Each scenario builds its workload, runs it on the
model and reports what came out; none contains an expected result.

A scenario is a module here that defines ``command``, a click command made with
``cmemu.scenarios.common.scenario_command``. Register it in SCENARIOS (name -> module, one line
of help); modules are imported only when their scenario is asked for.
"""
from __future__ import annotations

import importlib

from cmemu.spec.load import DEFAULT_SYSTEM

SCENARIOS: dict[str, tuple[str, str]] = {
    "ub-p2p": ("cmemu.scenarios.ub_p2p", "UB point-to-point bandwidth/latency by size, and an all-to-all"),
    "dispatch": ("cmemu.scenarios.dispatch", "MoE dispatch latency and bandwidth by EP degree, AIV-Direct vs SDMA"),
    "combine": ("cmemu.scenarios.combine", "MoE combine latency and bandwidth by EP degree, AIV-Direct vs SDMA"),
    "decode": ("cmemu.scenarios.decode", "DeepSeek-R1 decode step: TPOT, tokens/s per NPU, breakdown, exposed comm"),
    "prefill": ("cmemu.scenarios.prefill", "DeepSeek-R1 prefill step: TTFT, tokens/s per NPU, breakdown, exposed comm"),
    "faults": ("cmemu.scenarios.faults", "all-to-all bandwidth with failed L2 chips and a failed L1 chip"),
    "model-load": ("cmemu.scenarios.model_load", "cold/warm start of a model into N instances, with and without EMS"),
    "kv-transfer": ("cmemu.scenarios.kv_transfer", "prefill -> decode KV-cache transfer over RDMA (and UB)"),
    "ems": ("cmemu.scenarios.ems", "KV-cache fetch from the EMS pool by reuse rate, over UB vs VPC"),
    "context-cache": ("cmemu.scenarios.context_cache",
                      "DeepSeek-R1 prefill with EMS context caching by reuse rate: UB vs VPC vs none"),
    "collectives": ("cmemu.scenarios.collectives", "collectives over UB by size and engine: latency, alg/bus bandwidth"),
    "gemm": ("cmemu.scenarios.gemm", "grouped INT8/BF16 GEMM on one die: cube utilisation, HBM GB/s"),
    "mla": ("cmemu.scenarios.mla", "MLA decode attention on one die: compute-bound vs memory-bound"),
    "hbm": ("cmemu.scenarios.hbm", "HBM streaming bandwidth and latency by access size"),
    "traffic": ("cmemu.scenarios.traffic", "latency-load curves: uniform, permutation, incast, all-to-all packets"),
}


def load_command(name: str):
    """The click command of a scenario."""
    module, _help = SCENARIOS[name]
    return importlib.import_module(module).command


def run_scenario(name: str, system: str = DEFAULT_SYSTEM, overrides=(), **options):
    """Run a scenario from Python: returns (parameters, rows) as the command prints them.

    ``options`` are the command's own options by their Python names, with the command's
    defaults for those left out (e.g. ``run_scenario("ub-p2p", "mini", sizes="512", a2a_dies=0)``).
    """
    from cmemu.errors import CmemuError
    from cmemu.scenarios.common import COMMON_OPTIONS
    from cmemu.spec import load_system

    if name not in SCENARIOS:
        raise CmemuError(f"unknown scenario '{name}' (known: {', '.join(sorted(SCENARIOS))})")
    command = load_command(name)
    known = {p.name: p for p in command.params}
    for key in options:
        if key not in known or key in COMMON_OPTIONS:
            raise CmemuError(f"scenario '{name}' has no option '{key}'")
    args = {p.name: p.default for p in command.params if p.name not in COMMON_OPTIONS}
    for key, value in options.items():
        args[key] = value
    spec = load_system(system, overrides)
    return command.scenario_fn(spec, **args)
