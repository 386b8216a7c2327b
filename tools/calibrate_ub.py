"""Calibrate the UB model's unpublished parameters against [CM] v2 table 1 (docs/machine.md 3), once.

Run: python tools/calibrate_ub.py [--system cloudmatrix384]

What is fitted, and on what (everything else in the preset is from a source or assumed):
- ub.write_issue_ns, ub.read_issue_ns: a die's per-packet issue time; fitted on NPU->NPU write
  and read bandwidth of 512 B messages (the mean of intra and inter node);
- ub.cpu_memory_write_gbyte_per_s: the rate a CPU absorbs UB writes; on NPU->CPU write bandwidth;
- ub.initiator_startup_ns, ub.switch_latency_ns, ub.cpu_memory_read_latency_ns,
  ub.cpu_memory_write_latency_ns: least squares on the eight 512 B latencies (latency is linear
  in them, so the coefficients are measured with the model itself by finite differences).
NPU->CPU read bandwidth is not fitted: it comes out of the 28 B read-response header and 20 B
flits on the CPU's 160 GB/s of ports. The script prints the fitted values and every residual;
copy the values into the preset by hand (their `source` says "calibrated").
"""
from __future__ import annotations

import argparse

import numpy as np

from cmemu.fabric import build_fabric
from cmemu.scenarios.ub_p2p import bandwidth_byte_per_s, endpoints, latency_ps
from cmemu.spec import load_system
from cmemu.topology import build_topology
from cmemu.vocab import MSG_READ, MSG_WRITE

# [CM] v2 table 1 (docs/machine.md 3): (path, op) -> (intra GB/s, inter GB/s, intra us, inter us).
TABLE1 = {
    ("NPU->NPU", "read"): (167, 164, 1.2, 1.9),
    ("NPU->NPU", "write"): (137, 135, 1.3, 2.1),
    ("NPU->CPU", "read"): (151, 147, 1.0, 1.7),
    ("NPU->CPU", "write"): (110, 107, 1.1, 1.9),
}
SIZE = 512
FLOOR_NS = 50.0  # no memory access behind a port is faster than this
LATENCY_PARAMS = ["ub.initiator_startup_ns", "ub.switch_latency_ns", "ub.cpu_memory_read_latency_ns",
                  "ub.cpu_memory_write_latency_ns"]


def cases(topo):
    for path, locality, target in endpoints(topo):
        for op in ("read", "write"):
            src, dst, kind = (0, target, MSG_WRITE) if op == "write" else (target, 0, MSG_READ)
            yield path, op, locality, src, dst, kind


def measure(system, overrides):
    topo = build_topology(load_system(system, overrides))
    fabric = build_fabric(topo)
    out = {}
    for path, op, locality, src, dst, kind in cases(topo):
        out[(path, op, locality)] = (bandwidth_byte_per_s(topo, fabric, src, dst, SIZE, kind) / 1e9,
                                     latency_ps(topo, fabric, src, dst, SIZE, kind) / 1e6)
    return out


def target(key):
    path, op, locality = key
    bi, be, li, le = TABLE1[(path, op)]
    return (bi, li) if locality == "intra" else (be, le)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--system", default="cloudmatrix384")
    args = ap.parse_args()
    base_spec = load_system(args.system)

    # Bandwidth: the issue times and the CPU's write rate.
    npu_write = np.mean(TABLE1[("NPU->NPU", "write")][:2]) * 1e9
    npu_read = np.mean(TABLE1[("NPU->NPU", "read")][:2]) * 1e9
    cpu_write = np.mean(TABLE1[("NPU->CPU", "write")][:2])
    fitted = {
        "ub.write_issue_ns": round(SIZE / npu_write * 1e9, 3),
        "ub.read_issue_ns": round(SIZE / npu_read * 1e9, 3),
        "ub.cpu_memory_write_gbyte_per_s": round(float(cpu_write), 1),
    }
    overrides = [f"{k}={v}" for k, v in fitted.items()]

    # Latency: linear in the four parameters; coefficients by finite differences on the model.
    current = {p: getattr(base_spec.ub, p.split(".")[1]) for p in LATENCY_PARAMS}
    at = {p: 100.0 for p in LATENCY_PARAMS}
    base = measure(args.system, overrides + [f"{p}={v}" for p, v in at.items()])
    keys = sorted(base)
    columns = []
    for p in LATENCY_PARAMS:
        bumped = measure(args.system, overrides + [f"{q}={v + (100.0 if q == p else 0.0)}" for q, v in at.items()])
        columns.append([(bumped[k][1] - base[k][1]) / 0.1 for k in keys])  # us per us
    A = np.array(columns).T
    y = np.array([target(k)[1] - base[k][1] for k in keys]) + A @ (np.array([at[p] for p in LATENCY_PARAMS]) / 1000)
    # Least squares with a floor: a parameter that would go below it is held there (a memory
    # access takes some time) and the others are fitted again.
    free = list(range(len(LATENCY_PARAMS)))
    fixed = {}
    while True:
        rhs = y - sum(A[:, i] * v for i, v in fixed.items())
        sol, *_ = np.linalg.lstsq(A[:, free], rhs, rcond=None)
        low = [(i, v) for i, v in zip(free, sol) if v * 1000 < FLOOR_NS]
        if not low:
            break
        i = min(low, key=lambda iv: iv[1])[0]
        fixed[i] = FLOOR_NS / 1000
        free.remove(i)
    values = dict(fixed)
    values.update(zip(free, sol))
    for i, p in enumerate(LATENCY_PARAMS):
        fitted[p] = round(float(values[i]) * 1000, 1)
        if i in fixed:
            print(f"{p} held at its floor of {FLOOR_NS} ns (the fit wanted less)")

    final = measure(args.system, [f"{k}={v}" for k, v in fitted.items()])
    print("fitted (was):")
    for k, v in fitted.items():
        was = getattr(base_spec.ub, k.split(".")[1])
        print(f"  {k:<34} {v:>9}  ({was})")
    del current
    print(f"\n{'path':<9} {'op':<6} {'where':<6} {'GB/s':>7} {'target':>7} {'err':>6}   {'us':>6} {'target':>6} {'err':>6}")
    for k in keys:
        bw, lat = final[k]
        tb, tl = target(k)
        print(f"{k[0]:<9} {k[1]:<6} {k[2]:<6} {bw:7.1f} {tb:7.0f} {100 * (bw - tb) / tb:5.1f}%   "
              f"{lat:6.3f} {tl:6.2f} {100 * (lat - tl) / tl:5.1f}%")


if __name__ == "__main__":
    main()
