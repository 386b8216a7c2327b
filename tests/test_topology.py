"""Topology counts checked by hand, the switch-utilisation figures of docs/machine.md 3, and routes."""
import json

import numpy as np
import pytest

from cmemu.spec import load_system
from cmemu.topology import L_L1_UP, V_L2, build_topology


@pytest.fixture(scope="module")
def mini():
    return build_topology(load_system("mini"))


def test_mini_counts_by_hand(mini):
    s = mini.summary()
    # 2 nodes x 8 NPUs x 2 dies; 2 x 4 CPUs; 2 x 7 L1 chips; 7 sub-planes x 16 L2 chips.
    assert (s["dies"], s["cpus"], s["l1_chips"], s["l2_chips"]) == (32, 8, 14, 112)
    k = s["links_by_kind"]
    assert k["ub_die_to_l1"] == k["ub_l1_to_die"] == 32 * 7
    assert k["ub_cpu_to_l1"] == k["ub_l1_to_cpu"] == 8 * 7
    assert k["ub_l1_to_l2"] == k["ub_l2_to_l1"] == 14 * 16
    assert k["d2d"] == 32
    assert k["rdma_die_to_switch"] == k["rdma_switch_to_die"] == 32
    # VPC: every die and CPU to its node's DPU and back; each of the 2 DPUs to the switch and back.
    assert k["vpc_host_to_dpu"] == k["vpc_dpu_to_host"] == 40
    assert k["vpc_dpu_to_switch"] == k["vpc_switch_to_dpu"] == 2
    assert s["links_directed"] == 2 * 224 + 2 * 56 + 2 * 224 + 32 + 64 + 2 * 40 + 2 * 2
    assert s["l2_ports_used"] == 224 and s["l2_ports_available"] == 112 * 48
    assert s["die_ub_bandwidth_gbyte_per_s"] == 196.0


# [CM] Table 11: 384, 288 and 192 NPUs use every L2 port; 352 uses 92%, 256 uses 89%.
@pytest.mark.parametrize(
    "name, percent",
    [("cloudmatrix384", 100), ("cloudmatrix384-288", 100), ("cloudmatrix384-192", 100),
     ("cloudmatrix384-352", 92), ("cloudmatrix384-256", 89)],
)
def test_switch_utilisation_matches_cm_table_11(name, percent):
    s = build_topology(load_system(name)).summary()
    assert round(s["l2_port_utilisation_percent"]) == percent


def test_every_l2_chip_within_its_port_count():
    topo = build_topology(load_system("cloudmatrix384-256"))
    l2_in = np.bincount(topo.link_dst[topo.link_kind == L_L1_UP], minlength=topo.vertex_kind.size)
    ports = l2_in[topo.vertex_kind == V_L2]
    assert ports.max() <= 48 and ports.min() >= 42  # 512 uplinks over 12 chips, evenly


def test_full_system_bisection(mini):
    s = build_topology(load_system("cloudmatrix384")).summary()
    # Half the nodes (24) x 7 L1 chips x 16 uplinks x 28 GB/s.
    assert s["bisection_bandwidth_gbyte_per_s"] == pytest.approx(24 * 7 * 16 * 28)


def test_topo_cli_json(cli):
    out = cli("topo", "--system", "cloudmatrix384-352", "--json")
    doc = json.loads(out.stdout)
    assert doc["l2_ports_used"] == 44 * 7 * 16
    assert doc["l2_ports_available"] == 112 * 48
    assert doc["l2_port_utilisation_percent"] == pytest.approx(91.7)
