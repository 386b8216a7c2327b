"""The options of a replay, once: their flags, choices, defaults and help. `cmemu run` and
`cmemu trace validate`, the scenarios that replay a step and the sweeps' trace points build their
options from these (``RUN_OPTIONS[name].option()`` as a click decorator, ``.param()`` as a click
parameter to convert and default a value the way the command would).

The choices are cmemu.vocab's; the default system is cmemu.spec's, the pipe intervals'
cmemu.results.limits'.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import click

from cmemu.clihelpers import MemorySize
from cmemu.results.limits import DEFAULT_PIPE_INTERVALS
from cmemu.spec.load import DEFAULT_SYSTEM
from cmemu.vocab import COMPRESSIONS, DETAILS, ENGINES, FABRICS

__all__ = ["DEFAULT_SYSTEM", "DEFAULT_ENGINE", "DEFAULT_COMPRESSION", "DEFAULT_DETAIL", "DEFAULT_FABRIC", "DEFAULT_LINK_BIN_NS", "DEFAULT_PIPE_INTERVALS",
           "RUN_OPTIONS", "Option"]

DEFAULT_ENGINE = "native"
DEFAULT_COMPRESSION = "gzip"
DEFAULT_DETAIL = "tasks"
DEFAULT_FABRIC = "packet"
DEFAULT_LINK_BIN_NS = 10_000  # per-link counters in bins of 10 us (0 turns them off)


@dataclass(frozen=True)
class Option:
    """One command-line option: its declarations (``("--fabric", "fabric_model")``) and click's
    settings. A command may change a setting (its help, say) where it declares the option."""

    decls: tuple[str, ...]
    settings: dict = field(default_factory=dict)

    def option(self, *decls: str, **changes):
        """The click decorator (``decls`` replace the declarations, e.g. another Python name)."""
        return click.option(*(decls or self.decls), **{**self.settings, **changes})

    def param(self) -> click.Option:
        """The click parameter, to convert and default a value as the command would."""
        return click.Option(list(self.decls), **self.settings)

    @property
    def name(self) -> str:
        return self.param().name


RUN_OPTIONS = {o.name: o for o in (
    Option(("--engine",), dict(type=click.Choice(ENGINES), default=DEFAULT_ENGINE, show_default=True,
                               help="The Cython kernel, or its pure-Python reference (slow; for checking).")),
    Option(("--max-memory",), dict(type=MemorySize(), default=None, metavar="SIZE",
                                   help="Fail early instead of swapping if the run would need more, e.g. 2GB, 512MiB "
                                        "[default: 3/4 of physical memory].")),
    Option(("--compression",), dict(type=click.Choice(COMPRESSIONS), default=DEFAULT_COMPRESSION, show_default=True,
                                    help="Timeline compression: gzip (with shuffle; smallest), lzf (faster), none.")),
    Option(("--detail",), dict(type=click.Choice(DETAILS), default=DEFAULT_DETAIL, show_default=True,
                               help="What the timeline records: ops; ops and pipe/engine tasks; packets: tasks and "
                                    "every packet on every link (/packets; small runs only: a warning above 1 M "
                                    "records, refused above 50 M or past --max-memory).")),
    Option(("--link-bin-ns",), dict(type=click.FloatRange(min=0), default=DEFAULT_LINK_BIN_NS, show_default=True,
                                    help="Width of the time bins of the per-link byte and busy-time counters, in ns "
                                         "(0: off).")),
    Option(("--fail",), dict(multiple=True, metavar="PART",
                             help="Take a part out of service: link:ID, l1:NODE.PLANE, l2:PLANE.CHIP or die:ID "
                                  "(repeatable).")),
    Option(("--pipe-intervals",), dict(type=click.IntRange(min=1), default=DEFAULT_PIPE_INTERVALS, show_default=True,
                                       help="Most busy intervals per COMP op and pipe in /tasks (the die model's tile "
                                            "schedule merged; fewer when a big run would pass 4 million rows).")),
    Option(("--fabric", "fabric_model"), dict(
        type=click.Choice(FABRICS), default=DEFAULT_FABRIC, show_default=True,
        help="Fabric model. packet: every packet on every link. message: a write packet's whole path is reserved "
             "when it is issued, in each link's idle time, with no events of its own (many times faster on big MoE "
             "steps; no credit flow control; see docs/model.md); reads stay packets. message-bp: message with receive "
             "buffers bounded as credits bound them, a full one blocking the link before it (see docs/model.md, "
             "\"Back-pressure\").")),
    Option(("--retime",), dict(is_flag=True, help="Time the COMP nodes that give both a measured time and a shape (an "
                                                  "imported profile) by the die model instead, and report how the two "
                                                  "compare (cmemu.lower.retime).")),
)}
