"""The hardware description: frozen dataclasses, units in every physical field's name.

Every physical value carries its provenance in the dataclass's ``sources`` mapping (field name ->
source string, "assumed: why" where nothing is published). Presets (TOML, see ``presets/``) are
the only place values are written down; code reads them from here and never repeats a number.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Mapping

from cmemu.spec.common import _frozen_map, _require_positive
from cmemu.spec.die import DieSpec
from cmemu.vocab import LOAD_BALANCING


# Endpoints (dies and CPUs) are uint16 in the lowered messages; links are int32, and the topology
# and fabric hold a few hundred bytes for each.
MAX_ENDPOINTS = 2**16 - 1
MAX_LINKS = 2**22


@dataclass(frozen=True)
class UBSpec:
    """The Unified Bus fabric: per-die ports, L1/L2 switch chips of the two-tier Clos (2.4)."""

    sub_planes: int
    die_ports: int
    link_rate_gbit_per_s: float
    link_latency_ns: float
    switch_latency_ns: float
    l1_uplinks_per_chip: int
    l2_chips_per_sub_plane: int
    l2_ports_per_chip: int
    transport_mtu_byte: int
    flit_byte: int
    header_write_byte: int
    header_read_request_byte: int
    header_read_response_byte: int
    header_ack_byte: int
    vl_buffer_byte: int
    max_outstanding_packets: int
    retransmit_timeout_ns: float
    initiator_startup_ns: float
    write_issue_ns: float
    read_issue_ns: float
    load_balancing: str
    cpu_bandwidth_gbyte_per_s: float
    cpu_ports: int
    cpu_memory_read_latency_ns: float
    cpu_memory_write_latency_ns: float
    cpu_memory_write_gbyte_per_s: float
    cpu_memory_read_gbyte_per_s: float
    sources: Mapping[str, str] = field(default_factory=_frozen_map, compare=False)

    def __post_init__(self):
        _require_positive(self, "ub")
        if self.load_balancing not in LOAD_BALANCING:
            raise ValueError(f"ub.load_balancing must be one of {', '.join(LOAD_BALANCING)}, got {self.load_balancing!r}")
        biggest = self.flit_wire_byte(self.transport_mtu_byte + max(self.header_write_byte, self.header_read_response_byte))
        if self.vl_buffer_byte < biggest:
            raise ValueError(f"ub.vl_buffer_byte ({self.vl_buffer_byte}) must hold one full packet ({biggest} B)")

    def flit_wire_byte(self, nbytes: int) -> int:
        """Bytes a packet of nbytes (header included) occupies on a link: whole flits."""
        return -(-nbytes // self.flit_byte) * self.flit_byte

    @property
    def link_rate_byte_per_s(self) -> int:
        # 224 Gb/s on the wire is 28 GB/s of payload-bearing bytes.
        return round(self.link_rate_gbit_per_s * 1e9 / 8)

    @property
    def cpu_link_rate_byte_per_s(self) -> int:
        return round(self.cpu_bandwidth_gbyte_per_s * 1e9 / self.cpu_ports)


@dataclass(frozen=True)
class D2DSpec:
    """The die-to-die link between the two dies of one 910C package."""

    rate_gbyte_per_s: float
    latency_ns: float
    sources: Mapping[str, str] = field(default_factory=_frozen_map, compare=False)

    def __post_init__(self):
        _require_positive(self, "d2d")

    @property
    def rate_byte_per_s(self) -> int:
        return round(self.rate_gbyte_per_s * 1e9)


@dataclass(frozen=True)
class RDMASpec:
    """The RDMA (RoCE) plane: one port per die into a non-blocking switch."""

    rate_gbit_per_s: float
    link_latency_ns: float
    mtu_byte: int
    header_byte: int
    switch_latency_ns: float
    sources: Mapping[str, str] = field(default_factory=_frozen_map, compare=False)

    def __post_init__(self):
        _require_positive(self, "rdma")

    @property
    def rate_byte_per_s(self) -> int:
        return round(self.rate_gbit_per_s * 1e9 / 8)


@dataclass(frozen=True)
class VPCSpec:
    """The VPC plane: Ethernet through each node's DPU (docs/machine.md 1, 2.6)."""

    node_rate_gbit_per_s: float
    host_link_gbyte_per_s: float
    link_latency_ns: float
    switch_latency_ns: float
    mtu_byte: int
    header_byte: int
    sources: Mapping[str, str] = field(default_factory=_frozen_map, compare=False)

    def __post_init__(self):
        _require_positive(self, "vpc")

    @property
    def node_rate_byte_per_s(self) -> int:
        return round(self.node_rate_gbit_per_s * 1e9 / 8)


@dataclass(frozen=True)
class EMSSpec:
    """The Elastic Memory Service pool (docs/machine.md 2.6) and model storage."""

    block_tokens: int
    dram_gbyte_per_cpu: float
    ssd_gbyte_per_s_per_node: float
    object_storage_gbyte_per_s: float
    sources: Mapping[str, str] = field(default_factory=_frozen_map, compare=False)

    def __post_init__(self):
        _require_positive(self, "ems")


@dataclass(frozen=True)
class CommSpec:
    """The die's communication engines (docs/machine.md 2.5): SDMA engines and AIV-Direct."""

    sdma_engines: int
    sdma_descriptor_startup_ns: float
    sdma_engine_gbyte_per_s: float
    flag_byte: int
    flag_poll_interval_ns: float
    aiv_remote_write_startup_ns: float
    aiv_remote_read_startup_ns: float
    aiv_max_outstanding_packets: int
    host_sync_ns: float
    sources: Mapping[str, str] = field(default_factory=_frozen_map, compare=False)

    def __post_init__(self):
        _require_positive(self, "comm")


@dataclass(frozen=True)
class SystemSpec:
    """A whole supernode: nodes of NPUs (two dies each) and CPUs on one UB fabric."""

    name: str
    description: str
    nodes: int
    npus_per_node: int
    dies_per_npu: int
    cpus_per_node: int
    die: DieSpec
    ub: UBSpec
    d2d: D2DSpec
    rdma: RDMASpec
    vpc: VPCSpec
    comm: CommSpec
    ems: EMSSpec
    sources: Mapping[str, str] = field(default_factory=_frozen_map, compare=False)

    def __post_init__(self):
        _require_positive(self, "")
        if self.ub.die_ports != self.ub.sub_planes:
            raise ValueError(
                f"ub.die_ports ({self.ub.die_ports}) must equal ub.sub_planes "
                f"({self.ub.sub_planes}): each die has one port to the L1 chip of each sub-plane"
            )
        if self.ub.cpu_ports != self.ub.sub_planes:
            raise ValueError(
                f"ub.cpu_ports ({self.ub.cpu_ports}) must equal ub.sub_planes ({self.ub.sub_planes})"
            )
        if self.ub.l2_chips_per_sub_plane > self.ub.l1_uplinks_per_chip:
            raise ValueError(
                f"ub.l2_chips_per_sub_plane ({self.ub.l2_chips_per_sub_plane}) exceeds "
                f"ub.l1_uplinks_per_chip ({self.ub.l1_uplinks_per_chip}): some L2 chip would "
                "have no link to some L1 chip"
            )
        endpoints = self.dies + self.cpus
        if endpoints > MAX_ENDPOINTS:
            raise ValueError(f"{self.dies:,} dies and {self.cpus:,} CPUs are {endpoints:,} endpoints, more than the "
                             f"{MAX_ENDPOINTS:,} the fabric numbers (nodes x npus_per_node x dies_per_npu, plus "
                             "nodes x cpus_per_node)")
        links = self.links_estimate
        if links > MAX_LINKS:
            raise ValueError(f"the system would have about {links:,} links, more than {MAX_LINKS:,} (2**22): "
                             "fewer nodes, sub-planes or L1 uplinks")
        ports_needed = -(-self.nodes * self.ub.l1_uplinks_per_chip // self.ub.l2_chips_per_sub_plane)
        if ports_needed > self.ub.l2_ports_per_chip:
            raise ValueError(
                f"{self.nodes} nodes x {self.ub.l1_uplinks_per_chip} uplinks need {ports_needed} "
                f"ports on some L2 chip, more than ub.l2_ports_per_chip ({self.ub.l2_ports_per_chip})"
            )

    @property
    def links_estimate(self) -> int:
        """Directed links of the topology (cmemu.topology.build_topology), at most, from the counts
        alone: UB ports of every endpoint, L1 uplinks, die-to-die, RDMA and VPC links."""
        e, p = self.dies + self.cpus, self.ub.sub_planes
        return (2 * e * p + 2 * self.nodes * p * self.ub.l1_uplinks_per_chip + self.dies + 2 * self.dies
                + 2 * e + 2 * self.nodes)

    @property
    def dies(self) -> int:
        return self.nodes * self.npus_per_node * self.dies_per_npu

    @property
    def npus(self) -> int:
        return self.nodes * self.npus_per_node

    @property
    def cpus(self) -> int:
        return self.nodes * self.cpus_per_node

    def to_dict(self) -> dict:
        """A JSON-able dict of every value and its source (stored in each timeline)."""
        return _to_dict(self)


def _to_dict(obj) -> dict:
    out = {}
    for f in dataclasses.fields(obj):
        v = getattr(obj, f.name)
        if dataclasses.is_dataclass(v):
            out[f.name] = _to_dict(v)
        elif f.name == "sources":
            out[f.name] = dict(v)
        else:
            out[f.name] = v
    return out
