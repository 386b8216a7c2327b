"""The fabric the packet engine runs on: topology + spec compiled into flat integer arrays.

The topology's layer (beside cmemu.topology): the system's tables, not a lowering of the trace.

Everything the engine needs to move packets lives here as numpy arrays: per link its rate,
latency, credits per virtual lane and where its virtual output queues start; per endpoint its
start-up, target access latencies, sink rate, outstanding limit and issue times; the packet
format per path kind; and the routing tables (routes are computed hop by hop inside the engine
from these, so no per-packet route is ever stored).

Two virtual lanes: VL0 carries requests and write data, VL1 read responses, so that responses can
always drain (no request/response deadlock).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cmemu.errors import SpecError
from cmemu.topology import (
    L_CPU_DOWN,
    L_CPU_UP,
    L_D2D,
    L_DIE_DOWN,
    L_DIE_UP,
    L_L1_UP,
    L_L2_DOWN,
    V_DIE,
    V_L1,
    V_L2,
    Topology,
)
from cmemu.units import ns_to_ps
from cmemu.vocab import LB_HASH, LB_SPRAY

NUM_VLS = 2
# A message's path hash, which picks its first path (plane, L2 chip) deterministically:
# (m * PATH_HASH_MULT + src * 7919 + dst * 104729) mod 2**31 for message number m (Knuth's
# multiplicative hash spreads message numbers over the paths). The engine computes it.
PATH_HASH_MULT = 0x9E3779B1


# Messages an AIV initiator may have incomplete at once (the engine keeps their completion in a
# ring of this many): more than the kernels ever leave in flight between their waits.
AIV_MESSAGES_IN_FLIGHT = 32


def aiv_initiator(topo: Topology, die, aiv):
    """The initiator id of vector core ``aiv`` of ``die`` (ints or arrays): after every
    endpoint's own (cmemu.lower.comm: 16-bit ids)."""
    return topo.num_endpoints + np.asarray(die, dtype=np.int64) * topo.spec.die.aiv_cores + np.asarray(aiv)


def path_hashes(src, dst) -> np.ndarray:
    """The path hash of every message (int64), from its endpoints and its number."""
    h = np.arange(len(src), dtype=np.uint64) * np.uint64(PATH_HASH_MULT)
    h += np.asarray(src, dtype=np.uint64) * np.uint64(7919)
    h += np.asarray(dst, dtype=np.uint64) * np.uint64(104729)
    return (h % np.uint64(2**31)).astype(np.int64)


@dataclass
class Fabric:
    """Flat arrays for the engine. Build with :func:`build_fabric`."""

    # Links.
    link_rate_byte_per_s: np.ndarray  # int64 [L]
    link_latency_ps: np.ndarray  # int64 [L]
    link_credit_byte: np.ndarray  # int64 [L]: usable input buffer per VL at the link's far end
    link_dst_ep: np.ndarray  # int32 [L]: endpoint at the far end, or -1 (a switch)
    link_in_slot: np.ndarray  # int32 [L]: input slot at the far-end switch (-1 at an endpoint)
    # uint8 [L]: 1 if the far end is a switch with a queue per input link (L1, L2), where a packet
    # may join its next queue when sent (the queue's order is this link's order); 0 at a switch
    # with one FIFO for all inputs (RDMA, DPU, VPC), whose order is the order of arrival.
    link_own_queue: np.ndarray
    link_voq_base: np.ndarray  # int64 [L]: first VOQ of this output link
    link_voq_slots: np.ndarray  # int32 [L]: input slots feeding this output link
    num_voqs: int
    # Endpoints (dies, then CPUs).
    ep_node: np.ndarray  # int32 [E]
    ep_write_latency_ps: np.ndarray  # int64 [E]: as a target: data written to memory
    ep_read_latency_ps: np.ndarray  # int64 [E]: as a target: data read from memory
    ep_sink_byte_per_s: np.ndarray  # int64 [E]: rate writes are absorbed, 0 = not limiting
    ep_read_byte_per_s: np.ndarray  # int64 [E]: rate its memory serves reads (in arrival order), 0 = not limiting
    # Initiators: the endpoints' own (a die's DMA, a CPU), then every die's vector cores
    # (aiv_initiator), I = E + dies x aiv_per_die of them. An AIV's remote reads and writes are
    # issued by its MTE2/MTE3 (AIV-Direct), not by the die's DMA engines.
    ep_startup_ps: np.ndarray  # int64 [I]: from its op's start to its first packet
    ep_max_outstanding: np.ndarray  # int32 [I]: packets in flight
    ep_issue_ps: np.ndarray  # int64 [I * 2]: per-packet issue time, by message kind
    ini_msg_startup_ps: np.ndarray  # int64 [I * 2]: before each message's first packet, by kind (an AIV's; 0 for the rest)
    ini_tracked: np.ndarray  # uint8 [I]: 1 for an AIV: its messages' prep and flow apply (cmemu.lower.comm)
    aiv_per_die: int
    # Packet format, by path kind.
    path_mtu_byte: np.ndarray  # int64 [paths]
    path_flit_byte: np.ndarray  # int64 [paths]
    path_header_byte: np.ndarray  # int64 [paths * 4]: by packet type
    # Routing tables (see Topology).
    planes: int
    uplinks: int
    l2_chips: int
    l2_mult: int
    ep_up: np.ndarray  # int32 [E * P]
    ep_down: np.ndarray  # int32 [E * P]
    l1_uplink: np.ndarray  # int32 [N * P * U]
    l1_uplink_chip: np.ndarray  # int32 [N * P * U]
    l2_down: np.ndarray  # int32 [P * C * N * M]
    l2_down_count: np.ndarray  # int32 [P * C * N]
    d2d: np.ndarray  # int32 [D]
    rdma_up: np.ndarray  # int32 [D]
    rdma_down: np.ndarray  # int32 [D]
    vpc_host_up: np.ndarray  # int32 [E]
    vpc_host_down: np.ndarray  # int32 [E]
    vpc_dpu_up: np.ndarray  # int32 [N]
    vpc_dpu_down: np.ndarray  # int32 [N]
    load_balancing: int
    num_nodes: int
    link_alive: np.ndarray  # uint8 [L]: 0 for a link failed from the start (cmemu.faults)
    fail_time_ps: np.ndarray  # int64 [F]: failures during the run, in time order
    fail_ptr: np.ndarray  # int64 [F + 1]: failure k takes links fail_links[fail_ptr[k]:fail_ptr[k + 1]]
    fail_links: np.ndarray  # int32
    fail_die: np.ndarray  # int32 [F]: the die failure k takes, or -1
    retransmit_timeout_ps: int
    # The fabric model (see FABRIC_MODELS): the message-level fabric's look-ahead in ps; 0: every
    # packet is simulated on every link. aiv_lookahead_ps: the same for an AIV's writes.
    message_lookahead_ps: int = 0
    aiv_lookahead_ps: int = 0
    # The message-level fabric with back-pressure ("message-bp"): receive buffers bounded at
    # link_credit_byte, a full one blocking the link before it (Engine.buf_hold).
    message_backpressure: bool = False

    def direct_sinks(self) -> np.ndarray:
        """int32 [L]: per link, the die at its far end where a write's arrival may be worked out
        when the packet starts on the link (the packet fabric's Engine.try_transmit: no arrival
        event), else -1. The die takes a packet when it arrives (it has no sink rate), so all the
        arrival does is give its credit back and put it in memory, and the link's credits never
        hold a packet back: the link sends one packet after another and each holds its credit from
        its start to its arrival (its serialisation and the link's latency later), so those that
        hold one at once (those started in the last latency + longest serialisation) are at most
        that long at line rate plus one more packet; credits at least that never run out. Not a
        link that fails during the run (a packet on it then is lost when it arrives), and none on
        the message-level fabric (which reserves writes' paths whole)."""
        out = np.full(self.link_dst_ep.shape[0], -1, dtype=np.int32)
        if self.message_lookahead_ps > 0:
            return out
        wire = max(self.wire_bytes(path, ptype, int(mtu)) for path, mtu in enumerate(self.path_mtu_byte.tolist())
                   for ptype in range(4))
        rate = self.link_rate_byte_per_s.astype(object)  # (exact products, as the engine's 128 bits)
        ser = (wire * 10**12 + rate - 1) // rate
        on_link = (rate * (self.link_latency_ps.astype(object) + ser) + 10**12 - 1) // 10**12 + wire
        dst = self.link_dst_ep
        sink = np.zeros(dst.shape[0], dtype=np.int64)
        sink[dst >= 0] = self.ep_sink_byte_per_s[dst[dst >= 0]]
        ok = (dst >= 0) & (sink == 0) & (self.link_credit_byte.astype(object) >= on_link).astype(bool)
        ok[self.fail_links] = False
        out[ok] = dst[ok]
        return out

    def wire_bytes(self, path: int, ptype: int, payload: int) -> int:
        """Bytes a packet occupies on a link: payload + header, in whole flits."""
        flit = int(self.path_flit_byte[path])
        raw = payload + int(self.path_header_byte[path * 4 + ptype])
        return -(-raw // flit) * flit


# The fabric models a run can use (``cmemu run --fabric``), with their look-ahead in ps.
# "packet": every packet is simulated on every link (look-ahead 0). "message": a write packet has
# its whole path reserved when its initiator issues it (an endpoint's: once it would start on its
# port within the look-ahead, Engine.held_writes), each link's idle time at or after the
# packet is there, without events of its own; an initiator whose window is full issues in one
# event the packets whose window slots free within the next 1 us. Reads stay packets. 1 us is
# assumed: a few hundred packet times of a die's seven ports, short beside the tens of us a MoE
# dispatch takes. See docs/model.md, "Message-level fabric".
FABRIC_MODELS = {"packet": 0, "message": 1_000_000, "message-bp": 1_000_000}
# The message-level fabric's look-ahead for an AIV's writes, from its instructions' issue: the
# same 1 us as an endpoint's. Reserving further ahead reserves in an order further from the order
# packets reach a link (a packet reserved ahead keeps its slot against one that arrives first
# but is reserved later), and the results move: on the EP320 MoE dispatch + combine (96 tokens
# per die, 16 AIVs) and the 5-layer decode step, 0.25, 1 and 2 us agree within 0.1% and 5 us
# does not (the step 0.25% longer). Assumed: the largest look-ahead measured to have converged
# (docs/model.md, "Message-level fabric").
AIV_LOOKAHEAD_PS = {"packet": 0, "message": 1_000_000, "message-bp": 1_000_000}
# "message-bp": the message-level fabric with receive buffers bounded as the packet fabric's
# credits bound them: where a link's receive buffer, from the packets reserved through it, has no
# room for another packet, the link is blocked for all (docs/model.md, "Back-pressure").
BACKPRESSURE_MODELS = ("message-bp",)


def build_fabric(topo: Topology, failures=None, schedule=(), model: str = "packet") -> Fabric:
    """The fabric of a topology. ``failures`` (cmemu.faults.Failures) takes parts out of service
    from the start; ``schedule`` is [(time_ps, Failures)] of failures during the run; ``model``
    is a key of FABRIC_MODELS."""
    if model not in FABRIC_MODELS:
        raise ValueError(f"unknown fabric model {model!r}; choose from {', '.join(FABRIC_MODELS)}")
    if FABRIC_MODELS[model] and schedule:
        raise ValueError("the message-level fabric does not model failures during a run (a write's whole path "
                         "is reserved when it starts); use the packet model (--fabric packet)")
    spec = topo.spec
    ub, die = spec.ub, spec.die
    L = topo.num_links
    E = topo.num_endpoints
    nv = topo.vertex_kind.size
    rate = topo.link_rate_byte_per_s
    lat = topo.link_latency_ps

    # Credits: the receiver's buffer, less what is in flight while a credit travels back
    # (the engine returns credits the moment a packet leaves the buffer; in steady state the
    # return trip would hold back rate x latency bytes).
    if float(rate.max(initial=0)) * float(lat.max(initial=0)) < 2**62:
        in_flight = -(-rate * lat // 10**12)
    else:  # a fast link with a long latency: the product passes an int64 (exactly, in Python ints)
        in_flight = np.array([min(-(-r * t // 10**12), 2**62) for r, t in zip(rate.tolist(), lat.tolist())],
                             dtype=np.int64)
    credit = np.int64(ub.vl_buffer_byte) - in_flight
    # Credit-based flow control is UB's (and the die-to-die link's): the RDMA and VPC planes get
    # buffers that never fill (PFC and TCP are not modelled).
    lossless_ub = np.isin(topo.link_kind, [L_DIE_UP, L_DIE_DOWN, L_CPU_UP, L_CPU_DOWN, L_L1_UP, L_L2_DOWN, L_D2D])
    credit = np.where(lossless_ub, credit, np.int64(1) << 50)
    if np.any(credit < ub.flit_wire_byte(ub.transport_mtu_byte + ub.header_write_byte)):
        k = int(np.argmax(in_flight * lossless_ub))
        raise SpecError(f"ub.vl_buffer_byte ({ub.vl_buffer_byte:,} B) is too small to hold one packet beyond the "
                        f"bytes in flight while a credit travels back ({int(in_flight[k]):,} B at "
                        f"{int(rate[k]) / 1e9:,.3f} GB/s and {int(lat[k]) / 1e3:,.3f} ns on link {k}): raise it, or "
                        "lower the link rate or latency")

    kind = topo.vertex_kind
    dst_kind = kind[topo.link_dst]
    link_dst_ep = np.where(topo.link_dst < E, topo.link_dst, -1).astype(np.int32)
    # Input slots at VOQ switches (L1, L2): links into a switch, numbered in link order.
    voq_switch = (kind == V_L1) | (kind == V_L2)
    in_slot = np.full(L, -1, dtype=np.int32)
    slots_of_vertex = np.zeros(nv, dtype=np.int32)
    for link in range(L):
        v = topo.link_dst[link]
        if voq_switch[v]:
            in_slot[link] = slots_of_vertex[v]
            slots_of_vertex[v] += 1
        elif v >= E:  # the RDMA switch: output-queued, one FIFO per output
            in_slot[link] = 0
    src_kind = kind[topo.link_src]
    voq_slots = np.where(voq_switch[topo.link_src], slots_of_vertex[topo.link_src], 1).astype(np.int32)
    voq_base = np.zeros(L, dtype=np.int64)
    np.cumsum(voq_slots[:-1].astype(np.int64) * NUM_VLS, out=voq_base[1:])
    num_voqs = int(voq_slots.sum()) * NUM_VLS
    del dst_kind, src_kind

    ep_node = np.array([topo.endpoint_node(e) for e in range(E)], dtype=np.int32)
    is_die = kind[:E] == V_DIE
    cycle_ps = 1e6 / die.ai_core_clock_mhz
    ep_write = np.where(is_die, round(die.hbm_write_latency_cycles * cycle_ps), ns_to_ps(ub.cpu_memory_write_latency_ns))
    ep_read = np.where(is_die, round(die.hbm_read_latency_cycles * cycle_ps), ns_to_ps(ub.cpu_memory_read_latency_ns))
    # A die absorbs writes into HBM at 1.6 TB/s, far above its 196 GB/s of UB: not limiting.
    ep_sink = np.where(is_die, 0, round(ub.cpu_memory_write_gbyte_per_s * 1e9)).astype(np.int64)
    # Likewise a die serves reads from HBM far above its UB rate; a CPU from its DRAM at its own
    # rate, one read packet after the other: dies reading one socket queue there (the EMS pool).
    ep_read_rate = np.where(is_die, 0, round(ub.cpu_memory_read_gbyte_per_s * 1e9)).astype(np.int64)
    # Initiators: the endpoints' own, then each die's AIVs (aiv_initiator).
    A = die.aiv_cores
    n_ini = E + topo.num_dies * A
    if n_ini > 2**16:
        raise ValueError(f"{n_ini:,} initiators (endpoints and every die's {A} AIVs): cmemu numbers them with "
                         "16-bit ids, at most 65,536")
    issue = np.empty(n_ini * 2, dtype=np.int64)
    issue[0:2 * E:2] = ns_to_ps(ub.write_issue_ns)
    issue[1:2 * E:2] = ns_to_ps(ub.read_issue_ns)
    # An AIV puts a packet's payload out through its MTE3 (writes) and takes a read's data in
    # through its MTE2: one MTU at the pipe's rate [INI], [CYC].
    mtu = ub.transport_mtu_byte
    issue[2 * E::2] = round(-(-mtu // die.mte3_byte_per_cycle) * cycle_ps)
    issue[2 * E + 1::2] = round(-(-mtu // die.aiv_mte2_byte_per_cycle) * cycle_ps)
    startup = np.full(n_ini, ns_to_ps(ub.initiator_startup_ns), dtype=np.int64)
    startup[E:] = 0  # an AIV's start-up is per message (below), not per op
    msg_startup = np.zeros(n_ini * 2, dtype=np.int64)
    msg_startup[2 * E::2] = ns_to_ps(spec.comm.aiv_remote_write_startup_ns)
    msg_startup[2 * E + 1::2] = ns_to_ps(spec.comm.aiv_remote_read_startup_ns)
    # The engine keeps these per initiator in 32 bits of ps (2.1 ms): say which parameter is past it.
    checks = [("ub.write_issue_ns", issue[0]), ("ub.read_issue_ns", issue[1])]
    if n_ini > E:  # the AIVs'
        checks += [("die.mte3_byte_per_cycle (an AIV's write issue time)", issue[2 * E]),
                   ("die.aiv_mte2_byte_per_cycle (an AIV's read issue time)", issue[2 * E + 1]),
                   ("comm.aiv_remote_write_startup_ns", msg_startup[2 * E]),
                   ("comm.aiv_remote_read_startup_ns", msg_startup[2 * E + 1])]
    for name, v in checks:
        if v > 2**31 - 1:
            raise SpecError(f"{name} gives {int(v) / 1e6:,.3f} us per packet or message; cmemu holds at most "
                            f"{(2**31 - 1) / 1e6:,.3f} us there")
    max_out = np.full(n_ini, ub.max_outstanding_packets, dtype=np.int32)
    max_out[E:] = spec.comm.aiv_max_outstanding_packets
    tracked = np.zeros(n_ini, dtype=np.uint8)
    tracked[E:] = 1

    ub_headers = [ub.header_write_byte, ub.header_read_request_byte, ub.header_read_response_byte, ub.header_ack_byte]
    headers = np.array(ub_headers + ub_headers + [spec.rdma.header_byte] * 4 + [spec.vpc.header_byte] * 4,
                       dtype=np.int64)

    return Fabric(
        link_rate_byte_per_s=rate,
        link_latency_ps=lat,
        link_credit_byte=credit.astype(np.int64),
        link_dst_ep=link_dst_ep,
        link_in_slot=in_slot,
        link_own_queue=voq_switch[topo.link_dst].astype(np.uint8),
        link_voq_base=voq_base,
        link_voq_slots=voq_slots,
        num_voqs=num_voqs,
        ep_node=ep_node,
        ep_write_latency_ps=ep_write.astype(np.int64),
        ep_read_latency_ps=ep_read.astype(np.int64),
        ep_sink_byte_per_s=ep_sink,
        ep_read_byte_per_s=ep_read_rate,
        ep_startup_ps=startup,
        ep_max_outstanding=max_out,
        ep_issue_ps=issue,
        ini_msg_startup_ps=msg_startup,
        ini_tracked=tracked,
        aiv_per_die=A,
        path_mtu_byte=np.array([ub.transport_mtu_byte, ub.transport_mtu_byte, spec.rdma.mtu_byte, spec.vpc.mtu_byte],
                               dtype=np.int64),
        path_flit_byte=np.array([ub.flit_byte, ub.flit_byte, 1, 1], dtype=np.int64),
        path_header_byte=headers,
        planes=ub.sub_planes,
        uplinks=ub.l1_uplinks_per_chip,
        l2_chips=ub.l2_chips_per_sub_plane,
        l2_mult=int(topo.l2_down.shape[3]),
        ep_up=topo.ep_up.ravel().astype(np.int32),
        ep_down=topo.ep_down.ravel().astype(np.int32),
        l1_uplink=topo.l1_uplink.ravel().astype(np.int32),
        l1_uplink_chip=topo.l1_uplink_chip.ravel().astype(np.int32),
        l2_down=topo.l2_down.ravel().astype(np.int32),
        l2_down_count=topo.l2_down_count.ravel().astype(np.int32),
        d2d=topo.d2d.astype(np.int32),
        rdma_up=topo.rdma_up.astype(np.int32),
        rdma_down=topo.rdma_down.astype(np.int32),
        vpc_host_up=topo.vpc_host_up.astype(np.int32),
        vpc_host_down=topo.vpc_host_down.astype(np.int32),
        vpc_dpu_up=topo.vpc_dpu_up.astype(np.int32),
        vpc_dpu_down=topo.vpc_dpu_down.astype(np.int32),
        load_balancing=LB_SPRAY if ub.load_balancing == "spray" else LB_HASH,
        num_nodes=spec.nodes,
        link_alive=_alive(L, failures),
        **_schedule(schedule),
        retransmit_timeout_ps=ns_to_ps(ub.retransmit_timeout_ns),
        message_lookahead_ps=FABRIC_MODELS[model],
        aiv_lookahead_ps=AIV_LOOKAHEAD_PS[model],
        message_backpressure=model in BACKPRESSURE_MODELS,
    )


def _schedule(schedule) -> dict:
    times, ptr, links, dies = [], [0], [], []
    for at_ps, f in sorted(schedule, key=lambda x: x[0]):
        if len(f.dies) > 1:
            for d in sorted(f.dies)[1:]:
                raise ValueError(f"one scheduled failure may take one die, not die {d} too")
        times.append(at_ps)
        links.extend(sorted(f.links))
        ptr.append(len(links))
        dies.append(next(iter(f.dies)) if f.dies else -1)
    return {"fail_time_ps": np.asarray(times, dtype=np.int64), "fail_ptr": np.asarray(ptr, dtype=np.int64),
            "fail_links": np.asarray(links, dtype=np.int32), "fail_die": np.asarray(dies, dtype=np.int32)}


def _alive(n_links: int, failures) -> np.ndarray:
    alive = np.ones(n_links, dtype=np.uint8)
    if failures is not None and failures.links:
        alive[sorted(failures.links)] = 0
    return alive
