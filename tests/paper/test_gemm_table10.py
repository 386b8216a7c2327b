"""[CM] v2 table 10 (docs/model.md, "Calibration ([CM] v2 table 10)"): INT8 grouped GEMM cube utilisation on
one die. The one calibrated value is die.mte2_byte_per_cycle; the tolerance, 5 points of
utilisation on every row, bounds the fit's residuals."""
import pytest

from cmemu.die.gemm import gemm_cost
from cmemu.die.model import DieModel
from cmemu.spec import load_system

# [CM] v2 table 10: INT8 grouped GEMM, BF16 output, 128 x 152 tiles, one die.
TABLE_10 = [
    (4, 7168, 4096, 4096, 79.4), (4, 2048, 7168, 4096, 77.4), (4, 7168, 4096, 8192, 82.7),
    (4, 2048, 7168, 8192, 81.1), (8, 7168, 4096, 4096, 79.6), (8, 2048, 7168, 4096, 77.9),
]


def test_gemm_calibration_against_cm_table_10():
    model = DieModel.of(load_system("mini").die)
    for g, m, n, k, util in TABLE_10:
        c = gemm_cost(model, m, n, k, g, "int8", tile_m=128, tile_n=152)
        assert 100 * c.cube_utilisation == pytest.approx(util, abs=5.0), (g, m, n, k)
