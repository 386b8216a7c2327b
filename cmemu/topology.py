"""The supernode's wiring, compiled from a SystemSpec into flat numpy arrays.

Vertices are numbered endpoints first (dies, then CPUs), then L1 chips (node-major, one per
sub-plane), then L2 chips (sub-plane-major), then the single RDMA switch. Links are *directed*:
a cable of rate R per direction is two links. Each link has an integer rate in bytes per second
and an integer latency in picoseconds (wire, plus switch traversal when it leaves a switch).

Wiring (docs/machine.md 2.4): each die and CPU has one port to the L1 chip of each sub-plane of its node;
uplink k of the L1 chip of (node n, plane p) goes to L2 chip (n * uplinks + k) mod C of plane p,
so every L1 reaches every L2 chip of its plane and the L2 ports fill evenly; the two dies of an
NPU share a die-to-die link; every die has a port into the RDMA plane, modelled as one
non-blocking switch.

Routes (taken hop by hop by the engine, ``route_link`` in cmemu/_core; tests/test_routes.py
checks every one on ``mini``): die <-> twin die over die-to-die; within a node, up to the L1 chip
of a sub-plane and down; between nodes L1 -> L2 -> L1; over RDMA, die -> RDMA switch -> die; over
VPC, endpoint -> DPU -> endpoint within a node, endpoint -> DPU -> VPC switch -> DPU -> endpoint
between nodes.

The VPC plane: every die and CPU has a link to its node's DPU (a Qingtian card), and each DPU one
400 Gb/s port into the VPC network, modelled as one switch. The packet engine computes routes
hop by hop from these tables (cmemu/fabric.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from cmemu.spec.model import SystemSpec
from cmemu.units import ns_to_ps

# Vertex kinds.
V_DIE, V_CPU, V_L1, V_L2, V_RDMA, V_DPU, V_VPC = range(7)
VERTEX_KIND_NAMES = ("die", "cpu", "l1", "l2", "rdma_switch", "dpu", "vpc_switch")

# Link kinds (directed).
(
    L_DIE_UP,
    L_DIE_DOWN,
    L_CPU_UP,
    L_CPU_DOWN,
    L_L1_UP,
    L_L2_DOWN,
    L_D2D,
    L_RDMA_UP,
    L_RDMA_DOWN,
    L_HOST_TO_DPU,
    L_DPU_TO_HOST,
    L_DPU_UP,
    L_DPU_DOWN,
) = range(13)
LINK_KIND_NAMES = (
    "ub_die_to_l1",
    "ub_l1_to_die",
    "ub_cpu_to_l1",
    "ub_l1_to_cpu",
    "ub_l1_to_l2",
    "ub_l2_to_l1",
    "d2d",
    "rdma_die_to_switch",
    "rdma_switch_to_die",
    "vpc_host_to_dpu",
    "vpc_dpu_to_host",
    "vpc_dpu_to_switch",
    "vpc_switch_to_dpu",
)


@dataclass(frozen=True)
class Topology:
    """Flat arrays describing the wiring; build with :func:`build_topology`."""

    spec: SystemSpec
    vertex_kind: np.ndarray  # uint8 [V]
    link_src: np.ndarray  # int32 [L]
    link_dst: np.ndarray  # int32 [L]
    link_kind: np.ndarray  # uint8 [L]
    link_rate_byte_per_s: np.ndarray  # int64 [L]
    link_latency_ps: np.ndarray  # int64 [L]
    # Lookup tables for routing.
    ep_up: np.ndarray  # int32 [endpoints, planes]: endpoint -> L1 link
    ep_down: np.ndarray  # int32 [endpoints, planes]: L1 -> endpoint link
    l1_uplink: np.ndarray  # int32 [nodes, planes, uplinks]: L1 -> L2 link
    l1_uplink_chip: np.ndarray  # int32 [nodes, planes, uplinks]: which L2 chip it reaches
    l2_down: np.ndarray  # int32 [planes, chips, nodes, mult]: L2 -> L1 links (-1 padded)
    l2_down_count: np.ndarray  # int32 [planes, chips, nodes]
    d2d: np.ndarray  # int32 [dies]: die -> twin die link
    rdma_up: np.ndarray  # int32 [dies]
    rdma_down: np.ndarray  # int32 [dies]
    vpc_host_up: np.ndarray  # int32 [endpoints]: endpoint -> its node's DPU
    vpc_host_down: np.ndarray  # int32 [endpoints]: DPU -> endpoint
    vpc_dpu_up: np.ndarray  # int32 [nodes]: DPU -> VPC switch
    vpc_dpu_down: np.ndarray  # int32 [nodes]: VPC switch -> DPU

    # -- sizes -----------------------------------------------------------------------------
    @property
    def num_dies(self) -> int:
        return self.spec.dies

    @property
    def num_cpus(self) -> int:
        return self.spec.cpus

    @property
    def num_endpoints(self) -> int:
        return self.spec.dies + self.spec.cpus

    @property
    def num_links(self) -> int:
        return int(self.link_src.shape[0])

    @property
    def num_l1(self) -> int:
        return self.spec.nodes * self.spec.ub.sub_planes

    @property
    def num_l2(self) -> int:
        return self.spec.ub.sub_planes * self.spec.ub.l2_chips_per_sub_plane

    def die_node(self, die: int) -> int:
        return die // (self.spec.npus_per_node * self.spec.dies_per_npu)

    def cpu_endpoint(self, cpu: int) -> int:
        return self.spec.dies + cpu

    def endpoint_node(self, ep: int) -> int:
        if ep < self.spec.dies:
            return self.die_node(ep)
        return (ep - self.spec.dies) // self.spec.cpus_per_node

    def twin_die(self, die: int) -> int:
        return die ^ 1 if self.spec.dies_per_npu == 2 else -1

    def is_twin(self, a, b):
        """Whether endpoints a and b (ints, or arrays of them) are the two dies of one NPU, which
        their die-to-die link joins."""
        a, b = np.asarray(a, dtype=np.int64), np.asarray(b, dtype=np.int64)
        if self.spec.dies_per_npu != 2:
            return np.zeros(np.broadcast_shapes(a.shape, b.shape), dtype=bool)
        dies = self.spec.dies
        return (a < dies) & (b < dies) & ((a ^ 1) == b)

    # -- figures for `cmemu topo` ----------------------------------------------------------
    @cached_property
    def l2_ports_used(self) -> int:
        return int(np.count_nonzero(self.link_kind == L_L1_UP))

    @property
    def l2_ports_available(self) -> int:
        return self.num_l2 * self.spec.ub.l2_ports_per_chip

    def summary(self) -> dict:
        """Counts and bandwidth figures, units in the keys."""
        s, ub = self.spec, self.spec.ub
        link_rate = ub.link_rate_byte_per_s
        kinds = {name: int(np.count_nonzero(self.link_kind == k)) for k, name in enumerate(LINK_KIND_NAMES)}
        die_injection = ub.die_ports * link_rate  # B/s per direction
        node_uplink = ub.sub_planes * ub.l1_uplinks_per_chip * link_rate
        half_nodes = s.nodes // 2
        dies_per_node = s.npus_per_node * s.dies_per_npu
        # Bisection: split the nodes in two halves; one direction's traffic across the cut is
        # bounded by what half the dies can inject, by what half the L1 chips can send up, and
        # by the L2 ports that face the other half.
        bisection = min(
            half_nodes * dies_per_node * die_injection,
            half_nodes * node_uplink,
            (self.l2_ports_used // 2) * link_rate,
        )
        return {
            "system": s.name,
            "nodes": s.nodes,
            "npus": s.npus,
            "dies": s.dies,
            "cpus": s.cpus,
            "sub_planes": ub.sub_planes,
            "l1_chips": self.num_l1,
            "l2_chips": self.num_l2,
            "l2_chips_per_sub_plane": ub.l2_chips_per_sub_plane,
            "links_directed": self.num_links,
            "links_by_kind": kinds,
            "l2_ports_used": self.l2_ports_used,
            "l2_ports_available": self.l2_ports_available,
            "l2_port_utilisation_percent": round(100.0 * self.l2_ports_used / self.l2_ports_available, 1),
            "ub_link_rate_gbyte_per_s": link_rate / 1e9,
            "die_ub_bandwidth_gbyte_per_s": die_injection / 1e9,
            "node_uplink_bandwidth_gbyte_per_s": node_uplink / 1e9,
            "bisection_bandwidth_gbyte_per_s": bisection / 1e9,
        }


def build_topology(spec: SystemSpec) -> Topology:
    """Wire up a system. Deterministic: the same spec gives the same arrays."""
    ub = spec.ub
    P, U, C = ub.sub_planes, ub.l1_uplinks_per_chip, ub.l2_chips_per_sub_plane
    D, CPU, N = spec.dies, spec.cpus, spec.nodes
    E = D + CPU
    l1_base = E
    l2_base = l1_base + N * P
    rdma_vertex = l2_base + P * C
    dpu_base = rdma_vertex + 1
    vpc_vertex = dpu_base + N
    vertex_kind = np.empty(vpc_vertex + 1, dtype=np.uint8)
    vertex_kind[:D] = V_DIE
    vertex_kind[D:E] = V_CPU
    vertex_kind[l1_base:l2_base] = V_L1
    vertex_kind[l2_base:rdma_vertex] = V_L2
    vertex_kind[rdma_vertex] = V_RDMA
    vertex_kind[dpu_base:vpc_vertex] = V_DPU
    vertex_kind[vpc_vertex] = V_VPC

    src, dst, kind, rate, lat = [], [], [], [], []
    wire_ps = ns_to_ps(ub.link_latency_ns)
    switch_ps = ns_to_ps(ub.switch_latency_ns)

    def add(a, b, k, r, latency_ps):
        src.append(a)
        dst.append(b)
        kind.append(k)
        rate.append(r)
        lat.append(latency_ps)
        return len(src) - 1

    dies_per_node = spec.npus_per_node * spec.dies_per_npu
    ep_up = np.full((E, P), -1, dtype=np.int32)
    ep_down = np.full((E, P), -1, dtype=np.int32)
    for ep in range(E):
        if ep < D:
            node, r, k_up, k_down = ep // dies_per_node, ub.link_rate_byte_per_s, L_DIE_UP, L_DIE_DOWN
        else:
            node, r, k_up, k_down = (ep - D) // spec.cpus_per_node, ub.cpu_link_rate_byte_per_s, L_CPU_UP, L_CPU_DOWN
        for p in range(P):
            l1 = l1_base + node * P + p
            ep_up[ep, p] = add(ep, l1, k_up, r, wire_ps)
            ep_down[ep, p] = add(l1, ep, k_down, r, wire_ps + switch_ps)

    mult = -(-U // C)
    l1_uplink = np.full((N, P, U), -1, dtype=np.int32)
    l1_uplink_chip = np.full((N, P, U), -1, dtype=np.int32)
    l2_down = np.full((P, C, N, mult), -1, dtype=np.int32)
    l2_down_count = np.zeros((P, C, N), dtype=np.int32)
    for n in range(N):
        for p in range(P):
            l1 = l1_base + n * P + p
            for k in range(U):
                chip = (n * U + k) % C
                l2 = l2_base + p * C + chip
                l1_uplink[n, p, k] = add(l1, l2, L_L1_UP, ub.link_rate_byte_per_s, wire_ps + switch_ps)
                l1_uplink_chip[n, p, k] = chip
                m = l2_down_count[p, chip, n]
                l2_down[p, chip, n, m] = add(l2, l1, L_L2_DOWN, ub.link_rate_byte_per_s, wire_ps + switch_ps)
                l2_down_count[p, chip, n] = m + 1

    d2d = np.full(D, -1, dtype=np.int32)
    if spec.dies_per_npu == 2:
        for die in range(D):
            d2d[die] = add(die, die ^ 1, L_D2D, spec.d2d.rate_byte_per_s, ns_to_ps(spec.d2d.latency_ns))
    rdma_up = np.empty(D, dtype=np.int32)
    rdma_down = np.empty(D, dtype=np.int32)
    rdma_link_ps = ns_to_ps(spec.rdma.link_latency_ns)
    rdma_switch_ps = ns_to_ps(spec.rdma.switch_latency_ns)
    for die in range(D):
        rdma_up[die] = add(die, rdma_vertex, L_RDMA_UP, spec.rdma.rate_byte_per_s, rdma_link_ps)
        rdma_down[die] = add(rdma_vertex, die, L_RDMA_DOWN, spec.rdma.rate_byte_per_s, rdma_link_ps + rdma_switch_ps)

    # The VPC plane: every die and CPU reaches its node's DPU; each DPU has one 400 Gb/s port.
    vpc = spec.vpc
    vpc_link_ps = ns_to_ps(vpc.link_latency_ns)
    vpc_switch_ps = ns_to_ps(vpc.switch_latency_ns)
    host_rate = round(vpc.host_link_gbyte_per_s * 1e9)
    vpc_host_up = np.empty(E, dtype=np.int32)
    vpc_host_down = np.empty(E, dtype=np.int32)
    for ep in range(E):
        node = ep // dies_per_node if ep < D else (ep - D) // spec.cpus_per_node
        vpc_host_up[ep] = add(ep, dpu_base + node, L_HOST_TO_DPU, host_rate, vpc_link_ps)
        vpc_host_down[ep] = add(dpu_base + node, ep, L_DPU_TO_HOST, host_rate, vpc_link_ps)
    vpc_dpu_up = np.empty(N, dtype=np.int32)
    vpc_dpu_down = np.empty(N, dtype=np.int32)
    for n in range(N):
        vpc_dpu_up[n] = add(dpu_base + n, vpc_vertex, L_DPU_UP, vpc.node_rate_byte_per_s, vpc_link_ps)
        vpc_dpu_down[n] = add(vpc_vertex, dpu_base + n, L_DPU_DOWN, vpc.node_rate_byte_per_s,
                              vpc_link_ps + vpc_switch_ps)

    return Topology(
        spec=spec,
        vertex_kind=vertex_kind,
        link_src=np.asarray(src, dtype=np.int32),
        link_dst=np.asarray(dst, dtype=np.int32),
        link_kind=np.asarray(kind, dtype=np.uint8),
        link_rate_byte_per_s=np.asarray(rate, dtype=np.int64),
        link_latency_ps=np.asarray(lat, dtype=np.int64),
        ep_up=ep_up,
        ep_down=ep_down,
        l1_uplink=l1_uplink,
        l1_uplink_chip=l1_uplink_chip,
        l2_down=l2_down,
        l2_down_count=l2_down_count,
        d2d=d2d,
        rdma_up=rdma_up,
        rdma_down=rdma_down,
        vpc_host_up=vpc_host_up,
        vpc_host_down=vpc_host_down,
        vpc_dpu_up=vpc_dpu_up,
        vpc_dpu_down=vpc_dpu_down,
    )
