"""GQA/MHA attention on one die (cmemu.die.gqa): traffic, work and timing by hand on small shapes."""
from __future__ import annotations

import pytest

from cmemu.die.gqa import decode_split, gqa_attention_cost, gqa_prefill_attention_cost
from cmemu.die.model import DieModel
from cmemu.spec import load_system


@pytest.fixture(scope="module")
def model():
    return DieModel.of(load_system("mini").die)


def test_decode_traffic_and_work_by_hand(model):
    # One request, 128 cached positions, 8 query heads on 1 K/V head of 128 values, one core:
    # K and V read from HBM once (128 x 2 x 128 values, bf16), the 8 heads' outputs written.
    c = gqa_attention_cost(model, 1, 128, 8, 1, 128, cores=1)
    assert c.hbm_read_byte == 128 * 2 * 128 * 2
    assert c.hbm_write_byte == 8 * 128 * 2
    assert c.macs == 8 * 128 * (128 + 128)  # Q K^T and P V per head and position
    assert (c.aic_cores, c.aiv_cores) == (1, 2) and not c.phases  # one work item: no split
    # MTP: 2 queries per request share its K/V reads; 4 tokens are 2 requests of 2 K/V heads.
    c = gqa_attention_cost(model, 4, 1024, 16, 2, 64, cores=8, queries_per_request=2)
    assert c.macs == 4 * 16 * 1024 * 2 * 64
    tiles = c.phases[0]
    assert tiles.hbm_read_byte == 2 * 2 * 1024 * 2 * 64 * 2
    assert c.hbm_write_byte == 4 * 16 * 64 * 2
    with pytest.raises(ValueError, match="multiple of kv_heads"):
        gqa_attention_cost(model, 1, 128, 8, 3, 128)


def test_grouped_heads_read_their_kv_once(model):
    # 8 query heads on 1 K/V head read an eighth of what 8 K/V heads (MHA) read.
    g = gqa_attention_cost(model, 4, 2048, 8, 1, 128, cores=8)
    mha = gqa_attention_cost(model, 4, 2048, 8, 8, 128, cores=8)
    kv = lambda c: c.phases[0].hbm_read_byte if c.phases else c.hbm_read_byte
    assert kv(mha) == 8 * kv(g) == 8 * 4 * 2048 * 2 * 128 * 2
    assert mha.duration_ps > 3 * g.duration_ps


def test_paged_kv_costs_a_copy_per_page(model):
    # The same K/V in 128-position pages: MTE2 loads K and V of each page apart, one start-up
    # each. 1 request, 1 K/V head, 256 positions on one core: one block of 2 pages, 4 copies.
    import cmemu.die.gqa as gqa

    paged = gqa_attention_cost(model, 1, 256, 8, 1, 128, cores=1)
    try:
        gqa.PAGE_POSITIONS = 256
        whole = gqa_attention_cost(model, 1, 256, 8, 1, 128, cores=1)
    finally:
        gqa.PAGE_POSITIONS = 128
    extra = paged.pipe_busy_cycles["AIC.MTE2"] - whole.pipe_busy_cycles["AIC.MTE2"]
    assert extra == 2 * model.die.mte2_startup_cycles  # 4 copies instead of 2
    assert paged.hbm_read_byte == whole.hbm_read_byte


def test_memory_bound_decode_takes_its_hbm_time(model):
    # 16 requests x 8 K/V heads (MHA) x 4096 positions: 268 MB of K/V, a few rows per item: the
    # op takes the HBM's time for its bytes (the model's achieved read rate), plus at most 10%
    # (the pipeline's start and end, the output).
    c = gqa_attention_cost(model, 16, 4096, 8, 8, 128, cores=24)
    hbm_cycles = c.hbm_read_byte / model.hbm_read_byte_per_cycle
    assert c.hbm_read_byte == 16 * 8 * 4096 * 2 * 128 * 2
    assert 1.0 <= c.duration_cycles / hbm_cycles <= 1.1


def test_few_items_are_split_along_the_kv_length(model):
    # IFA's rule: cores // items splits, fewer while a split would hold under 512 positions.
    assert decode_split(1, 4096, 24) == 8 and decode_split(24, 4096, 24) == 1
    assert decode_split(5, 4096, 24) == 4 and decode_split(1, 600, 24) == 1
    # One request, one K/V head: one work item for 24 cores, its 4,096 positions in 8 splits
    # of 512 on 8 cores, then a combine of the partials.
    one = gqa_attention_cost(model, 1, 4096, 8, 1, 128, cores=1)
    split = gqa_attention_cost(model, 1, 4096, 8, 1, 128, cores=24)
    assert [p.op for p in split.phases] == ["gqa_attention.tiles", "gqa_attention.combine"]
    assert split.phases[0].aic_cores == 8
    assert split.phases[0].hbm_read_byte == one.hbm_read_byte  # each block still read once
    assert split.duration_ps < one.duration_ps / 2
    assert split.macs == one.macs


def test_native_kernels_match_the_python_references(model):
    for args, kw in (((2, 1024, 16, 2, 64), {"cores": 8}), ((4, 300, 8, 8, 128), {"queries_per_request": 2})):
        assert gqa_attention_cost(model, *args, **kw) == gqa_attention_cost(model, *args, native=False, **kw)
    assert gqa_prefill_attention_cost(model, 200, 300, 4, 2, 64) == \
        gqa_prefill_attention_cost(model, 200, 300, 4, 2, 64, native=False)


def test_prefill_by_hand(model):
    # 3 new tokens after a prefix of 2: rows see 3, 4 and 5 positions; 2 query heads on one
    # K/V head, 128 values: the K/V of the 5 positions come from HBM once (the second head
    # finds them in L2).
    c = gqa_prefill_attention_cost(model, 3, 5, 2, 1, 128)
    assert c.macs == 2 * (3 + 4 + 5) * 2 * 128
    assert c.hbm_read_byte == 5 * 2 * 128 * 2
    assert c.l2_hit_byte == 5 * 2 * 128 * 2
    # Causal over 600 tokens, 4 heads on 2 K/V heads of 64: the lower triangle is the work, each
    # K/V head's positions are read from HBM once, the output in 5 query blocks of 128 rows.
    c = gqa_prefill_attention_cost(model, 600, 600, 4, 2, 64)
    assert c.macs == 4 * (600 * 601 // 2) * 2 * 64
    assert c.hbm_read_byte == 2 * 600 * 2 * 64 * 2
    assert c.hbm_write_byte == 4 * 5 * 128 * 64 * 2
    # A reused prefix of 400 positions: 600 x 400 more pairs per head, and more time.
    p = gqa_prefill_attention_cost(model, 600, 1000, 4, 2, 64)
    assert p.macs == c.macs + 4 * 600 * 400 * 2 * 64 and p.duration_ps > c.duration_ps
    # Half the cores, compute-bound (one K/V head per query head, 2048 tokens): about twice the time.
    full = gqa_prefill_attention_cost(model, 2048, 2048, 24, 24, 128)
    half = gqa_prefill_attention_cost(model, 2048, 2048, 24, 24, 128, cores=12)
    assert half.duration_ps / full.duration_ps == pytest.approx(2.0, rel=0.15)
    with pytest.raises(ValueError, match="tokens <= kv_len"):
        gqa_prefill_attention_cost(model, 8, 4, 2, 1, 64)


def test_gqa_ops_in_a_trace_take_the_die_models_time(tmp_path):
    import json

    from cmemu.run import run_trace

    attrs = {"cmemu.op": "gqa_attention", "cmemu.tokens": 8, "cmemu.kv_len": 512, "cmemu.heads": 16,
             "cmemu.kv_heads": 4, "cmemu.head_dim": 128, "cmemu.cores": 8}
    pre = {"cmemu.op": "gqa_prefill_attention", "cmemu.tokens": 256, "cmemu.kv_len": 256, "cmemu.heads": 4,
           "cmemu.kv_heads": 2, "cmemu.head_dim": 128}
    doc = {"schema": "cmemu.trace", "version": 1, "time_unit": "ns", "nodes": [
        {"id": 0, "name": "dec", "type": "COMP", "rank": 0, "attrs": attrs},
        {"id": 1, "name": "pre", "type": "COMP", "rank": 1, "attrs": pre}]}
    p = tmp_path / "t.json"
    p.write_text(json.dumps(doc))
    r = run_trace(p, system="mini", output=tmp_path / "t.h5", progress=False)
    m = DieModel.of(r.spec.die)
    want = [gqa_attention_cost(m, 8, 512, 16, 4, 128, cores=8).duration_ps,
            gqa_prefill_attention_cost(m, 256, 256, 4, 2, 128).duration_ps]
    assert list(r.op_end_ps - r.op_start_ps) == want
    bad = dict(attrs, **{"cmemu.kv_heads": 3})
    p.write_text(json.dumps({**doc, "nodes": [{"id": 0, "name": "x", "type": "COMP", "rank": 0, "attrs": bad}]}))
    from cmemu.errors import TraceError

    with pytest.raises(TraceError, match="cmemu.kv_heads"):
        run_trace(p, system="mini", output=tmp_path / "u.h5", progress=False)
