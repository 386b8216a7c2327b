"""MLA decode attention as FusedInferAttentionScore's MLA template schedules it: the split of the
work over the cores (worked by hand from FIA's cost rule), one KV read for all query tokens of
a request, the FlashDecode combine's cost by hand, and time that follows the work."""
import numpy as np
import pytest

from cmemu.die.fia_mla import flash_decode_cost, plan_decode_attention
from cmemu.die.fia_split import block_cost, m_tile_rows, plan_split, s2_tile_positions
from cmemu.die.kernels import vector_cycles
from cmemu.die.mla import MLAShape, mla_attention_cost, mla_decode_cost
from cmemu.die.model import DieModel
from cmemu.spec import load_system

KV_BYTES_PER_POSITION = (512 + 64) * 2  # bf16 latent + rope


@pytest.fixture(scope="module")
def model():
    return DieModel.of(load_system("mini").die)


# -- the split -----------------------------------------------------------------------------------


def test_block_cost_and_tiles():
    assert block_cost(256, 512) == 6 * 16 + 10 * 8 == 176
    assert block_cost(128, 512) == 48 + 80
    assert block_cost(128, 100) == 48 + 10 * 2  # positions round up to 64
    assert s2_tile_positions(4096, 128) == 512
    assert s2_tile_positions(300, 128) == 384  # never past the longest request's pages
    assert s2_tile_positions(4096, 112) == 448  # a page that does not divide 512: whole pages


def test_m_tile_is_256_rows_unless_an_even_cut_avoids_flash_decode():
    assert m_tile_rows(1, 128, 24, True) == 256  # one token's 128 heads: one tile of 128 rows
    # 12 requests of 2 x 128 rows on 24 cores: lcm(12, 24) / 12 = 2 tiles of 128 rows each.
    assert m_tile_rows(12, 256, 24, True) == 128
    assert m_tile_rows(12, 256, 24, False) == 256  # not with unequal KV lengths
    assert m_tile_rows(16, 256, 24, True) == 256  # 3 tiles: 256 rows do not divide by 3
    assert m_tile_rows(24, 256, 24, True) == 256  # the requests divide the cores already


def test_one_request_of_12288_positions_uses_all_24_cores():
    # 24 blocks, no more than the cores: every block costs 10, one block per core is the only
    # plan whose busiest core costs 10 (any fewer cores put 20 on one).
    p = plan_decode_attention(1, 1, 128, 12288, 24)
    assert p.cores_used == 24 and list(p.blocks_per_core) == [1] * 24
    assert [(h.request, h.splits, h.rows) for h in p.fd_heads] == [(0, 24, 128)]


def test_one_request_of_4096_positions_is_flash_decoded_over_8_cores():
    p = plan_decode_attention(1, 1, 128, 4096, 24)
    assert p.cores_used == 8 and list(p.blocks_per_core) == [1] * 8
    assert [h.splits for h in p.fd_heads] == [8]
    # The combine: 128 rows are 16 chunks of 8, on min(16, 2 x 8) AIVs, one each.
    assert [len(v) for v in p.combine] == [1] * 16


def test_24_requests_need_no_flash_decode():
    # 192 blocks of 128 rows x 512 cost 48 + 80 = 128 each, 1024 a request. On 24 cores each
    # core's share is 1024: a whole request fits (within half a block), a second does not.
    p = plan_decode_attention(24, 1, 128, 4096, 24)
    assert p.cores_used == 24 and list(p.blocks_per_core) == [8] * 24 and not p.fd_heads
    assert list(p.cost_per_core) == [1024] * 24


def test_greedy_split_by_hand():
    # 2 requests of 3 blocks (128 rows x 512, cost 128 each; 768 in all) on up to 4 cores; the
    # core counts tried are round(sqrt(6)) = 3 and 4.
    # 3 cores: core 0's share 256: request 0 (384) is more than 256 + 64, so blocks: 128, 256
    # (256 <= 256 + 64), not 384. Core 1 (share 512 / 2): the rest of request 0 (128), then a
    # block of request 1 (256 <= 320). Core 2 takes the rest: [2, 2, 2], at most 256.
    # 4 cores: core 0 as before (256 <= 192 + 64), core 1 (share 170) the rest of request 0 only
    # (256 > 234), core 2 two blocks, core 3 one: [2, 1, 2, 1], also at most 256: the tie keeps 3.
    p = plan_split([1536, 1536], 128, 4, 128)
    assert list(p.blocks_per_core) == [2, 2, 2] and list(p.cost_per_core) == [256] * 3
    assert [(h.request, h.splits) for h in p.fd_heads] == [(0, 2), (1, 2)]
    # SplitFD: 32 chunks of load 2 on min(32, 2 x 3) = 6 AIVs; an AIV takes a chunk while its
    # load 2 is at most twice the room under the mean still to share (64 / 6 = 10.67 first):
    # 5 chunks (10; 2 > 2 x 0.67), then 54 / 5 = 10.8: 5, then 44 / 4 = 11: 6 (2 <= 2 x 1), ...
    assert [len(v) for v in p.combine] == [5, 5, 6, 5, 6, 5]


def test_split_is_contiguous_and_covers_every_block():
    p = plan_split([700, 4096, 1, 2500, 900], 256, 7, 128)
    assert p.starts[0] == 0 and p.starts[-1] == len(p.request) and np.all(np.diff(p.starts) >= 1)
    order = list(zip(p.request, p.m_tile, p.s2_tile))
    assert order == sorted(order)
    assert int(p.positions.sum()) == 700 + 4096 + 1 + 2500 + 900  # 256 rows: one M tile per request
    assert set(p.rows.tolist()) == {256}


# -- the schedule ----------------------------------------------------------------------------------


def test_two_query_tokens_of_a_request_read_its_kv_once(model):
    one = mla_attention_cost(model, 1, 4096)
    mtp = mla_attention_cost(model, 2, 4096, queries_per_request=2)
    two_requests = mla_attention_cost(model, 2, 4096)
    kv = 4096 * KV_BYTES_PER_POSITION
    assert one.hbm_read_byte == kv and mtp.hbm_read_byte == kv
    assert two_requests.hbm_read_byte == 2 * kv
    assert mtp.macs == 2 * one.macs == two_requests.macs
    # 256 rows in one M tile: one work item per KV tile, so the same blocks as one token.
    p = plan_decode_attention(1, 2, 128, 4096, 24)
    assert set(p.rows.tolist()) == {256} and len(p.request) == 8


def test_tokens_must_be_whole_requests(model):
    with pytest.raises(ValueError, match="multiple of cmemu.queries_per_request"):
        mla_attention_cost(model, 3, 1024, queries_per_request=2)


def test_flash_decode_combine_by_hand(model):
    # 1 request x 4096 on 8 cores: one split row of 128 rows and 8 splits; 16 AIVs combine one
    # 8-row chunk each. Per chunk: 2 x 8 LSE copies of 8 rows x 32 B, 8 partials of 8 x 512
    # fp32 (16 KiB), one output of 8 x 512 bf16.
    d = model.die
    p = plan_decode_attention(1, 1, 128, 4096, 24)
    c = flash_decode_cost(model, p)
    assert c.aiv_cores == 16 and c.aic_cores == 0
    assert c.l2_hit_byte == 16 * (16 * 8 * 32 + 8 * 16384)
    assert c.hbm_write_byte == 128 * 512 * 2 and c.hbm_read_byte == 0
    lse = d.mte2_startup_cycles + -(-256 * 1000 // model.mte2_milli_byte_per_cycle(aiv=True))
    part = d.mte2_startup_cycles + -(-16384 * 1000 // model.mte2_milli_byte_per_cycle(aiv=True))
    assert c.pipe_busy_cycles["AIV.MTE2"] == 16 * (16 * lse + 8 * part)
    scale = 2 * vector_cycles(model, 64, 1) + vector_cycles(model, 8 * 64, 6)
    vec = scale + vector_cycles(model, 4096, 1) + 7 * vector_cycles(model, 4096, 2) + vector_cycles(model, 4096, 1)
    assert c.pipe_busy_cycles["AIV.VECTOR"] == 16 * vec
    store = d.mte3_startup_cycles + 8192 // d.mte3_byte_per_cycle
    assert c.pipe_busy_cycles["AIV.MTE3"] == 16 * store
    # MTE2 is the bottleneck: the barrier, every load back to back, then the last partial's
    # latency, its weighted add, the cast and the store.
    lat = model.l2_hit_latency_cycles
    flag = d.cross_core_flag_latency_cycles
    assert c.duration_cycles == (flag + 16 * lse + 8 * part + lat + vector_cycles(model, 4096, 2)
                                 + vector_cycles(model, 4096, 1) + store + lat)
    # The op: the tiles, then the combine, as phases.
    op = mla_attention_cost(model, 1, 4096)
    assert [ph.op for ph in op.phases] == ["mla_attention.tiles", "mla_attention.fd_combine"]
    assert op.duration_cycles == sum(ph.duration_cycles for ph in op.phases)
    assert op.phases[1] == c


def test_no_flash_decode_no_combine(model):
    c = mla_attention_cost(model, 24, 1024)
    assert not c.phases and c.op == "mla_attention" and c.aic_cores == 24


def test_time_follows_the_kv_work_not_the_token_count(model):
    # 4 and 12 requests at KV 4096 on 16 AIC: 32 and 96 blocks, 2 and 6 per core (both split).
    # Cube-bound tiles of the same cost: the time grows with the work, not flat.
    four = mla_attention_cost(model, 4, 4096, cores=16)
    twelve = mla_attention_cost(model, 12, 4096, cores=16)
    assert plan_decode_attention(4, 1, 128, 4096, 16).cores_used == 16
    assert 2.0 < twelve.duration_ps / four.duration_ps < 3.0
    assert twelve.macs == 3 * four.macs


def test_attention_pipes_overlap_and_bounds(model):
    c = mla_attention_cost(model, 48, 4096, cores=16, queries_per_request=2)
    b = c.pipe_busy_cycles
    # 24 requests of 256 rows: the cube does 256 x 512 x (576 + 512) MACs per KV tile ...
    assert c.macs == 24 * 4096 * 256 * (576 + 512)
    assert b["AIC.CUBE"] * 4096 >= c.macs
    # ... and it is the busiest pipe, kept busy most of the op.
    per_core = {k: v / (c.aic_cores if k.startswith("AIC") else c.aiv_cores) for k, v in b.items()}
    assert max(per_core, key=per_core.get) == "AIC.CUBE"
    assert per_core["AIC.CUBE"] > 0.8 * c.duration_cycles
    assert c.hbm_read_byte == 24 * 4096 * KV_BYTES_PER_POSITION
    assert c.hbm_write_byte == 48 * 128 * 512 * 2


def test_int8_sizes(model):
    c = mla_attention_cost(model, 8, 1024, dtype="int8", cores=8)
    assert c.hbm_read_byte == 8 * 1024 * (512 + 64 * 2)  # int8 latent, bf16 rope
    assert c.cube_peak_macs_per_cycle == model.macs_per_cycle("int8")
    # IFA's split (int8): MTP tokens are units of their own, each reading the KV; on one core,
    # one after the other, the second read hits the L2.
    mtp = mla_attention_cost(model, 8, 1024, dtype="int8", cores=8, queries_per_request=2)
    assert mtp.hbm_read_byte == 4 * 1024 * (512 + 64 * 2)
    assert mtp.l2_hit_byte - c.l2_hit_byte > 0


def test_ifa_split_by_hand():
    from cmemu.die.fia_split import plan_split_ifa

    # One request of 4096 on 24 cores: FlashDecode (1 <= 0.5 x 24, 4096 >= 2048); 24 parts would
    # be 170 positions, fewer while under 512: 8 parts of 512, KV tile 256 (two per part).
    p = plan_split_ifa(1, 1, 128, 4096, 24, 128)
    assert p.cores_used == 8 and list(p.blocks_per_core) == [2] * 8 and p.s2_base == 256
    assert [(h.request, h.splits) for h in p.fd_heads] == [(0, 8)] and [len(v) for v in p.combine] == [16]
    # 13 requests (more than 0.5 x 24): no FlashDecode, one request per core on 13 cores.
    p = plan_split_ifa(13, 1, 128, 4096, 24, 128)
    assert p.cores_used == 13 and list(p.blocks_per_core) == [8] * 13 and not p.fd_heads
    # MTP: never FlashDecode; 24 requests x 2 tokens = 48 units on 16 cores, 3 each.
    p = plan_split_ifa(24, 2, 128, 4096, 16, 128)
    assert p.cores_used == 16 and list(p.blocks_per_core) == [3 * 8] * 16 and set(p.rows.tolist()) == {128}


@pytest.mark.parametrize("tokens,kv,q,heads,cores,dtype", [(1, 4096, 1, 128, 24, "bf16"), (6, 700, 2, 128, 5, "bf16"),
                                                           (5, 300, 1, 16, 3, "bf16"), (12, 1500, 3, 64, 7, "bf16"),
                                                           (2, 4096, 1, 128, 24, "int8")])
def test_native_matches_reference(model, tokens, kv, q, heads, cores, dtype):
    a = mla_attention_cost(model, tokens, kv, MLAShape(heads=heads), dtype, cores, queries_per_request=q)
    b = mla_attention_cost(model, tokens, kv, MLAShape(heads=heads), dtype, cores, queries_per_request=q,
                           native=False)
    assert a == b
    for (ka, (sa, ea)), (kb, (sb, eb)) in zip(sorted(a.pipe_intervals.items()), sorted(b.pipe_intervals.items())):
        assert ka == kb
        np.testing.assert_array_equal(sa, sb)
        np.testing.assert_array_equal(ea, eb)


def test_expand_interleaved_native_matches_reference():
    from cmemu.die.template import Template, expand_interleaved

    tpl = Template(3, shared_pipes=1)
    a = tpl.add(0, 5, 2, name="a")
    b = tpl.add(3, 7, 1, deps=[a, (a, 1)], name="shared")
    tpl.add(1, 3, 0, deps=[b, (b, 2)], variable=True)
    tpl.add(2, 0, 4, deps=[(a, 1)])
    clusters = np.array([0, 1, 2, 0, 1, 0, 2], dtype=np.int64)
    rounds = np.array([0, 0, 0, 1, 1, 2, 1], dtype=np.int64)
    order = np.lexsort((clusters, rounds))
    clusters, rounds = clusters[order], rounds[order]
    vb = np.arange(7, dtype=np.int64).reshape(7, 1) + 1
    vl = np.zeros((7, 1), dtype=np.int64)
    nat = expand_interleaved(*tpl.arrays(), 3, clusters, rounds, vb, vl, 3)
    ref = expand_interleaved.py_func(*tpl.arrays(), 3, clusters, rounds, vb, vl, 3)
    for x, y in zip(nat, ref):
        np.testing.assert_array_equal(x, y)
    pipe, busy, lat, ptr, idx = nat
    assert np.all(idx < np.repeat(np.arange(len(pipe)), np.diff(ptr)))  # every dependency points back
    # Round 0 lists instruction 0 of its three blocks, then instruction 1 of the three, ...
    assert list(pipe[:3]) == [0, 3, 6] and list(pipe[3:6]) == [9, 9, 9]


def test_mla_decode_passes_queries_per_request(model):
    full = mla_decode_cost(model, 16, 1024, cores=8, queries_per_request=2)
    att = mla_attention_cost(model, 16, 1024, cores=8, queries_per_request=2)
    assert next(p for p in full.phases if p.op == "mla_attention") == att


def test_the_mla_scenario_reports_the_split():
    from cmemu.errors import CmemuError
    from cmemu.scenarios import run_scenario

    params, rows = run_scenario("mla", "mini", tokens="8,48", kv_len="4096", heads="128", cores=16,
                                queries_per_request=2)
    assert params["queries_per_request"] == 2
    small, big = rows
    # 4 requests x 8 blocks on 16 AIC: 2 blocks per core, each request over 4 cores; 24
    # requests (192 blocks) make 12 per core without splitting one.
    assert (small["attention_aic_used"], small["flash_decode_rows"], small["flash_decode_max_splits"]) == (16, 4, 4)
    assert (big["attention_aic_used"], big["flash_decode_rows"], big["flash_decode_max_splits"]) == (16, 0, 0)
    with pytest.raises(CmemuError, match="whole number of requests"):
        run_scenario("mla", "mini", tokens="7", queries_per_request=2)


def test_decode_trace_gives_mtp_attention_its_two_queries_per_request():
    from cmemu.trace.deepseek import DecodeConfig, decode_trace

    def attention(cfg):
        doc = decode_trace(cfg, "mini", 32)
        return [n["attrs"] for n in doc["nodes"] if n["name"].endswith(".attention")]

    on = attention(DecodeConfig(ep=4, tokens_per_die=8, layers=2, mtp=True))
    assert {(a["cmemu.tokens"], a["cmemu.queries_per_request"]) for a in on} == {(4, 2)}
    off = attention(DecodeConfig(ep=4, tokens_per_die=8, layers=2, mtp=False))
    assert {a["cmemu.tokens"] for a in off} == {4} and all("cmemu.queries_per_request" not in a for a in off)
    # 10 tokens in 2 micro-batches of 5: a request's two tokens fall in different micro-batches;
    # each micro-batch's attention counts it as a whole request (3 requests of 2).
    odd = attention(DecodeConfig(ep=4, tokens_per_die=10, layers=2, mtp=True))
    assert {(a["cmemu.tokens"], a["cmemu.queries_per_request"]) for a in odd} == {(6, 2)}


def test_a_huge_decode_attention_is_refused_before_planning(model):
    import time

    t0 = time.perf_counter()
    with pytest.raises(ValueError, match="pipe instructions"):
        mla_attention_cost(model, 10**6, 4096)
    assert time.perf_counter() - t0 < 1.0
