"""Every registered scenario runs from the command line (small options) and prints one JSON
document whose numbers carry their units; plus the figures of a few scenarios by hand."""
import json

import pytest
from click.testing import CliRunner
from conftest import TRACES

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
    "model-load": ["-s", "mini", "--instances", "2", "--model-gbyte", "64", "--models", "3", "--switches", "6"],
    "context-cache": ["-s", "mini", "--prompt-len", "256", "--tokens-per-npu", "128", "--reuse", "0,0.5"],
    "kv-transfer": ["--prompts", "1K", "--layers", "2"],
    "traffic": ["-s", "mini", "--load", "0.2,0.9", "--window-us", "2", "--fabric", "both"],
}

UNIT_SUFFIXES = ("_us", "_ms", "_ns", "_s", "_ps", "_byte", "_bytes", "_mbyte", "_gbyte_per_s", "_percent", "_pct",
                 "_tokens", "_per_npu", "_per_die", "_per_rank", "_blocks", "_ratio", "_x_model")


def test_every_scenario_has_small_options():
    assert set(SMALL) == set(SCENARIOS)


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_scenario_runs_and_prints_json(name):
    res = CliRunner().invoke(main, ["scenario", "run", name, *SMALL[name], "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)  # (a first compile's notice goes to stderr)
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


def test_model_load_strategies_by_hand():
    # 64 GB into 2 instances of 16 dies (one node each) of mini: 4 GB a die, in 62 blocks.
    spec = load_system("mini")
    params, tables = run_scenario("model-load", "mini", model_gbyte=64.0, instances=2, models=3, switches=6)
    start = {r["strategy"]: r for r in tables["start (all instances at once)"]}
    obs_once = 64e9 / (spec.ems.object_storage_gbyte_per_s * 1e9)
    assert start["no cache"]["cold_start_s"] == pytest.approx(2 * obs_once, abs=0.1)  # every instance reads it
    assert start["EMS"]["cold_start_s"] == pytest.approx(obs_once + start["EMS"]["warm_start_s"], abs=0.1)
    assert [start[s]["dram_used_x_model"] for s in ("no cache", "local DRAM cache", "EMS")] == [0.0, 2.0, 1.0]
    # Warm from the local cache: each node's 16 dies read their blocks from its 4 CPUs (block j
    # from CPU j mod 4), whose 160 GB/s of UB ports bind (4 KiB read responses, 28 B headers in
    # 20 B flits): the CPU with the most blocks sets the time.
    blocks = params["blocks_per_shard"]
    most = 16 * -(-blocks // spec.cpus_per_node) * params["block_mbyte"] * 1e6
    port = spec.ub.cpu_bandwidth_gbyte_per_s * 1e9 * 4096 / 4140
    assert start["local DRAM cache"]["warm_start_s"] == pytest.approx(most / port, rel=0.02)
    switching = {r["strategy"]: r for r in tables["model switching (one instance at a time)"]}
    assert switching["no cache"]["hit_rate_percent"] == 0.0
    assert switching["no cache"]["avg_switch_latency_s"] == pytest.approx(obs_once, abs=0.01)
    # 3 models: the pool (8 x 128 GB) holds them all, and is shared: a model one instance loaded
    # is a hit for the other. A node's cache is its own instance's.
    assert switching["EMS"]["models_cached_in_pool"] == 16
    assert switching["EMS"]["hit_rate_percent"] > 0
    assert switching["EMS"]["hit_rate_percent"] >= switching["local DRAM cache"]["hit_rate_percent"]
    # One instance alone reads from every socket of the pool, not only its node's: faster.
    assert switching["EMS"]["hit_latency_s"] < switching["local DRAM cache"]["hit_latency_s"]


def test_progress_line_from_the_command_only(monkeypatch):
    """A scenario's replay of a step shows `cmemu run`'s progress line on stderr when run from its
    command (once the run has taken a while: here at once), none with --quiet, from Python, or
    in a sweep (run_scenario)."""
    import io

    import cmemu.run.pipeline as pipeline
    from cmemu.run.progress import Progress

    made = []

    class Eager(Progress):
        def __init__(self, total_ops, stream=None, after_s=0.0):
            super().__init__(total_ops, stream=io.StringIO(), after_s=0.0)
            made.append(self)

    monkeypatch.setattr(pipeline, "Progress", Eager)
    monkeypatch.setattr(pipeline, "EVENTS_PER_SLICE", 1 << 10)  # several slices: the line is drawn
    res = CliRunner().invoke(main, ["scenario", "run", "decode", *SMALL["decode"], "--json"])
    assert res.exit_code == 0, res.output
    assert made and all(p.shown for p in made)
    assert "ops " in made[0].stream.getvalue() and json.loads(res.stdout)["scenario"] == "decode"
    made.clear()
    res = CliRunner().invoke(main, ["scenario", "run", "decode", *SMALL["decode"], "-q"])
    assert res.exit_code == 0 and not made
    run_scenario("decode", "mini", ep=4, tokens_per_die=8, layers=2, kv_len=256)
    assert not made
    with pytest.raises(Exception, match="no option 'quiet'"):
        run_scenario("decode", "mini", quiet=True)


@pytest.mark.parametrize("slo, largest, missing", [(50.0, 125, 126), (1e9, 96 * 64, None)])
def test_tpot_slo_search_brackets_the_answer(slo, largest, missing, monkeypatch):
    # A stand-in for the simulation whose TPOT is 0.4 ms per token per die: the SLO of 50 ms is
    # met up to 125 tokens. Before, the search stopped after 8 runs and answered 124 (125 never
    # run). With an SLO no size misses, it stops at 64x the start and says it is a lower bound.
    import cmemu.scenarios.decode as decode

    ran = []

    def fake_run_decode(spec, cfg, fabric, max_memory, model):
        ran.append(cfg.tokens_per_die)
        return {"tokens_per_die": cfg.tokens_per_die, "tpot_61_layers_extrapolated_ms": 0.4 * cfg.tokens_per_die}, {}, []

    monkeypatch.setattr(decode, "run_decode", fake_run_decode)
    params, tables = run_scenario("decode", "mini", tpot_slo=slo)
    assert params["largest_tokens_per_die_meeting_slo"] == largest
    assert params["smallest_tokens_per_die_missing_slo"] == missing
    assert params["search"].startswith("exact" if missing else "a lower bound")
    assert [r["tokens_per_die"] for r in tables["runs"]] == ran and len(set(ran)) == len(ran)
    if missing:
        assert largest in ran and missing in ran


def test_a_scenario_does_not_warn_of_the_timeline_it_does_not_write(monkeypatch, recwarn):
    # Before, every 61-layer decode step warned that /tasks keeps fewer pipe intervals per op,
    # though a scenario writes no timeline. A run from Python, whose result holds /tasks, still
    # warns.
    import warnings

    import cmemu.results.pipe_tasks as pipe_tasks
    from cmemu.run import run_trace

    monkeypatch.setattr(pipe_tasks, "MAX_PIPE_TASK_ROWS", 10)
    warnings.simplefilter("always")
    run_scenario("decode", "mini", ep=4, tokens_per_die=8, layers=2, kv_len=256)
    assert not [w for w in recwarn if pipe_tasks.PIPE_TASKS_CUT in str(w.message)]
    with pytest.warns(UserWarning, match=pipe_tasks.PIPE_TASKS_CUT):
        run_trace(TRACES / "mini_moe_layer.json", progress=False)


def test_tpot_slo_with_both_micro_batch_settings_is_one_error():
    # Before, a traceback (int('1,2')).
    res = CliRunner().invoke(main, ["scenario", "run", "decode", "-s", "mini", "--tpot-slo", "50",
                                    "--micro-batches", "1,2"])
    assert res.exit_code == 2, res.output
    assert res.stderr.splitlines() == ["cmemu: error: --tpot-slo searches with one --micro-batches setting: "
                                       "give 1 or 2, not 1,2"]


def test_tpot_slo_without_a_per_layer_time_is_one_error():
    # Before, a KeyError (--no-mtp on 2 layers: DeepSeek-R1's first 3 layers are dense, so no
    # two MoE layers to time, and no TPOT extrapolated to its 61 layers).
    res = CliRunner().invoke(main, ["scenario", "run", "decode", "-s", "mini", "-q", "--no-mtp", "--tpot-slo", "50"])
    assert res.exit_code == 2, res.output
    assert res.stderr.startswith("cmemu: error: --tpot-slo: the TPOT of all 61 layers cannot be extrapolated "
                                 "from 2 simulated layer(s)")


@pytest.mark.parametrize("argv, option", [
    (["ub-p2p", "-s", "mini", "--sizes", "64", "--a2a-dies", "32", "--a2a-bytes", "4K,8K"], "--a2a-bytes"),
    (["faults", "-s", "mini", "--a2a-bytes", "4K,8K"], "--a2a-bytes"),
    (["traffic", "-s", "mini", "--load", "0.5", "--window-us", "1", "--packet-size", "64,512"], "--packet-size"),
])
def test_a_list_where_one_size_is_taken_is_one_error(argv, option):
    # Before, a traceback (too many values to unpack).
    res = CliRunner().invoke(main, ["scenario", "run", *argv, "-q"])
    assert res.exit_code == 2, res.output
    assert res.stderr.splitlines() == [f"cmemu: error: {option} takes one size in bytes (e.g. 4K), not a list: "
                                       f"'{argv[-1]}'"]


def test_ems_beyond_the_die_model_is_one_error():
    # Before, a traceback (the die model's size limit, a ValueError) where the mla and prefill
    # scenarios give one line.
    res = CliRunner().invoke(main, ["scenario", "run", "ems", "--prompt", "24576", "--reuse", "0.9", "-q"])
    assert res.exit_code == 2, res.output
    (line,) = res.stderr.splitlines()
    assert line.startswith("cmemu: error: --prompt 24576: the prefill of 22,016 reused tokens on one die is more")
    assert line.endswith("; give a shorter --prompt")


@pytest.mark.parametrize("argv, line", [
    (["hbm", "-s", "mini", "--sizes", "64", "--window-ns", "nan"], "--window-ns must be a number > 0, got nan"),
    (["hbm", "-s", "mini", "--sizes", "64", "--window-ns", "inf"], "--window-ns must be a number > 0, got inf"),
    (["hbm", "-s", "mini", "--sizes", "64", "--window-ns", "1e7"],
     "--window-ns must be at most 200,000, got 10,000,000.0"),
    (["model-load", "-s", "mini", "--model-gbyte", "nan"], "--model-gbyte must be a number > 0, got nan"),
    (["model-load", "-s", "mini", "--instances", "2", "--block-mbyte", "nan"],
     "--block-mbyte must be a number > 0, got nan"),
])
def test_numbers_that_are_not_finite_or_too_big_are_one_error(argv, line):
    # Before: NaN accepted (hbm) or a traceback (model-load); infinity an OverflowError; 10 ms of
    # HBM streaming ran out of memory, 1 s asked for 191 GiB.
    res = CliRunner().invoke(main, ["scenario", "run", *argv, "-q"])
    assert res.exit_code == 2, res.output
    assert res.stderr.splitlines() == [f"cmemu: error: {line}"]
