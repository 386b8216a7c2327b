"""The die model's per-pipe busy intervals (/tasks of COMP ops, layout v4), the HBM stack split of
an op's bytes, and the pairing of MoE dispatches with their combines."""
import warnings

import numpy as np
import pytest

from cmemu.die.gemm import gemm_cost
from cmemu.die.hbm import HBMParams, map_granules, stack_bytes, stack_of_pc
from cmemu.die.intervals import op_pipe_intervals
from cmemu.die.kernels import vector_cost
from cmemu.die.mla import mla_decode_cost
from cmemu.die.model import DieModel
from cmemu.die.pipeline import MAX_INTERVALS_PER_PIPE, merge_intervals
from cmemu.vocab import PIPE_CODE
from cmemu.run import moe_pairs, pipe_interval_tasks, run_trace
from cmemu.spec import load_system
from conftest import TRACES

DECODE = TRACES / "deepseek_r1_decode_mini_2layers.json"


@pytest.fixture(scope="module")
def model():
    return DieModel.of(load_system("mini").die)


@pytest.fixture(scope="module")
def decode():
    return run_trace(DECODE, progress=False)


# -- merging ------------------------------------------------------------------------------------
def test_merge_intervals_by_hand():
    s, e = merge_intervals([0, 5, 20, 30, 31, 50], [10, 12, 25, 30, 40, 60], 0)
    # [0,10)+[5,12) -> [0,12); [30,30) is empty; [31,40); touching would merge too.
    assert s.tolist() == [0, 20, 31, 50] and e.tolist() == [12, 25, 40, 60]
    # Down to two: the smallest gaps (20-12=8, 31-25=6) close first; the largest (50-40) stays.
    s, e = merge_intervals([0, 5, 20, 30, 31, 50], [10, 12, 25, 30, 40, 60], 2)
    assert s.tolist() == [0, 50] and e.tolist() == [40, 60]
    s, e = merge_intervals([0, 10], [10, 20], 5)
    assert s.tolist() == [0] and e.tolist() == [20]


# -- from the tile schedule ------------------------------------------------------------------------
def test_gemm_intervals_cover_the_busy_time_and_no_more_than_the_schedule(model):
    c = gemm_cost(model, 96, 7168, 2048, 1, "int8")
    assert set(c.pipe_intervals) == {"AIC.MTE2", "AIC.MTE1", "AIC.CUBE", "AIC.FIXP"}
    for key, (s, e) in c.pipe_intervals.items():
        assert 1 <= s.size <= MAX_INTERVALS_PER_PIPE
        assert np.all(e > s) and np.all(s[1:] > e[:-1])  # sorted, disjoint
        assert s[0] >= 0 and e[-1] <= c.schedule_cycles
        # At least one core busy covers at least the busiest core's time, at least the mean.
        assert (e - s).sum() >= c.pipe_busy_cycles[key] / c.aic_cores
    # The cube cannot start before MTE2 has loaded the first operands, nor FixPipe before the cube.
    iv = c.pipe_intervals
    assert iv["AIC.MTE2"][0][0] < iv["AIC.CUBE"][0][0] < iv["AIC.FIXP"][0][0]


def test_vector_op_has_the_pipes_of_the_aiv(model):
    c = vector_cost(model, "rmsnorm", 96, 7168)
    assert set(c.pipe_intervals) == {"AIV.MTE2", "AIV.VECTOR", "AIV.MTE3"}
    iv = op_pipe_intervals(c)
    assert set(iv) == {"MTE2", "VECTOR", "MTE3"}
    assert iv["MTE2"][0][0] < iv["VECTOR"][0][0] < iv["MTE3"][0][0]


def test_phases_are_laid_end_to_end_within_the_op(model):
    c = mla_decode_cost(model, 48, 4096)
    assert c.phases and not c.pipe_intervals  # the combined cost keeps its phases' intervals
    for n in (1, 4, 16):
        iv = op_pipe_intervals(c, n)
        assert {"CUBE", "VECTOR", "MTE1", "MTE2", "MTE3", "FIXP"} <= set(iv)
        for s, e in iv.values():
            assert 1 <= s.size <= n and s[0] >= 0 and e[-1] <= c.duration_cycles
            assert np.all(e >= s) and np.all(s[1:] >= e[:-1])
    # The first phase is a vector op (RMSNorm) on the AIVs: the cube waits for the first GEMM.
    iv = op_pipe_intervals(c, 16)
    assert iv["VECTOR"][0][0] < iv["CUBE"][0][0]
    first = c.phases[0]
    assert iv["CUBE"][0][0] >= first.duration_cycles


# -- in the run -------------------------------------------------------------------------------------
def test_comp_tasks_show_pipe_overlap_inside_each_op(decode):
    t = decode.tasks
    comp = np.isin(t["pipe"], [PIPE_CODE[p] for p in ("CUBE", "VECTOR", "MTE1", "MTE2", "MTE3", "FIXP")])
    op, pipe = t["op"][comp], t["pipe"][comp]
    s, e = t["start_ps"][comp], t["end_ps"][comp]
    assert np.all(s >= decode.op_start_ps[op]) and np.all(e <= decode.op_end_ps[op]) and np.all(e >= s)
    assert decode.pipe_intervals == 16
    # At most 16 per op and pipe, and some ops have several (real intervals, not one summary).
    key = op.astype(np.int64) * 8 + pipe
    counts = np.bincount(np.unique(key, return_inverse=True)[1])
    assert counts.max() <= 16 and counts.max() > 1
    # Inside an attention op, the cube and the vector unit both work at some moments.
    att = [i for i, n in enumerate(decode.lowered.op_name) if n.endswith(".attention")][0]
    sel = op == att
    cube = [(a, b) for a, b, p in zip(s[sel], e[sel], pipe[sel]) if p == PIPE_CODE["CUBE"]]
    vec = [(a, b) for a, b, p in zip(s[sel], e[sel], pipe[sel]) if p == PIPE_CODE["VECTOR"]]
    assert any(a < d and c < b for a, b in cube for c, d in vec)


def test_row_cap_lowers_the_intervals_per_op_and_says_so(decode):
    full, n = pipe_interval_tasks(decode, 16)
    assert n == 16
    cap = full["op"].size // 3
    with pytest.warns(UserWarning, match="keeps at most"):
        small, m = pipe_interval_tasks(decode, 16, max_rows=cap)
    assert m < 16 and small["op"].size <= max(cap, np.unique(full["op"]).size * 6)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        one, k = pipe_interval_tasks(decode, 1)
    assert k == 1 and np.unique(one["op"].astype(np.int64) * 8 + one["pipe"]).size == one["op"].size


# -- HBM stacks -------------------------------------------------------------------------------------
def test_stack_bytes_follow_the_interleave_granule_by_granule():
    hp = HBMParams.from_die(load_system("mini").die)
    assert hp.stacks == 4 and hp.pseudo_channels == 64
    for nbytes in (1, 511, 512, 700, 8192, 8193, 9000, 32768, 33000, 100_000):
        for base in (0, 300, 20_000):
            g = np.arange(base, base + nbytes) // hp.granule_byte
            pc, _, _ = map_granules(hp, g)
            want = np.bincount(stack_of_pc(hp, pc), minlength=hp.stacks)
            assert stack_bytes(hp, [nbytes], base)[0].tolist() == want.tolist(), (nbytes, base)
    # A streaming op of whole periods (64 PCs x 512 B) loads the stacks alike.
    assert stack_bytes(hp, [10 * 32768])[0].tolist() == [81920] * 4


# -- MoE pairs --------------------------------------------------------------------------------------
def test_each_combine_pairs_with_the_dispatch_of_its_layer_and_micro_batch(decode):
    from cmemu.trace import load_trace

    tr = load_trace(DECODE, num_ranks=decode.spec.dies)
    p = moe_pairs(tr)
    names = [n.name for n in tr.nodes]
    assert p["dispatch_op"].size == 128  # 32 ranks x (layer 1 + MTP) x 2 micro-batches
    for d, c in zip(p["dispatch_op"], p["combine_op"]):
        assert tr.nodes[d].rank == tr.nodes[c].rank
        assert names[d].removesuffix(".dispatch") == names[c].removesuffix(".combine")
    assert np.array_equal(decode.moe_pairs["dispatch_op"], p["dispatch_op"])


def test_union_kernel_matches_its_reference():
    from cmemu.die.pipeline import union_by_position

    rng = np.random.default_rng(3)
    pipe = rng.integers(0, 13, 400).astype(np.int32)  # 3 cores x 4 pipes, and pipe 12 shared
    start = rng.integers(0, 5000, 400).astype(np.int64)
    busy = rng.integers(0, 60, 400).astype(np.int64)
    a = union_by_position(pipe, start, busy, 4, 12)
    b = union_by_position.py_func(pipe, start, busy, 4, 12)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    # By hand: the union per position equals a brute-force cover of the time axis.
    for p in range(4):
        sel = (pipe < 12) & (pipe % 4 == p) & (busy > 0)
        cover = np.zeros(5100, bool)
        for s, d in zip(start[sel], busy[sel]):
            cover[s:s + d] = True
        got = np.zeros(5100, bool)
        for s, e in zip(a[1][a[0] == p], a[2][a[0] == p]):
            got[s:e] = True
        assert np.array_equal(cover, got)
