"""Named experiments: `cmemu scenario run NAME`. Each scenario builds its workload, runs it on the
model and reports what came out; none contains an expected result.

A scenario is a module here that defines ``command``, a click command made with
``cmemu.scenarios.common.scenario_command``. Register it in SCENARIOS (name -> module, one line
of help); modules are imported only when their scenario is asked for.
"""
from __future__ import annotations

import importlib

SCENARIOS: dict[str, tuple[str, str]] = {
    "ub-p2p": ("cmemu.scenarios.ub_p2p", "UB point-to-point bandwidth/latency by size, and an all-to-all"),
}


def load_command(name: str):
    """The click command of a scenario."""
    module, _help = SCENARIOS[name]
    return importlib.import_module(module).command
