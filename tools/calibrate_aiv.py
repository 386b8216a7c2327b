"""Calibrate the AIV remote-access path's unpublished parameters against the DeepEP-Ascend
normal-mode table (docs/machine.md 3), once.

Run: python tools/calibrate_aiv.py [--ep 8,16,32] [--check 64,128] [--system cloudmatrix384]

The table ([SKN] README: normal kernels on a CloudMatrix384, 4,096 tokens per rank, hidden 7,168,
top-8 of 256 experts, INT8 dispatch, BF16 combine, all over UB) gives the "bottleneck bandwidth"
per rank that DeepEP-Ascend's tests print: every row a rank received, its own included, at BF16
size, over the rank's time for the whole dispatch() or combine() call (tests/python/deepep/
test_intranode.py). cmemu reports the same quantity (``cmemu scenario run dispatch|combine
--kernel normal``: deepep_bandwidth_gbyte_per_s) from the fused kernels' steps (cmemu/lower/moe.py)
on the packet-level fabric (the reference model: the normal kernels' many-to-many traffic fills
switch buffers, which the message-level fabric does not model).

What is fitted, and on what (no source publishes either; everything else is from a source or
assumed, and stays as it is):
- comm.aiv_remote_write_startup_ns: from an AIV's MTE3 copy to a remote address to its first
  packet on the die's UB port; on the combine column (the normal combine's remote traffic is an
  AIV's writes and flags, one row at a time);
- comm.aiv_remote_read_startup_ns: the same for an MTE2 copy from a remote address; on the
  dispatch column (its remote traffic is pulls), with the write start-up fitted first.
Each is one number for all EP degrees: the fit minimises the squared error of log bandwidth over
the EP degrees of ``--ep`` (by default the single-node and two-node ones, 8 to 32, which run in
minutes on the packet fabric); ``--check`` degrees are only predicted with the fitted values
and printed beside the table (EP128 takes about ten minutes). The script prints the fitted values
and every residual; copy the values into the preset by hand (their ``source`` says "calibrated").
"""
from __future__ import annotations

import argparse
import math
import time

from cmemu.scenarios.moe_comm import moe_rows
from cmemu.spec import load_system

# [SKN] README, normal kernels with pure HCCS (docs/machine.md 3): EP -> (dispatch, combine) GB/s.
TABLE = {8: (146, 125), 16: (107, 103), 32: (102, 95), 64: (81, 91), 128: (57, 81)}
TOKENS, TOP_K, HIDDEN, EXPERTS = 4096, 8, 7168, 256
WRITE, READ = "comm.aiv_remote_write_startup_ns", "comm.aiv_remote_read_startup_ns"
LOW_NS, HIGH_NS = 50.0, 5000.0  # the search range: at least a pipe's start-up; [ART]: under 1 us


def measure(system, overrides, ep, combine):
    spec = load_system(system, overrides)
    row = moe_rows(spec, [ep], TOKENS, TOP_K, HIDDEN, ["aiv"], None, 0.0, 0, combine, ["normal"], EXPERTS,
                   "packet")[0]
    return row["deepep_bandwidth_gbyte_per_s"]


def loss(system, overrides, eps, combine, cache):
    key = (tuple(overrides), combine)
    if key not in cache:
        t = time.perf_counter()
        got = {ep: measure(system, overrides, ep, combine) for ep in eps}
        cache[key] = sum((math.log(got[ep] / TABLE[ep][1 if combine else 0])) ** 2 for ep in eps), got
        print(f"  {'combine' if combine else 'dispatch'} {' '.join(overrides)}: "
              + ", ".join(f"EP{ep} {v:.1f}" for ep, v in got.items()) + f"  ({time.perf_counter() - t:.0f} s)",
              flush=True)
    return cache[key][0]


def fit(system, fixed, name, eps, combine, cache, iters):
    """Golden-section search of one start-up in [LOW_NS, HIGH_NS] on a log scale."""
    g = (math.sqrt(5) - 1) / 2
    lo, hi = math.log(LOW_NS), math.log(HIGH_NS)

    def f(x):
        return loss(system, fixed + [f"{name}={round(math.exp(x), 1)}"], eps, combine, cache)

    a, b = hi - g * (hi - lo), lo + g * (hi - lo)
    fa, fb = f(a), f(b)
    for _ in range(iters):
        if fa < fb:
            hi, b, fb = b, a, fa
            a = hi - g * (hi - lo)
            fa = f(a)
        else:
            lo, a, fa = a, b, fb
            b = lo + g * (hi - lo)
            fb = f(b)
    return round(math.exp(a if fa < fb else b), 1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--system", default="cloudmatrix384")
    ap.add_argument("--ep", default="8,16,32", help="EP degrees to fit on")
    ap.add_argument("--check", default="64,128", help="EP degrees only predicted with the fitted values")
    ap.add_argument("--iters", type=int, default=8, help="golden-section steps per parameter")
    ap.add_argument("--write", type=float, default=None, help="take this write start-up (ns) instead of fitting it")
    args = ap.parse_args()
    eps = [int(x) for x in args.ep.split(",") if x]
    check = [int(x) for x in args.check.split(",") if x]
    base = load_system(args.system).comm
    cache = {}
    print("fitting the write start-up on the combine column:")
    w = args.write if args.write is not None else fit(args.system, [], WRITE, eps, True, cache, args.iters)
    print("fitting the read start-up on the dispatch column:")
    r = fit(args.system, [f"{WRITE}={w}"], READ, eps, False, cache, args.iters)
    fitted = [f"{WRITE}={w}", f"{READ}={r}"]
    print("fitted (was):")
    print(f"  {WRITE:<40} {w:>8}  ({base.aiv_remote_write_startup_ns})")
    print(f"  {READ:<40} {r:>8}  ({base.aiv_remote_read_startup_ns})")
    print(f"\n{'EP':>4} {'dispatch':>9} {'table':>6} {'err':>7}   {'combine':>8} {'table':>6} {'err':>7}   fitted on")
    for ep in eps + check:
        d = measure(args.system, fitted, ep, False)
        c = measure(args.system, fitted, ep, True)
        td, tc = TABLE[ep]
        print(f"{ep:>4} {d:9.1f} {td:6.0f} {100 * (d - td) / td:6.1f}%   {c:8.1f} {tc:6.0f} {100 * (c - tc) / tc:6.1f}%   "
              f"{'yes' if ep in eps else 'no (predicted)'}")


if __name__ == "__main__":
    main()
