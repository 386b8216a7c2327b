"""faults: all-to-all bandwidth with failed switch chips.

The all-to-all of ``ub-p2p`` (each of the first N dies writes ``--a2a-bytes`` to every other, in
staggered order), on the healthy fabric and with 1, 4 and 16 failed L2 chips (chip j is
l2:(j mod 7).(j div 7), so failures spread over the sub-planes) and with one failed L1 chip (the
first node's, on sub-plane 0). Paths through a failed chip are skipped (cmemu.faults).
"""
from __future__ import annotations

import click

from cmemu.errors import CmemuError
from cmemu.fabric import build_fabric
from cmemu.faults import parse_failures
from cmemu.scenarios.common import scenario_command
from cmemu.scenarios.ub_p2p import all_to_all
from cmemu.topology import build_topology
from cmemu.units import parse_size


def fault_sets(spec):
    P = spec.ub.sub_planes
    sets = [("none", [])]
    for k in (1, 4, 16):
        if k <= P * spec.ub.l2_chips_per_sub_plane:
            sets.append((f"{k} L2 chip(s)", [f"l2:{j % P}.{j // P}" for j in range(k)]))
    sets.append(("1 L1 chip", ["l1:0.0"]))
    return sets


@scenario_command("faults")
@click.option("--a2a-dies", type=int, default=None, help="Dies in the all-to-all [default: the first two nodes'].")
@click.option("--a2a-bytes", default="64K", show_default=True, help="Bytes each die writes to each other die.")
def command(spec, a2a_dies, a2a_bytes):
    """All-to-all bandwidth with 0, 1, 4 and 16 failed L2 chips and with one failed L1 chip."""
    topo = build_topology(spec)
    dies_per_node = spec.npus_per_node * spec.dies_per_npu
    dies = a2a_dies or min(spec.dies, 2 * dies_per_node)
    if not 2 <= dies <= spec.dies:
        raise CmemuError(f"--a2a-dies must be between 2 and {spec.dies}, got {dies}")
    size = parse_size(a2a_bytes, "--a2a-bytes")
    rows = []
    for label, specs in fault_sets(spec):
        fabric = build_fabric(topo, parse_failures(specs, topo))
        r = all_to_all(topo, fabric, dies, size)
        rows.append({"failed": label, **{k: v for k, v in r.items() if k != "events"}})
    return {"a2a_dies": dies, "bytes_per_destination": size}, rows
