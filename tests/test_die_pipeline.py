"""The die model's pipes and tile schedules: one tile's cycles by hand, double buffering, and
every Numba kernel against its pure-Python reference."""
import numpy as np
import pytest

from cmemu.die.gemm import gemm_accesses, gemm_cost, gemm_instructions, gemm_program, plan
from cmemu.die.l2 import lru_miss_byte, lru_run
from cmemu.die.model import DieModel, cost_params
from cmemu.die.pipeline import Program, run_program
from cmemu.die.template import Template, expand
from cmemu.spec import load_system


@pytest.fixture(scope="module")
def model():
    return DieModel.of(load_system("mini").die)


def cdiv(a, b):
    return -(-a // b)


def test_one_gemm_tile_by_hand(model):
    # One 128 x 160 x 192 int8 tile on one AIC: one L1 chunk, one k-step, nothing to overlap.
    d = model.die
    m, n, k = 128, 160, 192
    t = plan(model, m, n, k, 1, "int8", tile_m=m, tile_n=n)
    assert (t.bk, t.kl1, t.accumulators) == (192, 192, 1)
    # Both chunks miss (first touch): the die's HBM fetches A, then B, into L2 at its achieved
    # rate; MTE2 copies each from L2 once it has arrived (HBM latency), at the core's own rate.
    hbm = model.hbm_read_milli_byte_per_cycle()
    fetch_a = cdiv(m * k * 1000, hbm)
    fetch_b = cdiv(k * n * 1000, hbm)
    a_busy = d.mte2_startup_cycles + cdiv(m * k, d.mte2_byte_per_cycle)
    b_busy = d.mte2_startup_cycles + cdiv(k * n, d.mte2_byte_per_cycle)
    a_start = fetch_a + d.hbm_read_latency_cycles
    b_start = max(a_start + a_busy, fetch_a + fetch_b + d.hbm_read_latency_cycles)
    b_ready = b_start + b_busy + d.l2_hit_latency_cycles
    mte1 = 2 * d.mte1_startup_cycles + cdiv(m * k, d.mte1_l0a_byte_per_cycle) + cdiv(k * n, d.mte1_l0b_byte_per_cycle)
    cube = d.cube_startup_cycles + (m // 16) * (n // 16) * (k // 32)  # int8: 16 x 32 x 16 per cycle
    fix = d.fixpipe_startup_cycles + cdiv(m * n * 4, d.fixpipe_byte_per_cycle)  # int32 accumulators
    total = b_ready + mte1 + cube + fix + d.l2_hit_latency_cycles  # output written into L2
    c = gemm_cost(model, m, n, k, 1, "int8", cores=1, tile_m=m, tile_n=n)
    assert c.duration_cycles == total
    assert c.pipe_busy_cycles == {"AIC.MTE2": a_busy + b_busy, "AIC.MTE1": mte1, "AIC.CUBE": cube, "AIC.FIXP": fix}
    assert c.macs == m * n * k
    assert c.hbm_read_byte == m * k + k * n and c.hbm_write_byte == m * n * 2


def _chain(n, a, b, depth, native):
    """n blocks of load (a cycles) then compute (b cycles); a load may start when the compute of
    the block ``depth`` back has freed its buffer."""
    tpl = Template(2)
    ld = tpl.add(0, a)
    ex = tpl.add(1, b, deps=[ld])
    tpl.deps[ld].append((ex, depth))
    fn = expand if native else expand.py_func
    zeros = np.zeros((n, 0), dtype=np.int64)
    prog = fn(*tpl.arrays(), 2, np.zeros(n, dtype=np.int64), zeros, zeros, 1)
    _, finish, busy = run_program(*prog, 2, native=native)
    return int(finish.max()), list(busy)


@pytest.mark.parametrize("native", [True, False])
def test_double_buffering_overlaps_the_pipes(native):
    n, a, b = 10, 300, 200
    single, busy = _chain(n, a, b, 1, native)
    double, _ = _chain(n, a, b, 2, native)
    assert single == n * (a + b)  # each load waits for the previous compute: no overlap
    assert double == n * a + b  # loads back to back; computes hide behind them
    assert busy == [n * a, n * b]
    # Balanced pipes: double buffering halves the time (plus one stage).
    assert _chain(n, a, a, 2, native)[0] == (n + 1) * a


@pytest.mark.parametrize("native", [True, False])
def test_latency_overlaps_the_next_instruction_but_delays_its_consumer(native):
    p = Program(2)
    x = p.add(0, 0, busy=100, lat=50)
    p.add(0, 0, busy=100, lat=50)
    p.add(0, 1, busy=10, deps=[x])
    start, finish, busy = p.run(1, native=native)
    assert list(start) == [0, 100, 150] and list(finish) == [150, 250, 160]


def _random_program(rng, n, pipes):
    pipe = rng.integers(0, pipes, n).astype(np.int32)
    busy = rng.integers(0, 500, n).astype(np.int64)
    lat = rng.integers(0, 300, n).astype(np.int64)
    deps = [rng.choice(i, size=min(i, rng.integers(0, 4)), replace=False) if i else np.zeros(0, int) for i in range(n)]
    ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum([len(d) for d in deps], out=ptr[1:])
    idx = np.concatenate(deps).astype(np.int64)
    return pipe, busy, lat, ptr, idx


@pytest.mark.parametrize("seed", range(3))
def test_run_program_native_matches_reference(seed):
    args = _random_program(np.random.default_rng(seed), 400, 7)
    for a, b in zip(run_program(*args, 7), run_program(*args, 7, native=False)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("seed", range(3))
def test_lru_native_matches_reference(seed):
    rng = np.random.default_rng(seed)
    obj = rng.integers(0, 50, 2000).astype(np.int64)
    size = rng.integers(1, 100, 2000).astype(np.int64)
    np.testing.assert_array_equal(lru_run(obj, size, 1500, 50), lru_run.py_func(obj, size, 1500, 50))


@pytest.mark.parametrize("seed", range(3))
def test_lru_miss_byte_native_matches_reference(seed):
    rng = np.random.default_rng(seed)
    obj = rng.integers(0, 50, 2000).astype(np.int64)
    size = rng.integers(1, 100, 2000).astype(np.int64)
    np.testing.assert_array_equal(lru_miss_byte(obj, size, 1500, 50), lru_miss_byte.py_func(obj, size, 1500, 50))
    # Objects read at one size: misses are lru_run's, in bytes.
    fixed = rng.integers(1, 100, 50).astype(np.int64)[obj]
    hits = lru_run(obj, fixed, 1500, 50)
    np.testing.assert_array_equal(lru_miss_byte(obj, fixed, 1500, 50), np.where(hits, 0, fixed))


def test_lru_miss_byte_by_hand():
    # Capacity 10: object 0 read 4 B (miss 4), then 7 B (3 beyond its 4), then 5 B (hit), object
    # 1 read 6 B evicts it (7 + 6 > 10), and object 0 misses whole again.
    miss = lru_miss_byte(np.array([0, 0, 0, 1, 0]), np.array([4, 7, 5, 6, 7]), 10, 2)
    assert list(miss) == [4, 3, 0, 6, 7]


def test_lru_by_hand():
    # Capacity 3 objects of size 1: 0 1 2 0 (hit) 3 (evicts 1) 0 (hit) 1 (miss: was evicted).
    hits = lru_run(np.array([0, 1, 2, 0, 3, 0, 1]), np.ones(7, dtype=np.int64), 3, 4)
    assert list(hits) == [False, False, False, True, False, True, False]


@pytest.mark.parametrize("shape", [(1, 300, 500, 1000, "int8", 5), (3, 256, 304, 640, "bf16", 4)])
def test_gemm_kernels_native_match_reference(model, shape):
    g, m, n, k, dtype, cores = shape
    ta = plan(model, m, n, k, g, dtype).as_array()
    acc_n, acc_r = gemm_accesses(ta, cores), gemm_accesses.py_func(ta, cores)
    for a, b in zip(acc_n, acc_r):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    hits = lru_run(acc_n[0], acc_n[1], 200_000, acc_n[2])
    cp = cost_params(model)
    n = gemm_instructions(plan(model, m, n, k, g, dtype))
    outs = []
    for fn in (gemm_program, gemm_program.py_func):
        bufs = (np.zeros(n, np.int32), np.zeros(n, np.int64), np.zeros(n, np.int64), np.zeros(n + 1, np.int64),
                np.zeros(3 * n, np.int64))
        outs.append((fn(ta, cores, hits, cp, *bufs), bufs))
    assert outs[0][0] == outs[1][0]
    for a, b in zip(outs[0][1], outs[1][1]):
        np.testing.assert_array_equal(a, b)
    assert gemm_cost(model, m, n, k, g, dtype, cores) == gemm_cost(model, m, n, k, g, dtype, cores, native=False)


def test_attention_and_vector_native_match_reference(model):
    from cmemu.die.kernels import generic_cost, vector_cost
    from cmemu.die.mla import MLAShape, mla_decode_cost

    shape = MLAShape(heads=16)
    assert mla_decode_cost(model, 4, 700, shape, cores=3) == mla_decode_cost(model, 4, 700, shape, cores=3, native=False)
    assert vector_cost(model, "swiglu", 50, 3000, 5) == vector_cost(model, "swiglu", 50, 3000, 5, native=False)
    assert generic_cost(model, "aiv", 1e8, 1 << 20, "bf16", 6) == generic_cost(model, "aiv", 1e8, 1 << 20, "bf16", 6,
                                                                              native=False)


from hypothesis import given, settings, strategies as st  # noqa: E402


@settings(max_examples=15, deadline=None)
@given(groups=st.integers(1, 3), m=st.integers(1, 400), n=st.integers(1, 400), k=st.integers(1, 1500),
       cores=st.integers(1, 24), dtype=st.sampled_from(["int8", "bf16"]), l2_mib=st.sampled_from([1, 192]))
def test_gemm_native_matches_reference_on_any_shape(groups, m, n, k, cores, dtype, l2_mib):
    mod = DieModel.of(load_system("mini", [f"die.l2_cache_mib={l2_mib}"]).die)
    assert gemm_cost(mod, m, n, k, groups, dtype, cores) == gemm_cost(mod, m, n, k, groups, dtype, cores, native=False)


@settings(max_examples=10, deadline=None)
@given(tokens=st.integers(1, 6), kv=st.integers(1, 700), heads=st.sampled_from([8, 16, 128]), cores=st.integers(1, 24))
def test_mla_attention_native_matches_reference(model, tokens, kv, heads, cores):
    from cmemu.die.mla import MLAShape, mla_attention_cost

    shape = MLAShape(heads=heads)
    assert (mla_attention_cost(model, tokens, kv, shape, cores=cores)
            == mla_attention_cost(model, tokens, kv, shape, cores=cores, native=False))


@settings(max_examples=10, deadline=None)
@given(tokens=st.integers(1, 700), prefix=st.integers(0, 700), heads=st.sampled_from([1, 4, 16]),
       cores=st.integers(1, 24))
def test_mla_prefill_attention_native_matches_reference(model, tokens, prefix, heads, cores):
    from cmemu.die.mla import MLAShape, mla_prefill_attention_cost

    shape = MLAShape(heads=heads)
    assert (mla_prefill_attention_cost(model, tokens, tokens + prefix, shape, cores=cores)
            == mla_prefill_attention_cost(model, tokens, tokens + prefix, shape, cores=cores, native=False))
