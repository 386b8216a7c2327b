"""Event-kernel benchmarks. Gates are ratios measured in the same run (native kernel vs the
pure-Python reference on the same workload), never absolute times: the machines are noisy. Runs
are timed in the CPU time of the thread that runs them (time.thread_time), so that another
process's turn on a core counts against neither kernel.

docs/architecture.md budget: >= 4 M events/s with 10 K events pending, and >= 20x the reference.
"""
import time

import pytest

from cmemu._core import make_engine
from cmemu._core.synthetic import hold_workload, traffic_workload
from cmemu.fabric import build_fabric
from cmemu.spec import load_system
from cmemu.topology import build_topology

_FABRIC = []


def _fabric():
    """The mini system's fabric (built once: the workloads below run on it)."""
    if not _FABRIC:
        _FABRIC.append(build_fabric(build_topology(load_system("mini"))))
    return _FABRIC[0]


HOLD_PENDING = 10_000
MIN_SPEEDUP_HOLD = 20.0
MIN_SPEEDUP_TRAFFIC = 10.0
HOLD_NATIVE_ROUNDS = 10  # per pass, beside one reference run
HOLD_RETRY_PASSES = 8


def _best_rate(lowered, native, rounds):
    """Best events/s over a few rounds (the least disturbed by other load), timed in this
    thread's CPU time: a run that waits for a core (another process's turn on this machine's few)
    is not counted as slow. What is left is the machine's own variation from moment to moment."""
    best = 0.0
    for _ in range(rounds):
        engine = make_engine(lowered, _fabric(), native=native)
        t0 = time.thread_time()
        engine.run()
        dt = time.thread_time() - t0
        best = max(best, engine.events / dt)
    return best, engine


def _best_rates(lowered, native_rounds=5, reference_rounds=1, passes=3):
    """Best events/s of the native and the reference kernel, measured interleaved over a few
    passes so that a burst of load from elsewhere on the machine cannot hit only one of them."""
    native = reference = 0.0
    for _ in range(passes):
        n, engine = _best_rate(lowered, native=True, rounds=native_rounds)
        r, _ = _best_rate(lowered, native=False, rounds=reference_rounds)
        native, reference = max(native, n), max(reference, r)
    return native, reference, engine


def _engine_run(lowered):
    engine = make_engine(lowered, _fabric(), native=True)
    return (engine,), {}


@pytest.fixture(scope="module")
def hold():
    return hold_workload(chains=HOLD_PENDING, ops_per_chain=20, seed=0)


def test_event_kernel_hold(benchmark, hold):
    """The hold model: 10 K chains, so 10 K events stay pending; 400 K events per run.

    Each kernel's best over interleaved passes (10 native runs of 40 ms to one reference run of
    0.9 s; 3 passes, and 8 more before judging a ratio below the budget), in CPU time. Measured on
    the 2-core development machine (Dec 2026): native 44-52 M events/s (a bucket's events sorted by
    a radix sort on their time, events written in place, the coming op ends' lines prefetched;
    10 M events/s before), the reference 0.40-0.51 M events/s (faster as the process ages): about
    110x. The budget stays 20x.
    """
    benchmark.pedantic(lambda e: e.run(), setup=lambda: _engine_run(hold), rounds=5)
    native, reference, e = _best_rates(hold, native_rounds=HOLD_NATIVE_ROUNDS)
    first = native / reference
    if first < MIN_SPEEDUP_HOLD:
        # Measure again, longer, before judging (the budget stays 20x): both kernels get more
        # runs, and the reference's best rises with them as the native's does.
        n2, r2, e = _best_rates(hold, native_rounds=HOLD_NATIVE_ROUNDS, passes=HOLD_RETRY_PASSES)
        native, reference = max(native, n2), max(reference, r2)
    assert e.max_pending == HOLD_PENDING
    ratio = native / reference
    benchmark.extra_info.update(
        native_events_per_s=round(native), reference_events_per_s=round(reference), speedup=round(ratio, 1),
        first_speedup=round(first, 1),
    )
    print(f"\nhold, {HOLD_PENDING:,} pending: native {native / 1e6:.2f} M events/s, "
          f"reference {reference / 1e6:.3f} M events/s, speedup {ratio:.1f}x"
          + ("" if first >= MIN_SPEEDUP_HOLD else f" (measured again: {first:.1f}x first)"))
    assert ratio >= MIN_SPEEDUP_HOLD


def test_event_kernel_packet_hops(benchmark):
    """Random messages on the mini system: packet hops, link queueing and delivery."""
    topo = build_topology(load_system("mini"))
    lowered = traffic_workload(topo, messages=3000, seed=1)
    benchmark.pedantic(lambda e: e.run(), setup=lambda: _engine_run(lowered), rounds=5)
    native, reference, e = _best_rates(lowered)
    ratio = native / reference
    benchmark.extra_info.update(
        native_events_per_s=round(native), reference_events_per_s=round(reference), speedup=round(ratio, 1),
        packets_sent=e.packets_sent,
    )
    print(f"\npacket hops ({e.packets_sent:,} packet transmissions, {e.events:,} events): native "
          f"{native / 1e6:.2f} M events/s, reference {reference / 1e6:.3f} M events/s, speedup {ratio:.1f}x")
    assert ratio >= MIN_SPEEDUP_TRAFFIC


def test_cost_per_event_flat_as_work_grows():
    """Same number pending, 8x the ops: the cost per event grows as the op arrays (~80 B per op)
    leave the caches and the TLB (up to ~3x measured here), but not with the amount of work: a
    hidden O(ops) step per event would make it 8x (a ratio of 0.125)."""
    small_w = hold_workload(chains=1000, ops_per_chain=200)
    large_w = hold_workload(chains=1000, ops_per_chain=1600)
    small = large = 0.0
    for _ in range(3):  # interleaved, so that a burst of load elsewhere hits both alike
        small = max(small, _best_rate(small_w, native=True, rounds=2)[0])
        large = max(large, _best_rate(large_w, native=True, rounds=1)[0])
    print(f"\nsame pending, 8x the ops: {small / 1e6:.2f} -> {large / 1e6:.2f} M events/s")
    assert large >= 0.25 * small
