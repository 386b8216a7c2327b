"""Every route the engine takes on `mini`: for every source and destination endpoint, every
plane a message may ask for (the path kind it then takes, cmemu.lower.comm.message_paths), every
sub-plane and every L1 uplink, the links the native engine's route_link gives hop by hop form a
chain from the source to the destination through the switches the topology says; and the
reference engine gives the same links (on the first and the last uplink of each, to keep the test
short: the uplink only picks an index into the same tables)."""
import itertools

import numpy as np
import pytest

from cmemu._core import make_engine
from cmemu._core.synthetic import hold_workload
from cmemu.fabric import build_fabric
from cmemu.lower.comm import message_paths
from cmemu.spec import load_system
from cmemu.topology import (
    L_D2D,
    L_L1_UP,
    L_L2_DOWN,
    L_RDMA_DOWN,
    L_RDMA_UP,
    V_DPU,
    V_L1,
    V_L2,
    V_RDMA,
    V_VPC,
    build_topology,
)
from cmemu.vocab import PATH_D2D, PATH_RDMA, PATH_UB, PATH_VPC, PLANES


@pytest.fixture(scope="module")
def mini():
    topo = build_topology(load_system("mini"))
    fabric = build_fabric(topo)
    lowered = hold_workload(1, 1)
    return topo, make_engine(lowered, fabric, native=True), make_engine(lowered, fabric, native=False)


def _every_route(topo):
    """(src, dst, plane name, path kind, sub-plane, uplink) of every route a message can take."""
    spec = topo.spec
    endpoints = range(spec.dies + spec.cpus)
    for src, dst in itertools.permutations(endpoints, 2):
        for plane in PLANES:
            if plane == "rdma" and not (src < spec.dies and dst < spec.dies):
                continue  # the RDMA plane joins dies only
            path = int(message_paths(topo, [src], [dst], PLANES.index(plane))[0])
            for sub_plane in range(spec.ub.sub_planes):
                for uplink in range(spec.ub.l1_uplinks_per_chip):
                    yield src, dst, plane, path, sub_plane, uplink


def test_every_route_is_a_chain_through_the_right_switches_and_both_engines_agree(mini):
    topo, native, reference = mini
    kind, lsrc, ldst, vkind = topo.link_kind, topo.link_src, topo.link_dst, topo.vertex_kind
    n = 0
    l2_chips = {}  # (src, dst, sub-plane) -> the L2 chips its uplinks reach
    for src, dst, plane, path, sub_plane, uplink in _every_route(topo):
        links = native.route(path, src, dst, sub_plane, uplink)
        if uplink in (0, topo.spec.ub.l1_uplinks_per_chip - 1):
            assert links == reference.route(path, src, dst, sub_plane, uplink), (src, dst, plane, sub_plane, uplink)
        assert links and lsrc[links[0]] == src and ldst[links[-1]] == dst
        assert all(ldst[a] == lsrc[b] for a, b in zip(links, links[1:]))
        via = [int(vkind[ldst[link]]) for link in links[:-1]]
        same_node = topo.endpoint_node(src) == topo.endpoint_node(dst)
        if path == PATH_D2D:
            assert topo.is_twin(src, dst) and plane == "ub" and [kind[link] for link in links] == [L_D2D]
        elif path == PATH_RDMA:
            assert [kind[link] for link in links] == [L_RDMA_UP, L_RDMA_DOWN] and via == [V_RDMA]
        elif path == PATH_VPC:
            assert plane == "vpc" and via == ([V_DPU] if same_node else [V_DPU, V_VPC, V_DPU])
        else:
            assert path == PATH_UB and plane == "ub" and not topo.is_twin(src, dst)
            assert via == ([V_L1] if same_node else [V_L1, V_L2, V_L1])
            assert int(topo.ep_up[src, sub_plane]) == links[0] and int(topo.ep_down[dst, sub_plane]) == links[-1]
            if not same_node:
                assert kind[links[1]] == L_L1_UP and kind[links[2]] == L_L2_DOWN
                l2_chips.setdefault((src, dst, sub_plane), set()).add(int(ldst[links[1]]))
        n += 1
    spec = topo.spec
    e = spec.dies + spec.cpus
    assert n == (e * (e - 1) * 2 + spec.dies * (spec.dies - 1)) * spec.ub.sub_planes * spec.ub.l1_uplinks_per_chip
    # A source's uplinks reach every L2 chip of the sub-plane.
    assert {len(c) for c in l2_chips.values()} == {spec.ub.l2_chips_per_sub_plane}


def test_twins_are_the_two_dies_of_an_npu(mini):
    topo = mini[0]
    assert topo.is_twin(6, 7) and topo.is_twin(7, 6) and not topo.is_twin(7, 8)
    assert not topo.is_twin(topo.spec.dies, topo.spec.dies + 1)  # CPUs
    assert np.array_equal(topo.is_twin([0, 1, 2], [1, 0, 4]), [True, True, False])
    assert topo.link_kind[topo.d2d[6]] == L_D2D and topo.link_dst[topo.d2d[6]] == 7
