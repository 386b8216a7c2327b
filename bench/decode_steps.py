"""What the benches share: generating the DeepSeek-R1 decode step on cloudmatrix384."""
import subprocess
import sys

CLI = "from cmemu.cli import main; main()"


def decode_trace(folder, layers: int):
    """The EP320 decode step cut to ``layers`` layers (made once per folder), as `cmemu trace gen`
    writes it. Run from ``folder``: from the checkout, `python -c` would import its cmemu (no
    compiled core unless built in place) rather than the installed one."""
    trace = folder / f"ep320_{layers}.json"
    if not trace.exists():
        subprocess.run([sys.executable, "-c", CLI, "trace", "gen", "deepseek-r1", "--system", "cloudmatrix384",
                        "--layers", str(layers), "-o", str(trace)], check=True, capture_output=True, cwd=folder)
    return trace
