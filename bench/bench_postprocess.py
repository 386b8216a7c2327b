"""The stage after the simulation of the DeepSeek-R1 decode step: the run's results built
(run.trace_result: the HBM series, the /tasks rows, the MoE pairs) and the HDF5 timeline written.

Budget (docs/architecture.md, "Performance budget"): the whole 61-layer step in <= 60 s, of which this stage
was 27 s; its share is POST_BUDGET_S. Measured on the step cut to 4 and to 7 layers (`--fabric
message`), which differ by three MoE layers, from the check after the engine is released to the
file written; the 61-layer figure is extrapolated from them (3 dense + 58 MoE layers + MTP).
The HBM series are worked out on a second thread meanwhile: "build" is the rest of the results,
"write" the file, waiting for the series before its last group. Measured on the whole step:
3.4 s (build 1.1, write 2.3). Gated on a ratio measured in the same run, not an absolute time (a
shared, noisy machine): the stage against the simulation before it, both extrapolated to the
whole step, within twice its budget's share (POST_BUDGET_S against the SIM_BUDGET_S the rest of
the step leaves the simulation). Times are the process's CPU time (both threads of the stage
after the simulation: an upper bound on its wall time): the extrapolation multiplies a
difference of two runs, and in wall time a neighbour's burst of load on one run moved the ratio
from 0.03 to 0.25 between runs. CPU time is not enough on its own: in CI's whole suite a 4-layer
run's simulation once took about 0.5 s more CPU than a 5-layer run's less one layer (a one-time
cost, or a collection of the garbage the tests before it left), which a difference of one layer
multiplied by 56 turned into a 61-layer simulation of 5.7 s, against the 34-38 s it takes, and
the gate failed at 0.730. So each length runs twice, each run after a collection, and the smaller
figure of the two counts (noise only adds time); and the two lengths differ by three MoE layers,
so the difference is multiplied by 18.
"""
import gc
import time

from decode_steps import decode_trace

POST_BUDGET_S = 8.0
SIM_BUDGET_S = 45.0  # the step's 60 s less reading, checking and lowering the trace and this stage


def _post_stage(tmp_path, layers: int) -> dict:
    import cmemu.output.hdf5 as H
    import cmemu.run as R
    import cmemu.run.pipeline as P

    trace = decode_trace(tmp_path, layers)
    marks = {}
    check, write, simulate = P.check_invariants, H.write_timeline, P.simulate

    def timed_simulate(*args, **kwargs):
        marks["sim"] = time.process_time()
        return simulate(*args, **kwargs)

    def timed_check(full):
        marks["post"] = time.process_time()
        return check(full)

    def timed_write(*args, **kwargs):
        marks["write"] = time.process_time()
        return write(*args, **kwargs)

    P.check_invariants, H.write_timeline, P.simulate = timed_check, timed_write, timed_simulate
    try:
        R.run_trace(trace, output=tmp_path / f"{layers}.h5", fabric_model="message", progress=False,
                    max_memory_bytes=64 * 2**30)
    finally:
        P.check_invariants, H.write_timeline, P.simulate = check, write, simulate
    end = time.process_time()
    return {"sim_s": marks["post"] - marks["sim"], "build_s": marks["write"] - marks["post"],
            "write_s": end - marks["write"], "post_s": end - marks["post"]}


SHORT, LONG = 4, 7  # 3 dense layers, then 1 and 4 MoE layers
REPEATS = 2


def _best_of(tmp_path, layers: int) -> dict:
    """Each figure at its smallest over REPEATS runs, each run after a collection of the garbage before it."""
    runs = []
    for _ in range(REPEATS):
        gc.collect()
        runs.append(_post_stage(tmp_path, layers))
    return {k: min(run[k] for run in runs) for k in runs[0]}


def test_post_stage_extrapolated(tmp_path):
    _post_stage(tmp_path, SHORT)  # what a process does once (Numba's cache, the writer's threads, the first MoE layer)
    short, long = _best_of(tmp_path, SHORT), _best_of(tmp_path, LONG)
    layer = {k: (long[k] - short[k]) / (LONG - SHORT) for k in long}
    full = {k: long[k] + (61 - LONG) * layer[k] for k in long}
    print(f"\nAfter the simulation, DeepSeek-R1 decode EP320, --fabric message: {LONG} layers {long['post_s']:.2f} s "
          f"(build {long['build_s']:.2f}, write {long['write_s']:.2f}); one MoE layer {layer['post_s']:.3f} s; "
          f"61 layers extrapolated {full['post_s']:.1f} s (build {full['build_s']:.1f}, write {full['write_s']:.1f}; "
          f"budget {POST_BUDGET_S:.0f} s), {full['post_s'] / full['sim_s']:.3f} of the simulation's "
          f"{full['sim_s']:.1f} s (budgets' ratio {POST_BUDGET_S / SIM_BUDGET_S:.3f})")
    assert long["post_s"] > 0 and full["sim_s"] > 0
    assert full["post_s"] / full["sim_s"] <= 2 * POST_BUDGET_S / SIM_BUDGET_S
