"""MoE dispatch + combine at EP320 (issue 5): 320 dies, 96 tokens per die, top-8, AIV-Direct.

Budget (issue 5): <= 5 s wall for lowering and simulating one dispatch and one combine; reported,
not gated (absolute times are not gated on shared machines). Gated: the cost per event against the
same kernel on a small workload measured in the same run, and the lowering's cost per op against
a small lowering (both must stay within a constant factor as the work grows ~100x).
"""
import json
import time

import numpy as np

from cmemu._core import make_engine
from cmemu._core.synthetic import traffic_workload
from cmemu.fabric import build_fabric
from cmemu.lower import lower
from cmemu.scenarios.common import trace_doc
from cmemu.scenarios.moe_comm import moe_nodes
from cmemu.spec import load_system
from cmemu.topology import build_topology
from cmemu.trace import load_trace

# The EP320 run's state (15 K AIV initiators, the links' calendars) is out of cache and the mini run's
# is not: 3.8-6.4x measured, the higher on a loaded machine whose shared cache the other work takes.
# A cost that grew with the work (~100x here) would be far above it.
MAX_EVENT_COST_RATIO = 10.0
MAX_LOWER_COST_RATIO = 4.0


def _lowered(tmp_path, system, ep, tokens):
    spec = load_system(system)
    ranks = list(range(ep))
    doc = trace_doc(spec, moe_nodes(ranks, tokens, 8, 7168, "aiv", None, 0.0, 0, True), groups={"ep": ranks})
    path = tmp_path / f"ep{ep}.json"
    path.write_text(json.dumps(doc))
    topo = build_topology(spec)
    trace = load_trace(path, topo.num_dies)
    t0 = time.perf_counter()
    lowered = lower(trace, topo)
    return topo, lowered, time.perf_counter() - t0


def _run(lowered, fabric):
    engine = make_engine(lowered, fabric)
    t0 = time.perf_counter()
    engine.run()
    return engine, time.perf_counter() - t0


def test_ep320_dispatch_combine(benchmark, tmp_path):
    _lowered(tmp_path, "mini", 8, 12)  # what a process does once (imports, Numba's cache) before either
    topo, lowered, lower_s = _lowered(tmp_path, "cloudmatrix384", 320, 96)
    fabric = build_fabric(topo)
    engine, sim_s = benchmark.pedantic(_run, args=(lowered, fabric), rounds=1, iterations=1)
    assert engine.ops_done == lowered.num_ops and engine.packets_live == 0
    rate = engine.events / sim_s

    # The small lowering takes milliseconds: its best of five stands for its cost.
    small_topo, small_lowered, small_lower_s = min((_lowered(tmp_path, "mini", 8, 12) for _ in range(5)),
                                                   key=lambda r: r[2])
    mini = build_topology(load_system("mini"))
    small = traffic_workload(mini, messages=3000, seed=1)
    small_fabric = build_fabric(mini)
    small_rate = max(e.events / dt for e, dt in (_run(small, small_fabric) for _ in range(3)))
    ratio = small_rate / rate
    lower_ratio = (lower_s / lowered.num_ops) / (small_lower_s / small_lowered.num_ops)
    benchmark.extra_info.update(ops=lowered.num_ops, messages=lowered.num_messages, events=engine.events,
                                lower_s=round(lower_s, 3), simulate_s=round(sim_s, 3),
                                events_per_s=round(rate), cost_ratio_vs_mini=round(ratio, 2))
    print(f"\nEP320 dispatch + combine (96 tokens/die, top-8, AIV-Direct): {lowered.num_ops:,} ops, "
          f"{lowered.num_messages:,} messages, {engine.events:,} events; lowering {lower_s:.2f} s + simulation "
          f"{sim_s:.2f} s = {lower_s + sim_s:.2f} s wall (budget 5 s); {rate / 1e6:.2f} M events/s "
          f"({ratio:.1f}x the cost per event on mini); simulated {engine.now / 1e6:.1f} us; "
          f"lowering cost per op {lower_ratio:.1f}x that of EP8")
    assert ratio <= MAX_EVENT_COST_RATIO
    assert lower_ratio <= MAX_LOWER_COST_RATIO


MIN_MESSAGE_SPEEDUP = 2.0
# The packet model resolves this case no better than about 2%: the order of packets ready at one
# picosecond (nothing physical) gave its combine 108.3-110.6 us over four orders (the scheduled
# one before and after the AIVs' direct sinks, two drawn at random on the reference; mean 109.9),
# and the message-level fabric's 107.1 us is -1.1% to -3.2% from them (-2.5% from the mean; the
# dispatch -0.8% to -1.3%). A gate of 3% against one order failed on a tie going the other way.
# So: the error from the mean plus the spread (2.2%), rounded up; it still catches a model that
# breaks.
MAX_MESSAGE_ERROR = 0.05


def test_ep320_message_fabric(benchmark, tmp_path):
    """The same EP320 dispatch + combine on the message-level fabric (`--fabric message`), against
    the packet model in the same run. Gated: at least MIN_MESSAGE_SPEEDUP times faster, and each
    collective's latency (slowest rank) within MAX_MESSAGE_ERROR of the packet model's."""
    topo, lowered, _ = _lowered(tmp_path, "cloudmatrix384", 320, 96)
    packet, packet_s = _run(lowered, build_fabric(topo))
    message, message_s = benchmark.pedantic(_run, args=(lowered, build_fabric(topo, model="message")),
                                            rounds=1, iterations=1)
    assert message.ops_done == lowered.num_ops and message.packets_live == 0

    def latency(engine, name):
        # A collective's node spans from its entry op's start (op_report_start) to its exit's end.
        i = lowered.op_name.index(name)
        part = np.arange(i, i + 320)
        start = np.asarray(engine.op_start_ps)[lowered.op_report_start[part]]
        return int((np.asarray(engine.op_end_ps)[part] - start).max())

    errors = {n: latency(message, n) / latency(packet, n) - 1 for n in ("moe_dispatch", "moe_combine")}
    speedup = packet_s / message_s
    benchmark.extra_info.update(packet_events=packet.events, message_events=message.events,
                                packet_s=round(packet_s, 3), message_s=round(message_s, 3),
                                speedup=round(speedup, 2), **{f"{n}_error": round(e, 4) for n, e in errors.items()})
    print(f"\nEP320 dispatch + combine, message-level fabric: {message.events:,} events in {message_s:.2f} s "
          f"against {packet.events:,} in {packet_s:.2f} s on the packet model ({speedup:.1f}x faster); "
          f"latency {', '.join(f'{n} {e * 100:+.1f}%' for n, e in errors.items())}")
    assert speedup >= MIN_MESSAGE_SPEEDUP
    assert all(abs(e) <= MAX_MESSAGE_ERROR for e in errors.values())
