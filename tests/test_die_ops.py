"""Operators on the die model: core scaling, L2 reuse, bounds from first principles, and operators
in traces and scenarios (the GEMM calibration against [CM] v2 table 10: tests/paper/)."""
import json

import numpy as np
import pytest

from cmemu.die.gemm import gemm_cost
from cmemu.die.kernels import vector_cost
from cmemu.die.mla import MLAShape, mla_decode_cost, mla_prefill_attention_cost, mla_prefill_cost
from cmemu.die.model import DieModel
from cmemu.spec import load_system


@pytest.fixture(scope="module")
def model():
    return DieModel.of(load_system("mini").die)


def test_half_the_cores_take_twice_as_long_when_compute_bound(model):
    # 4096^3 bf16: L2-resident operands, cube-bound (a 128 x 152 tile needs 5 cube cycles per k
    # element, MTE2 brings its 280 x 2 B in about 2.2). Not exactly 2x: the first wave's misses
    # share the HBM among more cores when there are more of them.
    full = gemm_cost(model, 4096, 4096, 4096, 1, "bf16")
    half = gemm_cost(model, 4096, 4096, 4096, 1, "bf16", cores=12)
    for c in (full, half):
        assert c.pipe_busy_cycles["AIC.CUBE"] > c.pipe_busy_cycles["AIC.MTE2"]
    assert half.duration_ps / full.duration_ps == pytest.approx(2.0, rel=0.1)
    assert half.macs == full.macs


def test_l2_reuse_makes_hbm_reads_compulsory_and_a_small_l2_does_not(model):
    g, m, n, k = 2, 2048, 2048, 2048
    compulsory = g * (m * k + k * n)  # int8: each input byte read from HBM once
    big = gemm_cost(model, m, n, k, g, "int8")
    assert big.hbm_read_byte == compulsory
    assert big.hbm_write_byte == g * m * n * 2
    small = gemm_cost(DieModel.of(load_system("mini", ["die.l2_cache_mib=1"]).die), m, n, k, g, "int8")
    assert small.hbm_read_byte > 2 * compulsory  # panels evicted before they are used again
    assert small.duration_ps > big.duration_ps


@pytest.mark.parametrize("op", ["gemm", "vector", "mla"])
def test_no_op_beats_the_hbm_or_the_cube(model, op):
    pin = model.die.hbm_pin_peak_byte_per_s
    if op == "gemm":
        c = gemm_cost(model, 4096, 4096, 4096, 1, "bf16")
    elif op == "vector":
        c = vector_cost(model, "rmsnorm", 4096, 7168)
    else:
        c = mla_decode_cost(model, 32, 2048)
    seconds = c.duration_ps * 1e-12
    assert c.hbm_byte / seconds <= pin
    assert c.cube_utilisation <= 1.0
    if c.macs:
        peak = c.cube_peak_macs_per_cycle * c.aic_cores * model.die.ai_core_clock_mhz * 1e6
        assert c.macs / seconds <= peak


def test_vector_op_is_memory_bound_by_hand(model):
    # RMSNorm of 4096 x 7168 bf16 on 48 AIV: 2 B in and 2 B out per element; 6 fp32 passes at
    # 256 B/cycle take 6 x 4 / 256 cycles per element per core, far less than the HBM share; the
    # HBM carries the reads and the writes, one after the other.
    c = vector_cost(model, "rmsnorm", 4096, 7168)
    assert c.hbm_read_byte == 4096 * 7168 * 2 and c.hbm_write_byte == 4096 * 7168 * 2
    hz = model.die.ai_core_clock_mhz * 1e6
    hbm_s = c.hbm_read_byte / (model.hbm_read_byte_per_cycle * hz) + c.hbm_write_byte / (model.hbm_write_byte_per_cycle * hz)
    assert hbm_s * 1e12 <= c.duration_ps <= 1.3 * hbm_s * 1e12 + 2e6


def test_mla_decode_heads_decide_the_bound(model):
    # The cached latent (576 values) is read once per token and reused by every head: 128 heads
    # do 8x the cube work of 16 heads on the same HBM bytes.
    many = mla_decode_cost(model, 96, 4096, MLAShape(heads=128))
    few = mla_decode_cost(model, 96, 4096, MLAShape(heads=16))
    a_many = next(p for p in many.phases if p.op == "mla_attention")
    a_few = next(p for p in few.phases if p.op == "mla_attention")
    kv = 96 * 4096 * 576 * 2
    assert a_many.hbm_read_byte == kv and a_few.hbm_read_byte == kv
    assert a_many.macs == 8 * a_few.macs
    assert a_many.cube_utilisation > 4 * a_few.cube_utilisation
    assert a_few.hbm_gbyte_per_s > a_many.hbm_gbyte_per_s


def test_mla_prefill_runs(model):
    c = mla_prefill_cost(model, 512, MLAShape(heads=16))
    att = next(p for p in c.phases if p.op == "mla_prefill_attention")
    # The fused op's attention is the attention-only op over the sequence itself (no prefix).
    assert att == mla_prefill_attention_cost(model, 512, 512, MLAShape(heads=16))
    # Causal: query row i sees positions 0..i, Q K^T (192) and P V (128) per head.
    assert att.macs == 16 * (512 * 513 // 2) * (192 + 128)
    assert c.duration_ps > att.duration_ps > 0
    assert c.macs > att.macs  # the projections


def test_mla_prefill_attention_by_hand(model):
    # 3 new tokens after a reused prefix of 2 (kv_len 5), 2 heads: the new rows see 3, 4 and 5
    # positions, 12 (query, key) pairs per head; a pair is 192 MACs for Q K^T and 128 for P V.
    c = mla_prefill_attention_cost(model, 3, 5, MLAShape(heads=2))
    assert c.macs == 2 * (3 + 4 + 5) * (192 + 128) == 7680
    # One unit per head and query block: 2 of them, on 2 clusters of 1 AIC + 2 AIV.
    assert c.op == "mla_prefill_attention" and c.aic_cores == 2 and c.aiv_cores == 4
    # Each position's K (192) and V (128) come from HBM once per head, bf16.
    assert c.hbm_read_byte == 2 * 5 * 320 * 2
    # Several query blocks of 128 and KV blocks crossing the diagonal: only the lower triangle
    # (diagonal included) counts as work, and a block read first up to the diagonal, then whole,
    # is fetched from HBM once (its first part hits in L2).
    s = MLAShape(heads=4)
    c = mla_prefill_attention_cost(model, 600, 600, s)
    assert c.macs == 4 * (600 * 601 // 2) * 320
    assert c.hbm_read_byte == 4 * 600 * 320 * 2
    assert c.hbm_write_byte == 4 * 5 * 128 * 128 * 2  # the output, in 5 query blocks of 128 rows
    # With a prefix of 400 the same 600 new tokens do 600 x 400 more pairs per head, and take longer.
    p = mla_prefill_attention_cost(model, 600, 1000, s)
    assert p.macs == c.macs + 4 * 600 * 400 * 320
    assert p.hbm_read_byte == 4 * 1000 * 320 * 2
    assert p.duration_ps > c.duration_ps
    with pytest.raises(ValueError, match="tokens <= kv_len"):
        mla_prefill_attention_cost(model, 8, 4, s)


def test_operators_in_a_trace(tmp_path):
    from cmemu.run import run_trace

    nodes = [
        {"id": 0, "type": "COMP", "rank": 0, "attrs": {"cmemu.op": "grouped_gemm", "cmemu.m": 512, "cmemu.n": 1024,
                                                      "cmemu.k": 1024, "cmemu.groups": 2, "cmemu.dtype": "int8"}},
        {"id": 1, "type": "COMP", "rank": 0, "attrs": {"cmemu.op": "rmsnorm", "cmemu.rows": 96, "cmemu.cols": 7168,
                                                      "cmemu.cores": 16}},
        {"id": 2, "type": "COMP", "rank": 1, "attrs": {"cmemu.op": "mla_decode", "cmemu.tokens": 8,
                                                      "cmemu.kv_len": 512, "cmemu.cores": 16}},
    ]
    doc = {"schema": "cmemu.trace", "version": 1, "time_unit": "ns", "system": "mini", "nodes": nodes}
    path = tmp_path / "ops.json"
    path.write_text(json.dumps(doc))
    result = run_trace(path, progress=False)
    model = DieModel.of(load_system("mini").die)
    ends = dict(zip(result.lowered.op_node_id.tolist(), np.asarray(result.op_end_ps).tolist()))
    g = gemm_cost(model, 512, 1024, 1024, 2, "int8").duration_ps
    v = vector_cost(model, "rmsnorm", 96, 7168, 16).duration_ps
    assert ends[0] == g and ends[1] == g + v
    assert ends[2] == mla_decode_cost(model, 8, 512, cores=16).duration_ps


def test_a_tile_that_does_not_fit_is_an_error_naming_the_node(tmp_path):
    from cmemu.errors import TraceError
    from cmemu.run import run_trace

    nodes = [{"id": 5, "type": "COMP", "rank": 0, "attrs": {"cmemu.op": "gemm", "cmemu.m": 512, "cmemu.n": 512,
                                                           "cmemu.k": 512, "cmemu.tile_n": 512}}]
    doc = {"schema": "cmemu.trace", "version": 1, "time_unit": "ns", "system": "mini", "nodes": nodes}
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(TraceError, match=r"node 5: field 'cmemu.op': .*L0C"):
        run_trace(path, progress=False)


@pytest.mark.parametrize("name, options", [
    ("gemm", {"shapes": "2x512x1024x1024"}),
    ("mla", {"tokens": "8", "kv_len": "512", "heads": "128,16"}),
    ("hbm", {"sizes": "64,4K"}),
])
def test_scenarios_run(name, options):
    from cmemu.scenarios import run_scenario

    params, rows = run_scenario(name, "mini", **options)
    rows = rows if isinstance(rows, list) else sum(rows.values(), [])
    assert rows
    for row in rows:
        for key, value in row.items():
            if isinstance(value, float):
                assert any(u in key for u in ("_us", "_pct", "_per_s", "_ns", "_mbyte")), key


def test_an_op_too_large_to_schedule_is_refused_quickly(tmp_path):
    import time

    from cmemu.errors import TraceError
    from cmemu.run import run_trace

    nodes = [{"id": 3, "type": "COMP", "rank": 0, "attrs": {"cmemu.op": "mla_prefill", "cmemu.tokens": 10**6}}]
    doc = {"schema": "cmemu.trace", "version": 1, "time_unit": "ns", "system": "mini", "nodes": nodes}
    path = tmp_path / "big.json"
    path.write_text(json.dumps(doc))
    t0 = time.perf_counter()
    with pytest.raises(TraceError, match=r"node 3: field 'cmemu.op': .*split the op"):
        run_trace(path, progress=False)
    assert time.perf_counter() - t0 < 5.0


def test_a_dtype_the_cube_lacks_is_an_error_naming_the_dtype(tmp_path):
    from cmemu.errors import TraceError
    from cmemu.run import run_trace

    nodes = [{"id": 4, "type": "COMP", "rank": 0, "attrs": {"num_ops": 1e9, "cmemu.dtype": "fp32"}}]
    doc = {"schema": "cmemu.trace", "version": 1, "time_unit": "ns", "system": "mini", "nodes": nodes}
    path = tmp_path / "fp32.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(TraceError, match=r"node 4: field 'cmemu.dtype': the cube has no fp32 mode"):
        run_trace(path, progress=False)


def test_mla_attention_is_the_attention_phase_of_mla_decode(model):
    from cmemu.die.mla import mla_attention_cost

    full = mla_decode_cost(model, 16, 1024, cores=8)
    att = mla_attention_cost(model, 16, 1024, cores=8)
    assert next(p for p in full.phases if p.op == "mla_attention") == att
    assert full.duration_ps > att.duration_ps


def test_the_schema_knows_the_operators():
    jsonschema = pytest.importorskip("jsonschema")
    from cmemu.trace import schema_path

    schema = json.loads(schema_path().read_text())

    def doc(attrs):
        return {"schema": "cmemu.trace", "version": 1, "time_unit": "ns",
                "nodes": [{"id": 0, "type": "COMP", "rank": 0, "attrs": attrs}]}

    good = {"cmemu.op": "grouped_gemm", "cmemu.m": 64, "cmemu.n": 64, "cmemu.k": 64, "cmemu.groups": 2,
            "cmemu.dtype": "int8", "cmemu.cores": 8}
    jsonschema.validate(doc(good), schema)
    jsonschema.validate(doc({"cmemu.op": "mla_attention", "cmemu.tokens": 8, "cmemu.kv_len": 512}), schema)
    jsonschema.validate(doc({"cmemu.op": "mla_prefill_attention", "cmemu.tokens": 8, "cmemu.kv_len": 512}), schema)
    for bad in ({**good, "num_ops": 5}, {"cmemu.op": "gemm", "cmemu.m": 1, "cmemu.n": 1},
                {"cmemu.op": "mla_prefill_attention", "cmemu.tokens": 8},
                {"cmemu.op": "rmsnorm", "cmemu.rows": 0, "cmemu.cols": 3}, {"cmemu.op": "nope"}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(doc(bad), schema)


def test_mla_prefill_attention_in_a_trace(tmp_path):
    from cmemu.errors import TraceError
    from cmemu.run import run_trace

    def run(attrs):
        nodes = [{"id": 7, "type": "COMP", "rank": 0, "attrs": {"cmemu.op": "mla_prefill_attention", **attrs}}]
        path = tmp_path / "p.json"
        path.write_text(json.dumps({"schema": "cmemu.trace", "version": 1, "time_unit": "ns", "system": "mini",
                                    "nodes": nodes}))
        return run_trace(path, progress=False)

    r = run({"cmemu.tokens": 256, "cmemu.kv_len": 384, "cmemu.heads": 16, "cmemu.cores": 8})
    model = DieModel.of(load_system("mini").die)
    assert int(np.asarray(r.op_end_ps)[0]) == mla_prefill_attention_cost(model, 256, 384, MLAShape(heads=16),
                                                                         cores=8).duration_ps
    with pytest.raises(TraceError, match=r"node 7: field 'cmemu.kv_len': .*fewer than cmemu.tokens"):
        run({"cmemu.tokens": 256, "cmemu.kv_len": 128})
