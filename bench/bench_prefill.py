"""The full DeepSeek-R1 prefill step (issue 20): 61 layers, EP32, 8 prompts of 4K tokens, 2
micro-batches, SDMA all-to-all, on the message-level fabric.

Budget: <= 60 s wall and <= 4 GB peak memory on the 2-core development machine, both for
`cmemu run --fabric message` of the generated step (the HDF5 written) and for the way a user runs
it, `cmemu scenario run prefill --layers 61 --fabric message` end to end (the step generated and
run in memory, its figures worked out). Timed as bench_decode.py times the decode step: each in a
child process, wall time from its start to its exit, peak resident memory its own.

By default this runs the step cut to 4 and to 5 layers (3 dense + 1 or 2 MoE layers), which
differ by one MoE layer, and reports what one MoE layer costs and the whole step extrapolated
from it (3 dense + 58 MoE layers). With CMEMU_BENCH_FULL_STEP=1 it also runs the whole step both
ways and reports it as measured, and the scenario's whole step on the two other fabric models
too: message-bp, and the packet model, the reference (see the README for today's figures).

Gated: the cost per event of the 5-layer run against the 4-layer one (a run must not slow down
as it grows), and the scenario's 5-layer TTFT against the run's simulated time (the same step).
"""
import json
import os

from decode_steps import decode_trace, run_figures, timed_cli

MAX_EVENT_COST_GROWTH = 1.5
BUDGET_S, BUDGET_GB = 60.0, 4.0
LAYERS = 61


def _run(tmp_path, layers):
    trace = decode_trace(tmp_path, layers, phase="prefill")
    out, wall, peak = timed_cli(["run", trace, "-o", tmp_path / f"prefill_{layers}.h5", "--fabric", "message"],
                                tmp_path)
    return {**run_figures(out), "wall_s": wall, "peak_gb": peak}


def _scenario(tmp_path, layers, fabric="message"):
    out, wall, peak = timed_cli(["scenario", "run", "prefill", "--layers", layers, "--fabric", fabric, "--json"],
                                tmp_path)
    (step,) = json.loads(out)["tables"]["prefill step"]
    return {"ttft_ms": step["ttft_ms"], "wall_s": wall, "peak_gb": peak}


def test_prefill_step_extrapolated(tmp_path):
    four, five = _run(tmp_path, 4), _run(tmp_path, 5)
    layer_s, layer_events = five["wall_s"] - four["wall_s"], five["events"] - four["events"]
    layer_gb = max(0.0, five["peak_gb"] - four["peak_gb"])
    more = LAYERS - 5  # MoE layers the whole step has beyond the 5-layer cut
    full_s, full_events, full_gb = five["wall_s"] + more * layer_s, five["events"] + more * layer_events, \
        five["peak_gb"] + more * layer_gb
    scenario = _scenario(tmp_path, 5)
    print(f"\nDeepSeek-R1 prefill on cloudmatrix384, EP32, 8 x 4K tokens, 2 micro-batches, SDMA, message-level "
          f"fabric: 5 layers {five['events']:,} events in {five['wall_s']:.1f} s wall, peak {five['peak_gb']:.2f} GB; "
          f"one MoE layer {layer_events:,} events, {layer_s:.2f} s, {layer_gb:.3f} GB; 61 layers extrapolated "
          f"{full_events / 1e6:,.1f} M events, {full_s:,.0f} s wall (budget {BUDGET_S:.0f} s), {full_gb:.1f} GB "
          f"(budget {BUDGET_GB:.0f} GB). The scenario, 5 layers, end to end: {scenario['wall_s']:.1f} s, "
          f"{scenario['peak_gb']:.2f} GB, TTFT {scenario['ttft_ms']:.3f} ms")
    assert layer_events > 0
    assert (four["events"] / four["wall_s"]) / (five["events"] / five["wall_s"]) <= MAX_EVENT_COST_GROWTH
    assert abs(scenario["ttft_ms"] - five["sim_us"] / 1e3) <= 1e-3


def test_prefill_step_full(tmp_path):
    if os.environ.get("CMEMU_BENCH_FULL_STEP") != "1":
        import pytest

        pytest.skip("set CMEMU_BENCH_FULL_STEP=1 to run the whole 61-layer step")
    full = _run(tmp_path, LAYERS)
    scenario = _scenario(tmp_path, LAYERS)
    print(f"\nDeepSeek-R1 prefill, 61 layers, EP32, message-level fabric: `cmemu run` {full['events']:,} events in "
          f"{full['wall_s']:.1f} s wall ({full['events'] / full['wall_s'] / 1e6:.2f} M events/s), peak "
          f"{full['peak_gb']:.2f} GB with the HDF5 written; the scenario end to end {scenario['wall_s']:.1f} s, peak "
          f"{scenario['peak_gb']:.2f} GB (budget {BUDGET_S:.0f} s, {BUDGET_GB:.0f} GB); TTFT {scenario['ttft_ms']:,.3f} "
          f"ms, simulated {full['sim_us']:,.1f} us")
    for fabric in ("message-bp", "packet"):
        other = _scenario(tmp_path, LAYERS, fabric)
        print(f"the scenario on --fabric {fabric}: {other['wall_s']:.1f} s, peak {other['peak_gb']:.2f} GB; TTFT "
              f"{other['ttft_ms']:,.3f} ms ({(other['ttft_ms'] / scenario['ttft_ms'] - 1) * 100:+.1f}% against "
              f"message)")
        assert other["ttft_ms"] > 0
    assert full["events"] > 0
    assert abs(scenario["ttft_ms"] - full["sim_us"] / 1e3) <= 1e-3
