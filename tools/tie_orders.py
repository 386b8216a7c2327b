"""How far the packet model's figure moves with the order of simultaneous events alone
(docs/model.md, "The packet model's own resolution").

Two packets ready at one picosecond go in the order their events were scheduled in; no source
publishes how the hardware's arbiters break such ties. This runs a case of
tools/compare_fabrics.py on the packet model with the pure-Python reference engine, once in the
scheduled order (seed -1: the native engine's figure) and once per seed with the order of every
tie at a later time drawn at random (events scheduled for the current time still run after those
already due then, in the order they were scheduled). For the experiment only: the engines have no
such option.

Run: python tools/tie_orders.py moe --ep 32 --engine sdma --skew 0 --seeds=-1,1,2,3
     python tools/tie_orders.py prefill --seeds=-1,1,2

Prints, per seed, the case's latencies (us), its events and the run's wall time. The reference
runs about 0.1 M events/s: an EP32 case takes seconds, an EP320 one or the prefill step a
minute or two.
"""
from __future__ import annotations

import argparse
import heapq
import pathlib
import random
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import cmemu._core.reference as reference  # noqa: E402
import cmemu.run.pipeline as pipeline  # noqa: E402


def _random_ties(seed: int) -> None:
    """The reference engine's push with ties at a later time in an order drawn from ``seed``."""
    rng = random.Random(seed)

    def push(self, t, kind, a):
        if t < self.now:
            self.past_event = True
        heapq.heappush(self.heap, (t, rng.random() if t > self.now else 2.0 + self.seq, kind, a))
        self.seq += 1
        if len(self.heap) > self.max_pending:
            self.max_pending = len(self.heap)

    reference.Engine.push = push


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("case", choices=["moe", "prefill"])
    ap.add_argument("--ep", type=int, default=32)
    ap.add_argument("--engine", choices=["aiv", "sdma"], default="sdma")
    ap.add_argument("--skew", type=float, default=0.0)
    ap.add_argument("--seeds", default="-1,1,2", help="comma-separated, after an equals sign (--seeds=-1,1,2); -1: the scheduled order")
    args = ap.parse_args()
    from compare_fabrics import moe_case, prefill_case

    from cmemu.spec import load_system

    real, scheduled_push = pipeline.simulate, reference.Engine.push
    pipeline.simulate = lambda L, fabric, *a, **k: real(L, fabric, *a, **{**k, "native": False})
    for seed in (int(s) for s in args.seeds.split(",")):
        reference.Engine.push = scheduled_push
        if seed >= 0:
            _random_ties(seed)
        t = time.perf_counter()
        if args.case == "prefill":
            r = prefill_case(load_system("mini"), "packet")
            figures = f"TTFT {r['ttft'] / 1e6:,.2f} us"
        else:
            r = moe_case(load_system("cloudmatrix384"), args.ep, args.engine, args.skew, "packet")
            figures = f"dispatch {r['dispatch'] / 1e6:,.2f} us, combine {r['combine'] / 1e6:,.2f} us"
        order = "scheduled order" if seed < 0 else f"ties drawn with seed {seed}"
        print(f"{args.case} {order}: {figures}; {r['events']:,} events ({time.perf_counter() - t:.0f} s)",
              flush=True)


if __name__ == "__main__":
    main()
