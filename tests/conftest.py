import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
TRACES = REPO / "traces"


@pytest.fixture
def cli(tmp_path):
    """Run the `cmemu` command line in a subprocess, as a user would, from a scratch folder
    (so the installed package is the one that runs, not the source tree)."""

    def run(*args, check=True, cwd=None):
        proc = subprocess.run(
            [sys.executable, "-m", "cmemu.cli", *map(str, args)],
            capture_output=True, text=True, cwd=cwd or tmp_path, timeout=600,
        )
        if check and proc.returncode != 0:
            raise AssertionError(f"cmemu {' '.join(map(str, args))} failed ({proc.returncode}):\n{proc.stderr}")
        return proc

    return run
