"""What the benches share: generating the DeepSeek-R1 decode and prefill steps on cloudmatrix384."""
import re
import resource
import subprocess
import sys
import time

CLI = "from cmemu.cli import main; main()"


def decode_trace(folder, layers: int, phase: str = "decode"):
    """The EP320 decode step (``phase="prefill"``: the EP32 prefill step, 8 prompts of 4K tokens,
    2 micro-batches, SDMA all-to-all) cut to ``layers`` layers (made once per folder), as `cmemu
    trace gen` writes it. Run from ``folder``: from the checkout, `python -c` would import its
    cmemu (no compiled core unless built in place) rather than the installed one."""
    trace = folder / (f"ep320_{layers}.json" if phase == "decode" else f"prefill_ep32_{layers}.json")
    if not trace.exists():
        subprocess.run([sys.executable, "-c", CLI, "trace", "gen", "deepseek-r1", "--system", "cloudmatrix384",
                        "--phase", phase, "--layers", str(layers), "-o", str(trace)], check=True,
                       capture_output=True, cwd=folder)
    return trace


def timed_cli(args, cwd):
    """Run `cmemu ARGS` in a child process from ``cwd``: (stdout, wall s from its start to its
    exit, its peak resident memory in GB). ru_maxrss of children is the largest child so far:
    only a new maximum is this run's (NaN otherwise)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", CLI, *map(str, args)], capture_output=True, text=True, cwd=cwd)
    elapsed = time.perf_counter() - start
    assert done.returncode == 0, done.stderr[-2000:]
    peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return done.stdout, elapsed, peak_kib * 1024 / 1e9 if peak_kib > before else float("nan")


def run_figures(out: str) -> dict:
    """Events and simulated time from the summary `cmemu run` prints."""
    return {"events": int(re.search(r"events\s+([\d,]+)", out).group(1).replace(",", "")),
            "sim_us": float(re.search(r"simulated time\s+([\d,.]+) us", out).group(1).replace(",", ""))}
