"""Every registered scenario runs from the command line (small options) and prints one JSON
document whose numbers carry their units; plus the figures of a few scenarios by hand."""
import json

import pytest
from click.testing import CliRunner

from cmemu.cli import main
from cmemu.scenarios import SCENARIOS, run_scenario
from cmemu.spec import load_system

# Small, quick options per scenario (every scenario must be listed: a new one needs a line).
SMALL = {
    "ub-p2p": ["-s", "mini", "--sizes", "512", "--op", "write", "--a2a-dies", "4"],
    "gemm": [],
    "mla": [],
    "hbm": [],
    "dispatch": ["-s", "mini", "--ep", "4", "--tokens", "8", "--top-k", "2"],
    "combine": ["-s", "mini", "--ep", "4", "--tokens", "8", "--top-k", "2", "--engine", "sdma"],
    "collectives": ["-s", "mini", "--ranks", "4", "--sizes", "4K", "--op", "all_reduce", "--engine", "aiv"],
    "decode": ["-s", "mini", "--ep", "4", "--tokens-per-die", "8", "--layers", "2", "--kv-len", "256"],
    "prefill": ["-s", "mini", "--ep", "8", "--attn-tp", "4", "--requests", "4", "--prompt-len", "256",
                "--layers", "2"],
    "faults": ["-s", "mini", "--a2a-dies", "4", "--a2a-bytes", "4K"],
    "ems": ["--prompt", "512", "--reuse", "0,0.5", "--layers", "2"],
    "model-load": ["--instances", "8", "--sample-mbyte", "1"],
    "kv-transfer": ["--prompts", "1K", "--layers", "2"],
    "traffic": ["-s", "mini", "--load", "0.2,0.9", "--window-us", "2", "--fabric", "both"],
}

UNIT_SUFFIXES = ("_us", "_ms", "_ns", "_s", "_ps", "_byte", "_bytes", "_mbyte", "_gbyte_per_s", "_percent", "_pct",
                 "_tokens", "_per_npu", "_per_die", "_per_rank", "_blocks")


def test_every_scenario_has_small_options():
    assert set(SMALL) == set(SCENARIOS)


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_scenario_runs_and_prints_json(name):
    res = CliRunner().invoke(main, ["scenario", "run", name, *SMALL[name], "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert doc["scenario"] == name and doc["system"]
    tables = doc.get("tables") or {"": doc["rows"]}
    rows = [r for t in tables.values() for r in t]
    assert rows
    numbers = [k for r in rows for k, v in r.items() if isinstance(v, float)]
    assert numbers  # every scenario reports measured quantities ...
    # ... and say their unit in their name (a share, like reuse, has none).
    missing = {k for k in numbers if not (k.endswith(UNIT_SUFFIXES) or "_per_" in k or k in ("reuse",))}
    assert not missing, sorted(missing)


def test_scenario_bad_option_is_one_line_exit_2():
    res = CliRunner().invoke(main, ["scenario", "run", "dispatch", "-s", "mini", "--ep", "999"])
    assert res.exit_code == 2 and "--ep 999" in res.output


def test_kv_transfer_over_rdma_at_the_rdma_rate():
    # 1 K tokens x 576 B x 2 layers over one die's 200 Gb/s RDMA port, 4 KB packets with 58 B
    # of RoCEv2 framing: about 25e9 x 4096 / 4154 B/s.
    _, rows = run_scenario("kv-transfer", "mini", prompts="1K", layers=2)
    assert rows[0]["kv_bytes"] == 1024 * 576 * 2
    assert rows[0]["rdma_gbyte_per_s"] == pytest.approx(25 * 4096 / 4154, rel=0.1)
    assert rows[0]["ub_gbyte_per_s"] > 5 * rows[0]["rdma_gbyte_per_s"]


def test_model_load_with_and_without_the_pool():
    spec = load_system("cloudmatrix384")
    params, rows = run_scenario("model-load", "cloudmatrix384", model_gbyte=671.0, instances=8, sample_mbyte=1)
    by = {(r["start"], r["pool"]): r for r in rows}
    obs_once = 671e9 / (spec.ems.object_storage_gbyte_per_s * 1e9)
    assert by[("cold", "no")]["total_s"] == pytest.approx(8 * obs_once, rel=1e-3)  # every instance reads it
    assert by[("cold", "yes")]["object_storage_s"] == pytest.approx(obs_once, rel=1e-3)  # read once
    assert by[("warm", "yes")]["total_s"] < by[("cold", "yes")]["total_s"] < by[("cold", "no")]["total_s"]
    # From the pool, each die's 7 GB shard at the simulated per-die rate.
    shard = 671e9 / params["dies_per_instance"]
    assert by[("warm", "yes")]["total_s"] == pytest.approx(
        shard / (params["pool_read_gbyte_per_s_per_die"] * 1e9), rel=0.02)
