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


def all_to_all(topo, dies, nbytes: int):
    """Engine input: every die of ``dies`` writes ``nbytes`` to every other, each message its own
    send op (on its source) and receive op (on its target), all ready at once."""
    from cmemu.lower import lowered_from_parts
    from cmemu.lower.comm import MessageTable
    from cmemu.vocab import OP_KIND_RECV, OP_KIND_SEND

    table = MessageTable()
    kinds, rank, op_msg = [], [], []
    for s in dies:
        for d in dies:
            if s != d:
                i = len(op_msg) // 2
                table.add(topo, s, d, nbytes, "ub", send_op=2 * i, recv_op=2 * i + 1)
                kinds += [OP_KIND_SEND, OP_KIND_RECV]
                rank += [s, d]
                op_msg += [i, i]
    return lowered_from_parts(kinds, [0] * len(kinds), [], [], table, op_msg=op_msg, rank=rank)


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


# The test layers (docs/architecture.md, "Tests"), as pytest markers: `pytest -m "rules or die"`
# runs the rules of each mechanism and the die model alone. Every test file is in one layer
# (tests/test_layers.py checks it).
TEST_LAYERS = {
    "rules": ("test_fabric", "test_message_fabric", "test_message_backpressure", "test_message_tails", "test_aiv_initiator", "test_collectives", "test_moe_kernels",
              "test_hbm_sharing", "test_ems", "test_ems_fetch", "test_faults", "test_routes", "test_topology", "test_spec",
              "test_vocab", "test_layers", "test_kernels"),
    "die": ("test_die_hbm", "test_die_ops", "test_die_pipeline", "test_gqa_attention", "test_mla_decode_schedule"),
    "frontend": ("test_trace_load", "test_trace_graph", "test_frontend_shortcuts", "test_lowering_blocks",
                 "test_deepseek", "test_prefill", "test_models", "test_import_ascend", "test_import_chakra"),
    "equivalence": ("test_engine", "test_binning", "test_postprocess", "test_hbm_series_groups", "test_property",
                    "test_message_fabric_mixed_traffic", "test_trace_memory", "test_direct_sinks"),
    "paper": ("test_deepep_normal_table", "test_gemm_table10", "test_ub_table1"),
    "system": ("test_run", "test_memory", "test_scenarios", "test_sweep", "test_interrupt", "test_hostile_input", "test_robustness",
               "test_output_safety", "test_traffic"),
    "output": ("test_timeline", "test_perfetto", "test_report", "test_report_hbm", "test_packets",
               "test_pipe_intervals", "test_writer_chunks"),
    "golden": ("test_golden",),
}
LAYER_OF_TEST = {name: layer for layer, names in TEST_LAYERS.items() for name in names}


def pytest_configure(config):
    for layer in TEST_LAYERS:
        config.addinivalue_line("markers", f"{layer}: the {layer} layer of the tests (tests/conftest.py)")


def pytest_collection_modifyitems(config, items):
    for item in items:
        layer = LAYER_OF_TEST.get(item.path.stem)
        if layer is not None:
            item.add_marker(getattr(pytest.mark, layer))
