"""gemm: grouped GEMM on one die, timed by the die model's tile schedule.

Default workload: the shapes and groups of [CM] v2 table 10 (docs/machine.md 3), INT8 inputs and BF16
output, base tile 128 x 152, on all 24 AIC of one Ascend 910C die. For each shape it prints the
time, the cube utilisation (useful MACs over what the cores could do in that time), the HBM
traffic rate (reads that missed L2 plus the output written back) and where the time went.
"""
from __future__ import annotations

import click

from cmemu.errors import CmemuError
from cmemu.scenarios.common import scenario_command

DEFAULT_SHAPES = "4x7168x4096x4096,4x2048x7168x4096,4x7168x4096x8192,4x2048x7168x8192,8x7168x4096x4096,8x2048x7168x4096"


def parse_shapes(text: str) -> list[tuple[int, int, int, int]]:
    out = []
    for part in text.split(","):
        bits = part.strip().lower().split("x")
        if len(bits) != 4 or not all(b.isdigit() and int(b) > 0 for b in bits):
            raise CmemuError(f"'{part}' is not a shape GROUPSxMxNxK (e.g. 4x7168x4096x4096)")
        out.append(tuple(int(b) for b in bits))
    return out


def parse_tile(text: str) -> tuple[int, int]:
    bits = text.lower().split("x")
    if len(bits) != 2 or not all(b.isdigit() and int(b) > 0 for b in bits):
        raise CmemuError(f"'{text}' is not a tile MxN (e.g. 128x152)")
    return int(bits[0]), int(bits[1])


def gemm_rows(spec, shapes, dtype: str = "int8", tile=(128, 152), cores: int | None = None) -> list[dict]:
    from cmemu.die.gemm import gemm_cost, plan
    from cmemu.die.model import DieModel

    model = DieModel.of(spec.die)
    rows = []
    for g, m, n, k in shapes:
        try:
            c = gemm_cost(model, m, n, k, g, dtype, cores, tile[0], tile[1])
            t = plan(model, m, n, k, g, dtype, tile[0], tile[1])
        except ValueError as exc:
            raise CmemuError(str(exc)) from None
        per_core = c.duration_cycles * c.aic_cores
        rows.append({
            "groups": g, "m": m, "n": n, "k": k, "dtype": dtype,
            "duration_us": round(c.duration_us, 3),
            "cube_utilisation_pct": round(100 * c.cube_utilisation, 1),
            "hbm_gbyte_per_s": round(c.hbm_gbyte_per_s, 1),
            "hbm_mbyte": round(c.hbm_byte / 1e6, 1),
            "l2_hit_pct": round(100 * c.l2_hit_byte / max(1, c.l2_hit_byte + c.hbm_read_byte), 1),
            "mte2_busy_pct": round(100 * c.pipe_busy_cycles["AIC.MTE2"] / per_core, 1),
            "mte1_busy_pct": round(100 * c.pipe_busy_cycles["AIC.MTE1"] / per_core, 1),
            "cube_busy_pct": round(100 * c.pipe_busy_cycles["AIC.CUBE"] / per_core, 1),
            "fixpipe_busy_pct": round(100 * c.pipe_busy_cycles["AIC.FIXP"] / per_core, 1),
            "k_step_elements": t.bk, "l1_chunk_k_elements": t.kl1,
        })
    return rows


@scenario_command("gemm")
@click.option("--shapes", default=DEFAULT_SHAPES, show_default=True, help="GROUPSxMxNxK, comma-separated.")
@click.option("--dtype", type=click.Choice(["int8", "bf16", "fp16"]), default="int8", show_default=True,
              help="Input type (output is bf16).")
@click.option("--tile", default="128x152", show_default=True, help="Base tile MxN of the output.")
@click.option("--cores", type=int, default=None, help="AIC cores to use (default: all of the die's).")
def command(spec, shapes, dtype, tile, cores):
    """Grouped GEMM on one die: cube utilisation and HBM traffic per shape."""
    if cores is not None and not 1 <= cores <= spec.die.aic_cores:
        raise CmemuError(f"--cores must be between 1 and {spec.die.aic_cores}, got {cores}")
    tm, tn = parse_tile(tile)
    params = {"dtype": dtype, "tile": f"{tm}x{tn}", "aic_cores": cores or spec.die.aic_cores}
    return params, gemm_rows(spec, parse_shapes(shapes), dtype, (tm, tn), cores)
