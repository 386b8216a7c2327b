"""Failed parts of the fabric: ``--fail link:ID``, ``l1:NODE.PLANE``, ``l2:PLANE.CHIP``, ``die:ID``.

A failed part takes every link that touches it out of service: the engine's path choice skips
any sub-plane and L2 chip whose path crosses a dead link, so traffic moves to the remaining
paths; a message with no path left stops the run with an error naming it. A failed die also fails
every op placed on it. A part can fail from the start (``--fail``, or a trace's ``cmemu.faults``
with ``at_ns`` 0) or during the run (``at_ns`` > 0): then the packets waiting for its links or on
their wires are lost, and their sources send them again on live paths after the UB transport's
timeout (``ub.retransmit_timeout_ns``).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cmemu.errors import CmemuError
from cmemu.topology import V_DIE, Topology


class FaultError(CmemuError):
    """A --fail specification that does not name a part of the system."""


@dataclass(frozen=True)
class Failures:
    """What is down: directed link ids, and dies."""

    links: frozenset
    dies: frozenset
    specs: tuple

    @property
    def any(self) -> bool:
        return bool(self.links or self.dies)


NONE = Failures(frozenset(), frozenset(), ())


def _ints(spec: str, text: str, count: int, where: str) -> list[int]:
    parts = text.split(".")
    if len(parts) != count or not all(p.isascii() and p.isdigit() for p in parts):
        shape = ".".join(["N"] * count)
        raise FaultError(f"{where}: expected {spec.split(':')[0]}:{shape} with whole numbers")
    return [int(p) for p in parts]


def parse_failures(specs, topo: Topology, label: str | None = None) -> Failures:
    """Turn ``--fail`` strings into the set of dead links (both directions of what they name).
    An error names the part as ``--fail PART``, or as ``label`` when given (a trace's cmemu.faults)."""
    if not specs:
        return NONE
    s = topo.spec
    P, C = s.ub.sub_planes, s.ub.l2_chips_per_sub_plane
    E = topo.num_endpoints
    l1_base = E
    l2_base = l1_base + s.nodes * P
    dead_vertices, dead_links, dead_dies = set(), set(), set()
    for spec in specs:
        where = label or f"--fail {spec}"
        kind, _, arg = str(spec).partition(":")
        if kind == "link":
            (lid,) = _ints(spec, arg, 1, where)
            if lid >= topo.num_links:
                raise FaultError(f"{where}: there are {topo.num_links} links (0..{topo.num_links - 1})")
            dead_links.add(lid)
        elif kind == "l1":
            node, plane = _ints(spec, arg, 2, where)
            if node >= s.nodes or plane >= P:
                raise FaultError(f"{where}: L1 chips are NODE 0..{s.nodes - 1} . PLANE 0..{P - 1}")
            dead_vertices.add(l1_base + node * P + plane)
        elif kind == "l2":
            plane, chip = _ints(spec, arg, 2, where)
            if plane >= P or chip >= C:
                raise FaultError(f"{where}: L2 chips are PLANE 0..{P - 1} . CHIP 0..{C - 1}")
            dead_vertices.add(l2_base + plane * C + chip)
        elif kind == "die":
            (die,) = _ints(spec, arg, 1, where)
            if die >= s.dies:
                raise FaultError(f"{where}: dies are 0..{s.dies - 1}")
            dead_vertices.add(die)
            dead_dies.add(die)
        else:
            raise FaultError(f"{where}: expected link:ID, l1:NODE.PLANE, l2:PLANE.CHIP or die:ID")
    if dead_vertices:
        touch = np.isin(topo.link_src, list(dead_vertices)) | np.isin(topo.link_dst, list(dead_vertices))
        dead_links.update(np.flatnonzero(touch).tolist())
    assert all(topo.vertex_kind[d] == V_DIE for d in dead_dies)
    return Failures(frozenset(dead_links), frozenset(dead_dies), tuple(map(str, specs)))
