"""COMM_SEND / COMM_RECV: messages split into packets on fixed routes (the UB stand-in).

A message is cut into packets of at most the transport MTU. Over UB, packet k goes on sub-plane
k mod 7 (per-packet spraying over the planes) and, between nodes, through one L2 chip per plane
chosen by a deterministic hash of the (source, destination, message) triple; between the two
dies of one NPU it takes the die-to-die link; with ``cmemu.plane = "rdma"`` it crosses the RDMA
switch. Every link forwards whole packets, FIFO, at its line rate plus its latency (store and
forward). Issue 3 replaces this with the packet model (headers, credits, VOQs, arbitration).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from cmemu.topology import Topology


@dataclass
class MessageTable:
    """Messages and packets in the flat form the engine reads (CSR-style lists)."""

    send_op: list = field(default_factory=list)
    recv_op: list = field(default_factory=list)
    nbytes: list = field(default_factory=list)
    chunk_ptr: list = field(default_factory=lambda: [0])
    chunk_msg: list = field(default_factory=list)
    chunk_bytes: list = field(default_factory=list)
    chunk_route_lo: list = field(default_factory=list)
    chunk_route_hi: list = field(default_factory=list)
    route_links: list = field(default_factory=list)
    _route_cache: dict = field(default_factory=dict)

    def _route(self, key, links) -> tuple[int, int]:
        span = self._route_cache.get(key)
        if span is None:
            lo = len(self.route_links)
            self.route_links.extend(links)
            span = (lo, len(self.route_links))
            self._route_cache[key] = span
        return span

    def add(self, topo: Topology, src: int, dst: int, nbytes: int, plane: str, send_op: int, recv_op: int) -> int:
        msg = len(self.send_op)
        self.send_op.append(send_op)
        self.recv_op.append(recv_op)
        self.nbytes.append(nbytes)
        spec = topo.spec
        if plane == "rdma":
            mtu = spec.rdma.mtu_byte
            spans = [self._route(("rdma", src, dst), topo.rdma_route(src, dst))]
        elif topo.is_twin(src, dst):
            mtu = spec.ub.transport_mtu_byte
            spans = [self._route(("d2d", src), [int(topo.d2d[src])])]
        else:
            mtu = spec.ub.transport_mtu_byte
            # Spread messages of a pair over the L2 chips: the uplink index is a hash of
            # the endpoints and the message number.
            uplink = (src * 7919 + dst * 104729 + msg) % spec.ub.l1_uplinks_per_chip
            same_node = topo.endpoint_node(src) == topo.endpoint_node(dst)
            spans = []
            for p in range(spec.ub.sub_planes):
                key = ("ub", src, dst, p, 0 if same_node else uplink)
                spans.append(self._route(key, topo.ub_route(src, dst, p, uplink)))
        n_packets = max(1, -(-nbytes // mtu))
        for k in range(n_packets):
            lo, hi = spans[k % len(spans)]
            self.chunk_msg.append(msg)
            self.chunk_bytes.append(min(mtu, nbytes - k * mtu) if nbytes else 0)
            self.chunk_route_lo.append(lo)
            self.chunk_route_hi.append(hi)
        self.chunk_ptr.append(len(self.chunk_msg))
        return msg
