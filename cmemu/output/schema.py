"""Names shared by the timeline writer, its reader and the exporters (no h5py, no work at import).

The layout itself is documented in docs/timeline-format.md; this module holds the constants both
sides must agree on: the format name, the versions, the enums stored in the file, and the detail
levels of ``cmemu run --detail``.
"""
from __future__ import annotations

from cmemu.errors import CmemuError
from cmemu.vocab import COMPRESSIONS, DETAILS

TIMELINE_FORMAT = "cmemu.timeline"
TIMELINE_VERSION = 5
READABLE_VERSIONS = (1, 2, 3, 4, 5)


# The columns of RunResult.tasks (a dict of equal-length numpy arrays), with their dtypes.
TASK_FIELDS = (
    ("die", "int32"),
    ("pipe", "uint8"),
    ("op", "int32"),
    ("start_ps", "int64"),
    ("end_ps", "int64"),
    ("bytes", "int64"),
)
# The columns of RunResult.link_series (sparse COO: only nonzero (link, bin) pairs), plus "bin_ps".
LINK_SERIES_FIELDS = (
    ("link", "int32"),
    ("bin", "int32"),
    ("bytes", "int64"),
    ("busy_ps", "int64"),
)

# The columns of RunResult.hbm_series besides bin_ps (sparse COO, nonzero pairs only).
HBM_SERIES_FIELDS = (
    ("die", "int32"),
    ("bin", "int32"),
    ("bytes", "int64"),
)

# RunResult.hbm_stack_series besides bin_ps and stacks (sparse COO, nonzero triples only).
HBM_STACK_SERIES_FIELDS = (
    ("die", "int32"),
    ("stack", "int8"),
    ("bin", "int32"),
    ("bytes", "int64"),
)

# RunResult.moe_pairs: one row per rank and MoE exchange, rows of /ops (v4).
MOE_PAIR_FIELDS = (
    ("dispatch_op", "int32"),
    ("combine_op", "int32"),
)

# RunResult.packets (--detail packets, v4): one row per transmission of a packet on a link.
PACKET_FIELDS = (
    ("start_ps", "int64"),
    ("end_ps", "int64"),
    ("link", "int32"),
    ("msg", "int32"),
    ("op", "int32"),
    ("seq", "int32"),
    ("wire_bytes", "int32"),
    ("type", "uint8"),
)
# /packets/type: the fabric's packet types (cmemu.vocab.PACKET_TYPE_NAMES, PKT_* codes). Acks are
# folded into the data packets' events and never cross a link as records of their own.



def check_detail(detail: str) -> None:
    """Refuse a detail level this version cannot write, before any time is spent running."""
    if detail not in DETAILS:
        raise CmemuError(f"--detail must be one of {', '.join(DETAILS)}, got {detail!r}")


def check_compression(compression: str) -> None:
    if compression not in COMPRESSIONS:
        raise CmemuError(f"--compression must be one of {', '.join(COMPRESSIONS)}, got {compression!r}")
