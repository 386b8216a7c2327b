"""The full DeepSeek-R1 decode step (issue 6): 61 layers, EP320, 96 tokens per die, 2 micro-batches.

Budget (issue 6): <= 60 s wall and <= 4 GB peak memory with the HDF5 written. Not met: the whole
step is hundreds of millions of events at packet granularity. This bench runs `cmemu run` (in a
child process, so that its peak memory is its own) on the generated step cut to 4 and to 5
layers, which differ by one MoE layer, and reports what one MoE layer costs and the whole step
extrapolated from it (3 dense + 58 MoE layers + the MTP layer). Gated: the cost per event of the
5-layer run against the 4-layer one (a run must not slow down as it grows).
"""
import re
import resource
import subprocess
import sys

MAX_EVENT_COST_GROWTH = 1.5
BUDGET_S, BUDGET_GB = 60.0, 4.0


def _run(tmp_path, layers):
    trace = tmp_path / f"ep320_{layers}.json"
    # Run from tmp_path: from the checkout, `python -c` would import its cmemu (no compiled core
    # unless built in place) rather than the installed one.
    cli = "from cmemu.cli import main; main()"
    subprocess.run([sys.executable, "-c", cli, "trace", "gen", "deepseek-r1", "--system", "cloudmatrix384",
                    "--layers", str(layers), "-o", str(trace)], check=True, capture_output=True, cwd=tmp_path)
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    done = subprocess.run([sys.executable, "-c", cli, "run", str(trace), "-o", str(tmp_path / f"{layers}.h5")],
                          capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    out = done.stdout
    peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    events = int(re.search(r"events\s+([\d,]+)", out).group(1).replace(",", ""))
    wall = float(re.search(r"wall time\s+([\d.]+) s", out).group(1))
    return {"events": events, "wall_s": wall, "peak_gb": max(peak_kib, before) * 1024 / 1e9}


def test_decode_step_extrapolated(tmp_path):
    four, five = _run(tmp_path, 4), _run(tmp_path, 5)
    layer_s, layer_events = five["wall_s"] - four["wall_s"], five["events"] - four["events"]
    layer_gb = max(0.0, five["peak_gb"] - four["peak_gb"])
    # 4 layers = 3 dense + 1 MoE + MTP; the full step has 57 more MoE layers.
    full_s, full_events = five["wall_s"] + 56 * layer_s, five["events"] + 56 * layer_events
    full_gb = five["peak_gb"] + 56 * layer_gb
    print(f"\nDeepSeek-R1 decode on cloudmatrix384, EP320, 96 tokens/die, 2 micro-batches: 5 layers "
          f"{five['events']:,} events in {five['wall_s']:.1f} s wall, peak {five['peak_gb']:.2f} GB; one MoE "
          f"layer {layer_events:,} events, {layer_s:.1f} s, {layer_gb:.2f} GB; 61 layers extrapolated "
          f"{full_events / 1e6:,.0f} M events, {full_s:,.0f} s wall (budget {BUDGET_S:.0f} s), {full_gb:.1f} GB "
          f"(budget {BUDGET_GB:.0f} GB)")
    assert layer_events > 0 and layer_s > 0
    rate4, rate5 = four["events"] / four["wall_s"], five["events"] / five["wall_s"]
    assert rate4 / rate5 <= MAX_EVENT_COST_GROWTH
