"""Presets load, every physical value carries a source, overrides are validated."""
import dataclasses

import pytest

from cmemu.errors import SpecError
from cmemu.spec import list_presets, load_system

SYSTEMS = ["cloudmatrix384", "cloudmatrix384-192", "cloudmatrix384-256", "cloudmatrix384-288",
           "cloudmatrix384-352", "mini"]


def test_shipped_presets():
    assert list_presets() == sorted(SYSTEMS)
    assert list_presets("die") == ["ascend910c"]


@pytest.mark.parametrize("name", SYSTEMS)
def test_every_physical_value_has_a_source(name):
    spec = load_system(name)
    for part in (spec, spec.die, spec.ub, spec.d2d, spec.rdma, spec.vpc, spec.comm, spec.ems):
        for f in dataclasses.fields(part):
            value = getattr(part, f.name)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                assert part.sources.get(f.name, "").strip(), f"{name}: {f.name} has no source"


def test_cloudmatrix384_matches_spec_md():
    s = load_system("cloudmatrix384")
    assert (s.nodes, s.npus, s.dies, s.cpus) == (48, 384, 768, 192)
    assert s.ub.link_rate_byte_per_s == 28_000_000_000  # 224 Gb/s
    assert s.ub.die_ports * s.ub.link_rate_byte_per_s == 196_000_000_000  # 196 GB/s per die
    # docs/machine.md 2.1: 24 x 4096 x 2 x 1.8e9 = 353.9 TFLOPS bf16 per die.
    assert s.die.cube_peak_flop_per_s_bf16 == pytest.approx(353.89e12, rel=1e-4)
    assert s.die.cube_peak_op_per_s_int8 == pytest.approx(2 * 353.89e12, rel=1e-4)


def test_mini_inherits_the_design():
    big, mini = load_system("cloudmatrix384"), load_system("mini")
    assert mini.nodes == 2 and mini.dies == 32
    assert mini.ub == big.ub and mini.die == big.die


def test_override_changes_value_and_records_source():
    s = load_system("mini", ["ub.link_rate_gbit_per_s=200", "die.aic_cores=16", "nodes=4"])
    assert s.ub.link_rate_gbit_per_s == 200.0
    assert s.die.aic_cores == 16 and s.nodes == 4
    assert s.ub.sources["link_rate_gbit_per_s"].startswith("override")


@pytest.mark.parametrize(
    "override, names",
    [
        ("ub.no_such_field=1", "ub.no_such_field"),
        ("nosection.x=1", "nosection.x"),
        ("colour=1", "colour"),
        ("nodes=2.5", "nodes"),
        ("die.aic_cores=\"many\"", "die.aic_cores"),
        ("ub.link_rate_gbit_per_s=fast", "ub.link_rate_gbit_per_s"),
        ("nodes=true", "nodes"),
        ("d2d.rate_gbyte_per_s=-1", "d2d.rate_gbyte_per_s"),
        ("no_equals_sign", "path=value"),
    ],
)
def test_bad_override_names_the_field(override, names):
    with pytest.raises(SpecError, match=names.replace(".", r"\.")):
        load_system("mini", [override])


def test_unknown_preset():
    with pytest.raises(SpecError, match="unknown preset 'nope'"):
        load_system("nope")


def test_too_many_nodes_for_the_l2_ports():
    # 16 uplinks per L1 x 49 nodes need 49 ports on each of 16 L2 chips; they have 48.
    with pytest.raises(SpecError, match="l2_ports_per_chip"):
        load_system("cloudmatrix384", ["nodes=49"])
