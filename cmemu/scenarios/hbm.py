"""hbm: the die's HBM model by access size: streaming bandwidth and the latency of one access.

Streaming: enough accesses of one size in flight to keep every pseudo-channel busy, each at a
random address (so small accesses pay a row activation each and hit tFAW); reads, writes, and a
copy (a read stream and a write stream drained in batches; the rate counts bytes read plus bytes
written). A sequential read stream is shown for comparison. Latency: one access on an idle HBM,
from issue to its last byte (the fabric latency of [CYC] plus the DRAM's own timing).
"""
from __future__ import annotations

import click

from cmemu.scenarios.common import check_positive, scenario_command
from cmemu.units import parse_sizes

DEFAULT_SIZES = "32,64,128,256,512,4K,64K,1M"


def hbm_rows(spec, sizes, window_ns: float = 20_000.0) -> list[dict]:
    from cmemu.die.hbm import HBMParams, access_latency_ps, stream

    hp = HBMParams.from_die(spec.die)
    rows = []
    for s in sizes:
        rd = stream(hp, "read", s, "random", window_ns)
        rows.append({
            "access_byte": s,
            "read_gbyte_per_s": round(rd.bandwidth_byte_per_s / 1e9, 1),
            "write_gbyte_per_s": round(stream(hp, "write", s, "random", window_ns).bandwidth_byte_per_s / 1e9, 1),
            "copy_gbyte_per_s": round(stream(hp, "copy", s, "random", window_ns).bandwidth_byte_per_s / 1e9, 1),
            "sequential_read_gbyte_per_s": round(stream(hp, "read", s, "sequential", window_ns).bandwidth_byte_per_s / 1e9, 1),
            "read_row_hit_pct": round(100 * rd.row_hit_fraction, 1),
            "read_latency_ns": round(access_latency_ps(hp, s) / 1e3, 1),
            "write_latency_ns": round(access_latency_ps(hp, s, write=True) / 1e3, 1),
        })
    return rows


# The measurement's requests are all held at once: with one size, the default 20 us took 0.9 s
# and 0.2 GB, 200 us 3.0 s and 0.87 GB, 1 ms 33 s and 3.8 GB, and 10 ms ran out of memory. So at
# most 10x the default, which covers several refreshes already.
MAX_WINDOW_NS = 200_000


@scenario_command("hbm")
@click.option("--sizes", default=DEFAULT_SIZES, show_default=True, help="Access sizes (B; K/M suffixes).")
@click.option("--window-ns", type=float, default=20_000.0, show_default=True,
              help=f"Simulated time per streaming measurement (covers several refreshes; at most {MAX_WINDOW_NS:,}).")
def command(spec, sizes, window_ns):
    """HBM streaming read/write/copy bandwidth and latency by access size."""
    check_positive("window_ns", window_ns, MAX_WINDOW_NS)
    d = spec.die
    params = {"pin_peak_gbyte_per_s": round(d.hbm_pin_peak_byte_per_s / 1e9, 1),
              "pseudo_channels": d.hbm_pseudo_channels, "refresh_loss_pct": round(100 * d.hbm_trfc_ns / d.hbm_trefi_ns, 1)}
    return params, hbm_rows(spec, parse_sizes(sizes), window_ns)
