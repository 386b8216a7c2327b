"""EMS context caching inside the prefill step (issue 21): loads from a CPU's memory, the fetch
pass, the KV transfer pass, and the context-cache scenario."""
import math

import numpy as np
import pytest

from cmemu._core import make_engine
from cmemu.ems import EMSPool, prefix_keys
from cmemu.errors import CmemuError, TraceError
from cmemu.fabric import build_fabric
from cmemu.lower import lowered_from_parts
from cmemu.lower.comm import MessageTable
from cmemu.scenarios import run_scenario
from cmemu.scenarios.common import run_doc, trace_doc
from cmemu.scenarios.prefill import prefill_metrics, run_prefill
from cmemu.spec import load_system
from cmemu.topology import build_topology
from cmemu.vocab import MSG_READ, OP_KIND_RECV
from cmemu.trace.deepseek import PrefillConfig, prefill_trace
from cmemu.trace.ems_fetch import KV_LATENT, add_ems_fetch, block_bytes, ems_reuse, prefill_step
from cmemu.trace.kv_transfer import add_kv_transfer, sender_tp_rank
from cmemu.workload.deepseek import LAYERS

SMALL = dict(ep=16, attn_tp=8, requests=4, prompt_len=256)  # one request per TP group and micro-batch


def ser(nbytes, rate):
    return math.ceil(nbytes * 1e12 / rate)


def cpu_load(spec, die, cpu, nbytes, plane="ub"):
    return {"id": 0, "type": "MEM_LOAD", "rank": die,
            "attrs": {"tensor_size": nbytes, "cmemu.src_cpu": cpu, "cmemu.plane": plane}}


def test_one_packet_from_a_socket_by_hand():
    # Die 0 reads 4 KiB from CPU 1 of its node: a 28 B request (two 20 B flits) goes die -> L1 at
    # 28 GB/s and L1 -> CPU at the CPU's 160 GB/s / 7; the socket reads it from DRAM at its rate
    # (187.7 GB/s), then its memory latency; a 4,124 B response (207 flits) comes back the same way.
    spec = load_system("mini")
    ub = spec.ub
    wire, switch = round(ub.link_latency_ns * 1000), round(ub.switch_latency_ns * 1000)
    die_rate, cpu_rate = ub.link_rate_byte_per_s, ub.cpu_link_rate_byte_per_s
    r = run_doc(trace_doc(spec, [cpu_load(spec, 0, 1, 4096)]), spec)
    expected = (round(ub.initiator_startup_ns * 1000)
                + ser(40, die_rate) + wire + ser(40, cpu_rate) + wire + switch
                + ser(4096, round(ub.cpu_memory_read_gbyte_per_s * 1e9)) + round(ub.cpu_memory_read_latency_ns * 1000)
                + ser(4140, cpu_rate) + wire + ser(4140, die_rate) + wire + switch)
    assert int(r.op_end_ps[0]) == expected


def _reads(spec, pairs, nbytes, plane="ub", native=True):
    """Every (cpu endpoint, die) pair reads nbytes at once; returns the engine."""
    topo = build_topology(spec)
    table = MessageTable()
    n = len(pairs)
    table.add_many(topo, [c for c, _ in pairs], [d for _, d in pairs], np.full(n, nbytes), np.full(n, -1),
                   np.arange(n), kind=MSG_READ, plane=plane)
    L = lowered_from_parts([OP_KIND_RECV] * n, np.zeros(n), [], [], table, op_msg=np.arange(n),
                           rank=[d for _, d in pairs])
    e = make_engine(L, build_fabric(topo), native=native)
    assert e.run() is True
    return e


def test_dies_reading_one_socket_queue_at_its_memory():
    # A socket whose DRAM serves 20 GB/s (below its 160 GB/s of ports): 1, 2 and 4 dies (on both
    # nodes) reading 4 MiB each from it at once take 1, 2 and 4 times as long, the socket's rate
    # end to end; from four different sockets, four dies take no longer than one.
    spec = load_system("mini", ["ub.cpu_memory_read_gbyte_per_s=20"])
    cpu = spec.dies
    size = 4 << 20
    t = {k: int(_reads(spec, [(cpu, d) for d in (0, 16, 2, 18)[:k]], size).now) for k in (1, 2, 4)}
    for k in (1, 2, 4):
        assert k * size / (t[k] / 1e12) == pytest.approx(20e9, rel=0.01)
    apart = int(_reads(spec, [(cpu + c, d) for c, d in zip((0, 1, 4, 5), (0, 2, 16, 18))], size).now)
    assert apart == pytest.approx(t[1], rel=0.01)


def test_at_the_preset_rate_the_sockets_ports_bind_first():
    # 187.7 GB/s of DRAM behind 160 GB/s of ports: four dies reading one socket share its ports.
    spec = load_system("mini")
    size = 4 << 20
    e = _reads(spec, [(spec.dies, d) for d in (0, 2, 4, 6)], size)
    payload = 4 * size / (int(e.now) / 1e12)
    port = spec.ub.cpu_bandwidth_gbyte_per_s * 1e9 * 4096 / 4140  # 4,124 B responses in 20 B flits
    assert payload == pytest.approx(port, rel=0.03) and payload < spec.ub.cpu_memory_read_gbyte_per_s * 1e9


def test_native_and_reference_agree_on_socket_reads():
    spec = load_system("mini", ["ub.cpu_memory_read_gbyte_per_s=20"])
    pairs = [(spec.dies + c, d) for c, d in ((0, 0), (0, 16), (1, 3), (5, 0))]
    a, b = _reads(spec, pairs, 100_000), _reads(spec, pairs, 100_000, native=False)
    assert a.events == b.events and a.now == b.now
    np.testing.assert_array_equal(a.op_end_ps, b.op_end_ps)
    np.testing.assert_array_equal(a.link_bytes, b.link_bytes)


def test_ub_and_vpc_differ_as_their_links_do():
    # The same blocks from a socket of the other node, 8 and 16 MiB: what the 8 MiB more takes is
    # the path's bottleneck. Over UB, the socket's ports (160 GB/s, less the 28 B headers of
    # 4 KiB responses in 20 B flits); over VPC, the socket's link to its DPU (32 GB/s, 78 B a
    # frame). The fixed part (start-up and latencies) is longer over VPC too.
    spec = load_system("mini")

    def t(size, plane):
        return int(run_doc(trace_doc(spec, [cpu_load(spec, 0, 5, size, plane)]), spec).op_end_ps[0]) / 1e12

    size = 8 << 20
    rate = {p: size / (t(2 * size, p) - t(size, p)) for p in ("ub", "vpc")}
    assert rate["ub"] == pytest.approx(spec.ub.cpu_bandwidth_gbyte_per_s * 1e9 * 4096 / 4140, rel=0.01)
    assert rate["vpc"] == pytest.approx(spec.vpc.host_link_gbyte_per_s * 1e9 * 4096 / 4174, rel=0.01)
    fixed = {p: t(size, p) - size / rate[p] for p in ("ub", "vpc")}
    assert fixed["vpc"] > fixed["ub"] > 0


def test_a_load_from_a_cpu_is_checked(tmp_path, cli):
    spec = load_system("mini")
    with pytest.raises(TraceError, match="CPU 8 is outside the system"):
        run_doc(trace_doc(spec, [cpu_load(spec, 0, 8, 4096)]), spec)
    import json
    bad = tmp_path / "plane.json"
    bad.write_text(json.dumps(trace_doc(spec, [{"id": 0, "type": "MEM_LOAD", "rank": 0,
                                                "attrs": {"tensor_size": 8, "cmemu.plane": "vpc"}}])))
    proc = cli("trace", "validate", bad, check=False)
    assert proc.returncode == 2 and "only applies with cmemu.src_cpu" in proc.stderr
    bad.write_text(json.dumps(trace_doc(spec, [cpu_load(spec, 0, 99, 8)])))
    proc = cli("trace", "validate", bad, "-s", "mini", check=False)
    assert proc.returncode == 2 and "CPU 99 is outside the system" in proc.stderr


def test_reuse_0_is_todays_step_exactly():
    spec = load_system("mini")
    cfg = PrefillConfig(layers=2, **SMALL)
    today = prefill_trace(cfg, "mini", spec.dies)
    for plane in ("ub", "vpc", "hbm"):
        assert prefill_step(cfg, spec, plane)[1] == today
    # ... and a reuse below one block: nothing the pool can give, so the same step too.
    assert prefill_step(PrefillConfig(layers=2, reuse=0.4, **SMALL), spec, "ub")[1] == today
    # The KV already in HBM (--ems-plane hbm) is the generator's step as it was.
    cfg = PrefillConfig(layers=2, reuse=0.5, **SMALL)
    assert prefill_step(cfg, spec, "hbm")[1] == prefill_trace(cfg, "mini", spec.dies)


def test_fetch_reads_each_block_from_its_owner():
    spec = load_system("mini")
    cfg = PrefillConfig(layers=2, reuse=0.5, **SMALL)  # 128 reused tokens: one block per request
    doc = add_ems_fetch(prefill_trace(cfg, "mini", spec.dies), cfg, spec, "vpc")
    nbytes = 128 * KV_LATENT * LAYERS
    assert block_bytes(spec) == nbytes
    pool = EMSPool(range(spec.cpus), int(spec.ems.dram_gbyte_per_cpu * 1e9), nbytes)
    fetch = [n for n in doc["nodes"] if n["name"].endswith(".ems_fetch")]
    # Request (mb, g, 0) has one block; the group's die g * 8 + 0 reads it from its owner.
    for mb in range(2):
        for g in range(2):
            key = prefix_keys(f"r{mb}.{g}.0", 128, 128)[0]
            [node] = [n for n in fetch if n["name"] == f"ems.mb{mb}.ems_fetch" and n["rank"] == g * 8]
            assert node["attrs"] == {"tensor_size": nbytes, "cmemu.src_cpu": pool.owner(key), "cmemu.plane": "vpc"}
    assert len(fetch) == 4
    gathers = [n for n in doc["nodes"] if n["name"].endswith(".ems_gather")]
    assert len(gathers) == 2 * 16 and {n["attrs"]["comm_size"] for n in gathers} == {nbytes}
    # The first layer's KV load of each micro-batch waits for its die's all-gather.
    ids = {(n["rank"], n["name"]): n["id"] for n in gathers}
    for n in doc["nodes"]:
        if n["name"].startswith("L0.") and n["name"].endswith(".kv_fetch"):
            mb = n["name"].split(".")[1]
            assert ids[(n["rank"], f"ems.{mb}.ems_gather")] in n["data_deps"]
    assert doc["nodes"][len(fetch) + len(gathers):] == [
        n for n in doc["nodes"] if not n["name"].startswith("ems.")]


def test_blocks_on_ssd_are_read_back_first():
    # A pool of 2 sockets (one node) holding 1 block each: the 4 requests' blocks overflow to SSD,
    # and each is read from the node's SSD (6 GB/s, one after the other) before its fetch.
    nbytes = 128 * KV_LATENT * LAYERS
    spec = load_system("mini", [f"ems.dram_gbyte_per_cpu={nbytes / 1e9}", "cpus_per_node=2"])
    cfg = PrefillConfig(layers=2, reuse=0.5, **SMALL)
    doc = add_ems_fetch(prefill_trace(cfg, "mini", spec.dies), cfg, spec, "ub", pool_nodes=1)
    ssd = sorted(n["attrs"]["cmemu.duration_ns"] for n in doc["nodes"] if n["name"].endswith(".ssd_read"))
    one = nbytes / (spec.ems.ssd_gbyte_per_s_per_node * 1e9) * 1e9
    assert doc["cmemu.generator"]["ems"]["ssd_blocks"] == len(ssd) >= 2
    assert ssd == pytest.approx([one * (k + 1) for k in range(len(ssd))])
    r = run_doc(doc, spec)
    names = r.lowered.op_name
    for i, n in enumerate(names):
        if n.endswith(".ems_fetch") and i > 0 and names[i - 1].endswith(".ssd_read"):
            assert int(r.op_start_ps[i]) >= round(ssd[0] * 1000)


def test_a_fetch_delays_the_step_and_vpc_more_than_ub(mini_prefill_steps):
    none, ub, vpc = mini_prefill_steps
    assert ub["ems_prefix_in_hbm_ms"] < vpc["ems_prefix_in_hbm_ms"]
    assert ub["ttft_ms"] < vpc["ttft_ms"]
    assert "ems_prefix_in_hbm_ms" not in none


@pytest.fixture(scope="module")
def mini_prefill_steps():
    spec = load_system("mini")
    cfg = PrefillConfig(layers=3, reuse=0.5, **SMALL)
    return [run_prefill(spec, cfg, ems_plane=p)[0] for p in ("hbm", "ub", "vpc")]


def test_kv_transfer_mapping_and_arrival():
    # [CM] 4.3.3 with prefill TP 8 and decode DP 320 (TP 1): 40 decode ranks per prefill TP rank;
    # with DP 16, 2 (request k goes to DP rank k, from TP rank k // 2 of its group).
    assert [sender_tp_rank(8, 320, d) for d in (0, 39, 40, 79, 319)] == [0, 0, 1, 1, 7]
    assert [sender_tp_rank(8, 16, d) for d in range(16)] == [d // 2 for d in range(16)]
    spec = load_system("mini")
    cfg = PrefillConfig(layers=2, **SMALL)
    doc = add_kv_transfer(prefill_trace(cfg, "mini", spec.dies), cfg, spec.dies, decode_dp=16)
    sends = [n for n in doc["nodes"] if n["name"].endswith(".kv_send")]
    assert [(n["rank"], n["attrs"]["comm_dst"]) for n in sends] == [(0, 16), (8, 17), (1, 18), (9, 19)]
    assert {n["attrs"]["comm_size"] for n in sends} == {256 * KV_LATENT * 2} and sends[0]["attrs"]["cmemu.plane"] == "rdma"
    with_kv, _, arrivals = run_prefill(spec, cfg, kv_transfer=True, decode_dp=16, ems_plane="hbm")
    metrics, _, _ = run_prefill(spec, cfg, ems_plane="hbm")
    assert [a["to_die"] for a in arrivals] == [16, 17, 18, 19]
    # The step's figures are the step's alone (the transfers are simulated in a second run).
    assert with_kv == metrics
    # Each KV leaves after its request's last attention, and then takes at least its bytes at
    # 200 Gb/s.
    r = run_doc(doc, spec)
    end = {(int(r.lowered.op_rank[i]), n): int(r.op_end_ps[i]) for i, n in enumerate(r.lowered.op_name)}
    for a, send in zip(arrivals, sends):
        mb = a["request"] // 2
        assert a["arrived_ms"] * 1e9 > end[(send["rank"], f"L1.mb{mb}.attention")] + a["kv_bytes"] / (
            spec.rdma.rate_byte_per_s / 1e12)
    with pytest.raises(CmemuError, match="leave none for decode"):
        add_kv_transfer(prefill_trace(PrefillConfig(layers=1, ep=32, attn_tp=8, requests=8, prompt_len=64), "mini",
                                      32), PrefillConfig(layers=1, ep=32, attn_tp=8, requests=8, prompt_len=64), 32)


def test_ems_reuse_rounds_to_whole_blocks():
    assert ems_reuse(0.9, 4096, 128) * 4096 == 3584
    assert ems_reuse(0.125, 4096, 128) == 0.125
    assert ems_reuse(0.01, 4096, 128) == 0.0
    cfg = PrefillConfig(reuse=ems_reuse(0.9, 4096, 128))
    assert cfg.reused_tokens == 3584


def test_context_cache_rows_are_consistent():
    params, tables = run_scenario("context-cache", "mini", prompt_len=256, tokens_per_npu=128, reuse="0,0.5")
    [rows] = tables.values()
    zero, half = rows
    assert params["requests"] == 8 and params["layers_simulated"] == 3
    assert zero["ub_gain_ratio"] == zero["vpc_gain_ratio"] == zero["ub_over_vpc_ratio"] == 1.0
    assert zero["ub_tokens_per_s_per_npu"] == zero["no_cache_tokens_per_s_per_npu"]
    assert half["reused_tokens_per_prompt"] == 128
    for plane in ("ub", "vpc"):
        assert half[f"{plane}_gain_ratio"] == round(half[f"{plane}_tokens_per_s_per_npu"] / half["no_cache_tokens_per_s_per_npu"], 3)
    assert half["ub_over_vpc_ratio"] == round(half["ub_tokens_per_s_per_npu"] / half["vpc_tokens_per_s_per_npu"], 3)
    assert half["no_cache_ttft_ms"] == zero["no_cache_ttft_ms"]  # one step without caching for every rate
    # Throughput and TTFT agree: tokens per step / TTFT / NPUs.
    for row in rows:
        for plane in ("no_cache", "ub", "vpc"):
            tps = 8 * 256 / (row[f"{plane}_ttft_ms"] / 1e3) / params["npus"]
            assert row[f"{plane}_tokens_per_s_per_npu"] == pytest.approx(tps, rel=1e-3)
    with pytest.raises(CmemuError, match="not a whole number"):
        run_scenario("context-cache", "mini", prompt_len=256, tokens_per_npu=100)


def test_layerwise_fetch_waits_layer_by_layer():
    spec = load_system("mini")
    cfg = PrefillConfig(layers=3, reuse=0.5, **SMALL)
    base = prefill_trace(cfg, "mini", spec.dies)
    whole = add_ems_fetch(base, cfg, spec, "ub")
    lw = add_ems_fetch(base, cfg, spec, "ub", layerwise=True)

    def fetched(doc):
        return sum(n["attrs"]["tensor_size"] for n in doc["nodes"] if n["name"].endswith(".ems_fetch"))

    # Each block's part of each simulated layer: 3 / 61 of the whole prefix.
    assert fetched(lw) * LAYERS == fetched(whole) * 3
    ids = {(n["rank"], n["name"]): n["id"] for n in lw["nodes"] if n["name"].endswith(".ems_gather")}
    for n in lw["nodes"]:
        if n["name"].endswith(".kv_fetch"):
            layer, mb = n["name"].split(".")[:2]
            assert ids[(n["rank"], f"ems.{mb}.{layer}.ems_gather")] in n["data_deps"]
    # Layer 0 waits for its part only: the step starts its TP stage earlier than with the whole.
    t = {name: run_doc(doc, spec) for name, doc in (("whole", whole), ("layerwise", lw))}
    m = {k: prefill_metrics(cfg, r)[0] for k, r in t.items()}
    assert m["layerwise"]["ttft_ms"] < m["whole"]["ttft_ms"]
