"""traffic: latency-load curves of the UB fabric under synthetic traffic, as network simulators
are judged by.

Every sending die (an endpoint of the fabric) injects write packets of ``--packet-size`` bytes
(one packet each: at most the transport MTU) at a fraction of its line rate, open loop: packet
k is created at its arrival time whether or not the ones before it have left (they wait in the
die's DMA queue, which counts in their latency). The line rate is the die's UB injection rate
on the fabric simulated: one port (28 GB/s) on one sub-plane (``--scope sub-plane``: the system
with one sub-plane, each die one port to its node's L1 chip of it), all seven on the whole UB
fabric. Load 1 is the die's ports busy all the time with the packets' wire bytes (payload and
header in whole flits); acks travel back on the same links and are not counted in it.

Arrivals (seeded, ``--seed``): ``bernoulli``, a packet in each packet time (the wire time of one
packet at the line rate) with probability ``load``; ``poisson``, exponential gaps of mean one
packet time / ``load``. Destinations (``--pattern``), always another die than the sender and
its twin (the two dies of an NPU talk over their die-to-die link, not UB):

- ``uniform``: each packet to a die drawn uniformly;
- ``permutation``: each die to one fixed partner, a seeded random derangement;
- ``incast``: ``--incast-senders`` dies (seeded) all to die 0, the others idle;
- ``all-to-all``: each die to every other in turn, staggered (die i's k-th packet to die
  i + 1 + k, skipping itself and its twin).

Packets are created over a warm-up and a measured window, and the run then drains. Reported
per load: offered load (the wire bytes of the packets created in the window, per sender, over
the window's length times the line rate), accepted load (the same of the packets delivered in
the window: their data in the target's memory), the mean and 99th percentile of the latency of
the packets created in the window (creation to delivery: the source queue, the initiator's
start-up, the hops and the target's memory write), and whether the point is saturated:
accepted below SATURATED_SHARE of offered; and the packets, packet-hops (a data packet crossing
one link) and events simulated. Any of the fabric models, on the same packets (``--fabric
packet,message,message-bp``; ``both``: packet and message): the packet model, with credit flow
control, the message-level one, and the message-level one with back-pressure (docs/model.md).
"""
from __future__ import annotations

import dataclasses
import time

import click
import numpy as np

from cmemu.errors import CmemuError
from cmemu.scenarios.common import scenario_command

PATTERNS = ("uniform", "permutation", "incast", "all-to-all")
ARRIVALS = ("bernoulli", "poisson")
SCOPES = ("sub-plane", "ub")
# A point whose accepted load is below this share of its offered load is saturated: assumed, a
# margin over the window's edge effects (packets created before it delivered in it and the
# reverse), which are a few percent at most on windows of several latencies.
SATURATED_SHARE = 0.95
DEFAULT_LOADS = "0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8,0.9"


@dataclasses.dataclass(frozen=True)
class Traffic:
    """One offered load: what the generator needs (times in ps)."""

    pattern: str
    arrival: str
    load: float  # fraction of the line rate
    packet_byte: int
    wire_byte: int  # on a link: payload + header in whole flits
    line_rate_byte_per_s: float
    warmup_ps: int
    window_ps: int
    seed: int
    incast_senders: int = 8

    @property
    def slot_ps(self) -> float:
        """One packet's wire time at the line rate."""
        return self.wire_byte * 1e12 / self.line_rate_byte_per_s


def sub_plane_spec(spec):
    """The system with one sub-plane: each die and CPU one port, to its node's L1 chip of it."""
    ub = dataclasses.replace(spec.ub, sub_planes=1, die_ports=1, cpu_ports=1)
    return dataclasses.replace(spec, ub=ub)


def _twin(dies: int, dies_per_npu: int, d):
    return np.asarray(d) ^ 1 if dies_per_npu == 2 else np.full(np.shape(d), -1)


def arrival_times(rng, senders: int, t: Traffic) -> list[np.ndarray]:
    """Each sender's packet creation times (int64 ps, increasing) over warm-up + window."""
    horizon = t.warmup_ps + t.window_ps
    slot = t.slot_ps
    out = []
    if t.arrival == "bernoulli":
        slots = int(horizon // slot)
        for _ in range(senders):  # one sender's slots at a time: memory stays one row
            out.append(np.round(np.flatnonzero(rng.random(slots) < t.load) * slot).astype(np.int64))
        return out
    mean = slot / t.load
    expect = horizon / mean
    for _ in range(senders):
        n = int(expect + 6 * np.sqrt(expect) + 16)
        times = np.cumsum(rng.exponential(mean, n))
        while times[-1] < horizon:  # (never in practice: six standard deviations of room)
            times = np.concatenate([times, times[-1] + np.cumsum(rng.exponential(mean, n))])
        out.append(np.round(times[times < horizon]).astype(np.int64))
    return out


def senders_of(rng, dies: int, dies_per_npu: int, t: Traffic) -> np.ndarray:
    if t.pattern != "incast":
        return np.arange(dies)
    allowed = np.array([d for d in range(1, dies) if d != _twin(dies, dies_per_npu, 0)])
    if not 1 <= t.incast_senders <= allowed.size:
        raise CmemuError(f"--incast-senders must be 1 to {allowed.size} on {dies} dies, got {t.incast_senders}")
    return np.sort(rng.choice(allowed, t.incast_senders, replace=False))


def destinations(rng, src: int, count: int, dies: int, dies_per_npu: int, t: Traffic, partner=None) -> np.ndarray:
    """The destinations of ``count`` packets of die ``src`` (module docstring)."""
    twin = int(_twin(dies, dies_per_npu, src))
    if t.pattern == "incast":
        return np.zeros(count, dtype=np.int64)
    if t.pattern == "permutation":
        return np.full(count, partner[src], dtype=np.int64)
    others = np.array([d for d in range(dies) if d != src and d != twin], dtype=np.int64)
    if t.pattern == "uniform":
        return others[rng.integers(0, others.size, count)]
    # all-to-all: src + 1, src + 2, ... in turn
    order = np.concatenate([others[others > src], others[others < src]])
    return order[np.arange(count) % order.size]


def derangement(rng, dies: int, dies_per_npu: int) -> np.ndarray:
    """A seeded random partner per die: never itself nor its twin."""
    if dies - (2 if dies_per_npu == 2 else 1) < 1:
        raise CmemuError(f"the permutation pattern needs more than {dies} dies")
    for _ in range(10_000):
        perm = rng.permutation(dies)
        if not np.any(perm == np.arange(dies)) and not np.any(perm == _twin(dies, dies_per_npu, np.arange(dies))):
            return perm
    raise CmemuError(f"found no permutation of {dies} dies without a die or its twin as its own partner")


def generate(t: Traffic, dies: int, dies_per_npu: int):
    """(src, dst, created_ps) of every packet, by sender then time."""
    rng = np.random.default_rng(t.seed)
    senders = senders_of(rng, dies, dies_per_npu, t)
    partner = derangement(rng, dies, dies_per_npu) if t.pattern == "permutation" else None
    times = arrival_times(rng, senders.size, t)
    src = np.repeat(senders, [x.size for x in times])
    dst = np.concatenate([destinations(rng, int(s), x.size, dies, dies_per_npu, t, partner)
                          for s, x in zip(senders, times)]) if times else np.zeros(0, np.int64)
    created = np.concatenate(times) if times else np.zeros(0, np.int64)
    return src, dst, created, senders.size


def build_run(topo, src, dst, created, packet_byte: int):
    """The engine input: per sender a chain of delays (COMP ops of the gaps between its arrivals),
    each packet's send op after its delay, and a receive op on its target."""
    from cmemu.lower import OP_KIND_COMP, OP_KIND_RECV, OP_KIND_SEND, lowered_from_parts
    from cmemu.lower.comm import MessageTable

    n = src.size
    # ops: [delay, send] per packet (in packet order), then the receives
    first = np.ones(n, dtype=bool)
    first[1:] = src[1:] != src[:-1]
    gap = np.diff(created, prepend=0)
    gap[first] = created[first]
    delay, send, recv = np.arange(0, 2 * n, 2), np.arange(1, 2 * n, 2), 2 * n + np.arange(n)
    kind = np.concatenate([np.tile([OP_KIND_COMP, OP_KIND_SEND], n), np.full(n, OP_KIND_RECV)])
    dur = np.zeros(3 * n, dtype=np.int64)
    dur[delay] = gap
    chain = ~first[1:]
    succ_src = np.concatenate([delay, delay[:-1][chain]])
    succ_dst = np.concatenate([send, delay[1:][chain]])
    table = MessageTable()
    table.add_many(topo, src, dst, np.full(n, packet_byte), send, recv)
    op_msg = np.concatenate([np.repeat(np.arange(n), 2), np.arange(n)])
    op_msg[delay] = -1
    rank = np.concatenate([np.repeat(src, 2), dst])
    return lowered_from_parts(kind, dur, succ_src, succ_dst, table, op_msg=op_msg, rank=rank)


def run_point(topo, fabric, t: Traffic, dies: int) -> tuple[dict, float]:
    """Simulate one offered load: its row (module docstring) and the engine's wall time in s (not
    in the row, which holds only what the model predicts: bench/bench_traffic.py reports the
    simulation's speed)."""
    from cmemu.run.pipeline import simulate

    src, dst, created, senders = generate(t, dies, topo.spec.dies_per_npu)
    if src.size == 0:
        raise CmemuError(f"load {t.load} creates no packet in the window; raise --load or --window-us")
    lowered = build_run(topo, src, dst, created, t.packet_byte)
    start = time.perf_counter()
    engine = simulate(lowered, fabric)
    wall = time.perf_counter() - start
    delivered = np.asarray(engine.msg_delivered_ps)
    lo, hi = t.warmup_ps, t.warmup_ps + t.window_ps
    made = (created >= lo) & (created < hi)
    done = (delivered >= lo) & (delivered < hi)
    capacity = senders * t.window_ps * 1e-12 * t.line_rate_byte_per_s  # wire bytes the window can take
    latency = (delivered[made] - created[made]) / 1e3  # ns
    node = np.asarray([topo.endpoint_node(int(e)) for e in range(dies)])
    hops = int(np.where(node[src] == node[dst], 2, 4).sum())  # die -> L1 (-> L2 -> L1) -> die
    offered = made.sum() * t.wire_byte / capacity
    accepted = done.sum() * t.wire_byte / capacity
    return {
        "requested_load_percent": round(100 * t.load, 1),
        "offered_load_percent": round(100 * offered, 2),
        "accepted_load_percent": round(100 * accepted, 2),
        "mean_latency_ns": round(float(latency.mean()), 1) if latency.size else None,
        "p99_latency_ns": round(float(np.percentile(latency, 99)), 1) if latency.size else None,
        "saturated": bool(accepted < SATURATED_SHARE * offered),
        "packets": int(src.size),
        "packet_hops": hops,
        "events": int(engine.events),
    }, wall


def parse_loads(text: str) -> list[float]:
    out = []
    for part in str(text).split(","):
        try:
            v = float(part)
        except ValueError:
            raise CmemuError(f"--load takes fractions of the line rate such as 0.1,0.5; got {part.strip()[:40]!r}") \
                from None
        if not 0 < v <= 1:
            raise CmemuError(f"--load {v}: a load is a fraction of the line rate, in (0, 1]")
        out.append(v)
    return out


def parse_fabrics(text: str) -> tuple[str, ...]:
    """``--fabric``: fabric models, comma-separated, in the order given, each once (``both``:
    packet and message)."""
    from cmemu.fabric import FABRIC_MODELS

    out = []
    for part in str(text).split(","):
        name = part.strip()
        for model in (("packet", "message") if name == "both" else (name,)):
            if model not in FABRIC_MODELS:
                raise CmemuError(f"--fabric: {name[:40]!r} is not one of {', '.join(FABRIC_MODELS)} or both")
            if model not in out:
                out.append(model)
    return tuple(out)


def latency_plot(path, curves: dict, title: str):
    """Mean and p99 latency, and accepted load, against offered load, per fabric model."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from cmemu.output.atomic import atomic_files

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4.2))
    for fabric, rows in curves.items():
        x = [r["offered_load_percent"] for r in rows]
        line = ax.plot(x, [r["mean_latency_ns"] for r in rows], marker="o", label=f"{fabric}: mean")[0]
        ax.plot(x, [r["p99_latency_ns"] for r in rows], marker="^", ls="--", color=line.get_color(),
                label=f"{fabric}: p99")
        bx.plot(x, [r["accepted_load_percent"] for r in rows], marker="o", label=fabric)
    top = max(max(r["offered_load_percent"] for r in rows) for rows in curves.values())
    bx.plot([0, top], [0, top], color="grey", lw=0.8, ls=":", label="accepted = offered")
    ax.set(xlabel="offered load (% of line rate)", ylabel="packet latency (ns)", yscale="log", title=title)
    bx.set(xlabel="offered load (% of line rate)", ylabel="accepted load (% of line rate)", title="throughput")
    ax.legend(fontsize=8)
    bx.legend(fontsize=8)
    with atomic_files([path], "wb") as (f,):
        fig.savefig(f, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)


@scenario_command("traffic")
@click.option("--pattern", type=click.Choice(PATTERNS), default="uniform", show_default=True,
              help="Destinations: uniform random, a fixed permutation, N dies into one, or each to all in turn.")
@click.option("--load", "loads", default=DEFAULT_LOADS, show_default=True,
              help="Offered loads, fractions of each sender's line rate.")
@click.option("--packet-size", default="512", show_default=True, help="Payload bytes per packet (at most the MTU).")
@click.option("--arrival", type=click.Choice(ARRIVALS), default="bernoulli", show_default=True,
              help="Arrival process of each sender (seeded).")
@click.option("--scope", type=click.Choice(SCOPES), default="sub-plane", show_default=True,
              help="sub-plane: one sub-plane, one port per die; ub: the whole UB fabric, every port.")
@click.option("--dies", type=click.IntRange(min=4), default=None,
              help="Dies taking part: the first N [default: all].")
@click.option("--incast-senders", type=click.IntRange(min=1), default=8, show_default=True,
              help="incast: dies writing to die 0.")
@click.option("--warmup-us", type=click.FloatRange(min=0), default=2.0, show_default=True,
              help="Packets created before the window (not measured).")
@click.option("--window-us", type=click.FloatRange(min=0, min_open=True), default=10.0, show_default=True,
              help="The measured window.")
@click.option("--fabric", "fabric", default="packet", show_default=True, metavar="MODEL[,MODEL...]",
              help="Fabric models (as `cmemu run --fabric`: packet, message, message-bp), comma-separated, each on "
                   "the same packets; both: packet,message.")
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True)
@click.option("--plots", type=click.Path(file_okay=False), default=None, metavar="DIR",
              help="Also write the latency-load curve as a PNG into DIR.")
def command(spec, pattern, loads, packet_size, arrival, scope, dies, incast_senders, warmup_us, window_us, fabric,
            seed, plots):
    """Latency-load curves: open-loop write packets at fractions of each die's line rate
    (uniform, permutation, incast, all-to-all; Bernoulli or Poisson arrivals) on one sub-plane
    or the whole UB fabric: offered vs accepted load, mean and p99 latency, saturation."""
    from cmemu.fabric import build_fabric
    from cmemu.units import parse_size
    from cmemu.topology import build_topology

    load_list = parse_loads(loads)
    size = parse_size(packet_size, "--packet-size")
    if size > spec.ub.transport_mtu_byte:
        raise CmemuError(f"--packet-size {size} is more than the transport MTU ({spec.ub.transport_mtu_byte} B): "
                         "one packet per message")
    run_spec = sub_plane_spec(spec) if scope == "sub-plane" else spec
    topo = build_topology(run_spec)
    dies = dies or topo.num_dies
    if dies > topo.num_dies:
        raise CmemuError(f"--dies {dies}: {spec.name} has {topo.num_dies}")
    if plots is not None:
        from cmemu.output.atomic import output_folder

        plots = output_folder(plots)
    line_rate = run_spec.ub.die_ports * run_spec.ub.link_rate_byte_per_s
    wire = run_spec.ub.flit_wire_byte(size + run_spec.ub.header_write_byte)
    models = parse_fabrics(fabric)
    curves = {}
    for model in models:
        fab = build_fabric(topo, model=model)
        rows = []
        for load in load_list:
            t = Traffic(pattern, arrival, load, size, wire, line_rate, round(warmup_us * 1e6), round(window_us * 1e6),
                        seed, incast_senders)
            rows.append({"fabric": model, **run_point(topo, fab, t, dies)[0]})
        curves[model] = rows
    params = {"pattern": pattern, "arrival": arrival, "scope": scope, "dies": dies, "packet_byte": size,
              "wire_byte_per_packet": wire, "line_rate_gbyte_per_s": round(line_rate / 1e9, 2),
              "warmup_us": warmup_us, "window_us": window_us, "seed": seed,
              "saturated_below_accepted_share": SATURATED_SHARE}
    if pattern == "incast":
        params["incast_senders"] = incast_senders
    for model, rows in curves.items():
        sat = [r["requested_load_percent"] for r in rows if r["saturated"]]
        params[f"{model}_saturation_throughput_percent"] = max(r["accepted_load_percent"] for r in rows)
        params[f"{model}_first_saturated_load_percent"] = sat[0] if sat else None
    if plots is not None:
        path = plots / f"traffic_{pattern}_{scope}.png"
        latency_plot(path, curves, f"{pattern}, {scope}, {size} B packets, {dies} dies")
        params["plot"] = str(path)
    return params, {"latency-load": [r for rows in curves.values() for r in rows]}
