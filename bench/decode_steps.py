"""What the benches share: generating the DeepSeek-R1 decode and prefill steps on cloudmatrix384."""
import os
import re
import subprocess
import sys
import tempfile
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
    exit, its own peak resident memory in GB: wait4's, the child's alone, so that a run after a
    bigger one has its own figure)."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        start = time.perf_counter()
        child = subprocess.Popen([sys.executable, "-c", CLI, *map(str, args)], stdout=out, stderr=err, text=True,
                                 cwd=cwd)
        _, status, usage = os.wait4(child.pid, 0)
        elapsed = time.perf_counter() - start
        child.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    assert child.returncode == 0, stderr[-2000:]
    return stdout, elapsed, usage.ru_maxrss * 1024 / 1e9  # (ru_maxrss: KiB on Linux)


def run_figures(out: str) -> dict:
    """Events and simulated time from the summary `cmemu run` prints."""
    return {"events": int(re.search(r"events\s+([\d,]+)", out).group(1).replace(",", "")),
            "sim_us": float(re.search(r"simulated time\s+([\d,.]+) us", out).group(1).replace(",", ""))}
