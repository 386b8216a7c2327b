import dataclasses
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parent.parent
TRACES = REPO / "traces"


def assert_same_fields(a, b, skip=()):
    """Two dataclass instances hold the same values: arrays by dtype and contents, the rest by ==;
    a difference names its field. Fields named in ``skip`` are not compared."""
    for f in dataclasses.fields(a):
        if f.name in skip:
            continue
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, np.ndarray):
            assert x.dtype == y.dtype and np.array_equal(x, y), f.name
        else:
            assert x == y, f.name


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


def pytest_addoption(parser):
    parser.addoption("--update-goldens", action="store_true", default=False,
                     help="Rewrite tests/golden/*.json from this run (a deliberate act: review the diff).")


@pytest.fixture
def update_goldens(request):
    return request.config.getoption("--update-goldens")
