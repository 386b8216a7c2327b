"""MoE dispatch and combine on AIV-Direct as the fused kernels run them (cmemu/lower/moe.py): the
messages each step makes, an AIV's write loop by hand, the flags' order, and the steps the
dispatch/combine scenarios report."""
import json

import numpy as np
import pytest

from cmemu.fabric import aiv_initiator, build_fabric
from cmemu.lower import lower
from cmemu.lower.moe import PHASE, dispatch_write_byte, split_to_cores, steps_of
from cmemu.run import simulate
from cmemu.scenarios.moe_comm import kernel_steps, moe_rows
from cmemu.spec import load_system
from cmemu.topology import build_topology
from cmemu.trace import load_trace
from cmemu.vocab import MSG_READ, MSG_WRITE
from cmemu.workload.moe import moe_experts

HIDDEN = 7168


def doc(ranks, tokens, top_k, experts, kinds=("MOE_DISPATCH",), kernel="low_latency", cores=None, seed=0):
    nodes = []
    for ctype in kinds:
        for r in ranks:
            attrs = {"comm_type": ctype, "cmemu.group": "ep", "cmemu.tokens": tokens, "cmemu.top_k": top_k,
                     "cmemu.hidden": HIDDEN, "cmemu.experts": experts, "cmemu.kernel": kernel, "cmemu.seed": seed}
            if cores:
                attrs["cmemu.cores"] = cores
            nodes.append({"id": len(nodes), "name": ctype.lower(), "type": "COMM_COLL", "rank": r, "stream": 0,
                          "attrs": attrs})
    return {"schema": "cmemu.trace", "version": 1, "time_unit": "ns", "system": "mini", "groups": {"ep": ranks},
            "nodes": nodes}


@pytest.fixture(scope="module")
def topo():
    return build_topology(load_system("mini"))


def lowered(tmp_path, topo, d):
    path = tmp_path / "t.json"
    path.write_text(json.dumps(d))
    return lower(load_trace(path, topo.num_dies), topo)


def test_split_to_cores_gives_the_first_cores_one_more():
    assert split_to_cores(10, 4).tolist() == [0, 3, 6, 8, 10]
    assert split_to_cores(2, 4).tolist() == [0, 1, 2, 2, 2]


def test_dispatch_write_is_the_token_its_scale_slot_and_triple():
    # [OT] moe_distribute_dispatch_v2.h: Align32(H) + 32 (scale) + 12 (rank, token, k).
    assert dispatch_write_byte(7168) == 7212


def test_low_latency_dispatch_messages(tmp_path, topo):
    ranks = [0, 2, 4, 6]
    L = lowered(tmp_path, topo, doc(ranks, tokens=6, top_k=2, experts=8, seed=3))
    experts = moe_experts(6, 2, 8, 4, 0.0, 3)
    dst = experts // 2
    data = np.flatnonzero(L.msg_bytes == 7212)
    for s in range(4):
        for d in range(4):
            got = np.sum((L.msg_src[data] == ranks[s]) & (L.msg_dst[data] == ranks[d]))
            assert got == (0 if s == d else int((dst[s] == d).sum())), (s, d)
    # Every data write is its AIV's own, and waits for the one before it (flow 1).
    assert np.all(L.msg_ini[data] >= topo.num_endpoints) and np.all(L.msg_flow[data] & 7 == 1)
    # A 32 B status entry from every die for every expert on another die.
    flags = L.msg_bytes == 32
    assert flags.sum() == 4 * (8 - 2)


def test_an_aiv_write_loop_by_hand(tmp_path, topo):
    # One token to one expert on another die, one AIV: the core sets up, counts (nothing before
    # it), loads and quantises the token, then writes it; its send step ends when the write is
    # acknowledged. The write's round trip is measured alone on the same fabric.
    from cmemu.lower import lowered_from_parts
    from cmemu.lower.comm import MessageTable
    from cmemu.vocab import OP_KIND_SEND

    ranks = [0, 2]
    seed = next(s for s in range(50) if moe_experts(1, 1, 2, 2, 0.0, s)[0, 0, 0] == 1)
    L = lowered(tmp_path, topo, doc(ranks, tokens=1, top_k=1, experts=2, cores=1, seed=seed))
    fabric = build_fabric(topo)
    e = simulate(L, fabric)
    st = steps_of(topo.spec.die)
    work = st.load_ps(2 * HIDDEN) + st.quant_ps(HIDDEN)
    setup = st.load_ps(32, from_hbm=True) + st.store_ps(32) + st.load_ps(4)
    table = MessageTable()
    table.add_many(topo, [0], [2], [7212], [0], [-1], ini=aiv_initiator(topo, 0, 0))
    alone = simulate(lowered_from_parts([OP_KIND_SEND], [0], [], [], table, op_msg=[0], rank=[0]), fabric)
    send = np.flatnonzero((L.op_phase == PHASE["send"]) & (L.op_rank == 0))
    assert send.size == 1
    assert int(e.op_end_ps[send[0]] - e.op_start_ps[send[0]]) == setup + work + int(alone.op_end_ps[0])


def test_normal_dispatch_pulls_one_token_at_a_time(tmp_path, topo):
    ranks = [0, 2, 4, 6]
    L = lowered(tmp_path, topo, doc(ranks, tokens=8, top_k=2, experts=8, kernel="normal"))
    reads = np.flatnonzero((L.msg_kind == MSG_READ) & (L.msg_bytes == 7212))
    experts = moe_experts(8, 2, 8, 4, 0.0, 0)
    remote = sum(int((experts[s] // 2 != s).sum()) for s in range(4))
    assert reads.size == remote
    assert np.all(L.msg_flow[reads] & 7 == 1)  # each token dequeued before the next read
    # The data's writes all go to the die's own window: no remote data write.
    assert not np.any((L.msg_kind == MSG_WRITE) & (L.msg_bytes == 7212))
    # The count exchange: an 8 B flag to every other die, and a pull of each one's counts.
    assert np.sum((L.msg_kind == MSG_WRITE) & (L.msg_bytes == 8)) == 4 * 3


@pytest.mark.parametrize("kernel", ["low_latency", "normal"])
def test_combine_writes_each_row_back_then_its_flag(tmp_path, topo, kernel):
    ranks = [1, 3, 5, 7]
    L = lowered(tmp_path, topo, doc(ranks, tokens=6, top_k=3, experts=8, kinds=("MOE_DISPATCH", "MOE_COMBINE"),
                                    kernel=kernel, seed=5))
    e = simulate(L, build_fabric(topo))
    data = np.flatnonzero(L.msg_bytes == 2 * HIDDEN)
    experts = moe_experts(6, 3, 8, 4, 0.0, 5)
    assert data.size == sum(int((experts[s] // 2 != s).sum()) for s in range(4))
    # In each core's stream a flag follows each row and is delivered after it.
    delivered = np.asarray(e.msg_delivered_ps)
    for i in data:
        f = i + 1
        assert L.msg_bytes[f] == 32 and L.msg_dst[f] == L.msg_dst[i] and L.msg_flow[f] & 7 == 1
        assert delivered[f] > delivered[i]
    # Each flag goes to the receive of its token on the token's die (a per-token chain).
    recv = L.msg_recv_op[data + 1]
    assert np.all(L.op_phase[recv] == PHASE["sum"])


def test_the_low_latency_combine_staggers_each_core_by_rank(tmp_path, topo):
    # [OT] combine_v2.h: a core sends its rows from (loop + epRankId) % n, the rows being in the
    # dispatch's output order (local expert, source, the source's pair order).
    ranks = [0, 2, 4]
    tokens, top_k, experts_n = 8, 2, 6
    L = lowered(tmp_path, topo, doc(ranks, tokens=tokens, top_k=top_k, experts=experts_n,
                                    kinds=("MOE_DISPATCH", "MOE_COMBINE"), cores=1))
    experts = moe_experts(tokens, top_k, experts_n, 3, 0.0, 0)
    for h in range(3):
        rows = [(int(e) % 2, src, p) for src in range(3) for p, e in enumerate(experts[src].ravel()) if e // 2 == h]
        rows.sort()
        k = len(rows)
        rotated = [rows[(i + h) % k] for i in range(k)]
        expected = [ranks[src] for _, src, _ in rotated if src != h]
        combine_send = [int(op) for op in np.flatnonzero((L.op_kind == 1) & (L.op_phase == PHASE["send"])
                                                         & (L.op_parent == 3 + h))]
        assert len(combine_send) == 1
        msgs = np.flatnonzero((L.msg_send_op == combine_send[0]) & (L.msg_bytes == 2 * HIDDEN))
        assert L.msg_dst[msgs].tolist() == expected


@pytest.mark.parametrize("kernel,combine", [("low_latency", False), ("normal", False), ("low_latency", True)])
def test_the_steps_add_up_to_the_latency(kernel, combine):
    spec = load_system("mini")
    row = moe_rows(spec, [8], 16, 4, HIDDEN, ["aiv"], None, 0.0, 0, combine, [kernel], 16)[0]
    steps = sum(v for k, v in row.items() if k.endswith("_us") and k not in ("latency_us", "latency_mean_us"))
    assert steps == pytest.approx(row["latency_us"], abs=0.01 * len(row))


def test_deepep_bandwidth_is_the_tests_quantity():
    spec = load_system("mini")
    ll = moe_rows(spec, [4], 16, 4, HIDDEN, ["aiv"], None, 0.0, 0, False, ["low_latency"], 8)[0]
    # Rank 0's 16 x 4 selections at 7,168 + 7,168 / 128 x 4 + 16 = 7,408 B (test_low_latency.py), over
    # rank 0's time: above the slowest rank's quantity, which the latency is.
    assert ll["deepep_bandwidth_gbyte_per_s"] >= 16 * 4 * 7408 / (ll["latency_us"] * 1e3) - 0.1
    normal = moe_rows(spec, [4], 16, 4, HIDDEN, ["aiv"], None, 0.0, 0, False, ["normal"], 8)[0]
    experts = moe_experts(16, 4, 8, 4, 0.0, 0)
    received = int((experts // 2 == 0).sum())
    assert normal["deepep_bandwidth_gbyte_per_s"] >= received * 2 * HIDDEN / (normal["latency_us"] * 1e3) - 0.1
