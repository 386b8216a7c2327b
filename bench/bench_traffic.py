"""Synthetic traffic at moderate load (issue 20): how fast cmemu simulates packets, to set beside
other packet-level network simulators on the same traffic.

One point of the traffic scenario: uniform random destinations, Bernoulli arrivals at 50% of the
line rate, 512 B write packets, 2 us of warm-up and a 10 us window, on one sub-plane of
cloudmatrix384 (768 dies, one 28 GB/s port each: 48 L1 and 16 L2 switch chips), on both fabric
models. Reported: packets and packet-hops (a data packet crossing one link; acks aside) simulated
per second of the engine's wall time, and events per second.

Gated: ratios in the same run only. Both models accept the offered load (none saturates at 50%);
the message-level model simulates the same packets with fewer events.
"""
from cmemu.fabric import build_fabric
from cmemu.scenarios.traffic import Traffic, run_point, sub_plane_spec
from cmemu.spec import load_system
from cmemu.topology import build_topology

LOAD = 0.5


def test_uniform_traffic_point():
    spec = sub_plane_spec(load_system("cloudmatrix384"))
    topo = build_topology(spec)
    wire = spec.ub.flit_wire_byte(512 + spec.ub.header_write_byte)
    t = Traffic("uniform", "bernoulli", LOAD, 512, wire, spec.ub.link_rate_byte_per_s, 2_000_000, 10_000_000, 0)
    runs = {model: run_point(topo, build_fabric(topo, model=model), t, topo.num_dies) for model in ("packet", "message")}
    rows = {model: row for model, (row, _wall) in runs.items()}
    print()
    for model, (r, wall) in runs.items():
        print(f"uniform {LOAD:.0%} load, 512 B, one sub-plane of cloudmatrix384 ({topo.num_dies} dies), {model} model: "
              f"{r['packets']:,} packets, {r['events']:,} events in {wall:.2f} s: "
              f"{r['packets'] / wall / 1e6:.3f} M packets/s, {r['packet_hops'] / wall / 1e6:.3f} M packet-hops/s, "
              f"{r['events'] / wall / 1e6:.2f} M events/s; accepted {r['accepted_load_percent']:.2f}% of "
              f"{r['offered_load_percent']:.2f}% offered, latency mean {r['mean_latency_ns']:,.1f} ns, "
              f"p99 {r['p99_latency_ns']:,.1f} ns")
    packet, message = rows["packet"], rows["message"]
    assert packet["packets"] == message["packets"]
    for r in rows.values():
        assert not r["saturated"]
        assert abs(r["accepted_load_percent"] / r["offered_load_percent"] - 1) <= 0.02
    assert message["events"] < packet["events"]
