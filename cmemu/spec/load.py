"""Loading presets (TOML) into SystemSpec, with inheritance and ``--set path=value`` overrides.

A preset file holds the system's own fields at top level and one table per part (``[ub]``,
``[d2d]``, ``[rdma]``); the die comes from a die preset named by ``die_preset`` (its fields under
``[die]``). Each physical value is written ``{ value = ..., source = "..." }``; a value without a
source is an error, so provenance cannot be lost. ``extends = "other"`` starts from another preset.
"""
from __future__ import annotations

import copy
import dataclasses
import tomllib
import typing
from importlib import resources

from cmemu.errors import SpecError
from cmemu.spec.model import CommSpec, D2DSpec, DieSpec, EMSSpec, RDMASpec, SystemSpec, UBSpec, VPCSpec

DEFAULT_SYSTEM = "cloudmatrix384"  # the system of a run, a scenario or a generator that names none
_SECTIONS = {"die": DieSpec, "ub": UBSpec, "d2d": D2DSpec, "rdma": RDMASpec, "vpc": VPCSpec, "comm": CommSpec,
             "ems": EMSSpec}
_META_KEYS = {"name", "description", "extends", "die_preset", "kind"}


def _preset_dir():
    return resources.files("cmemu.spec") / "presets"


def list_presets(kind: str = "system") -> list[str]:
    """Names of the shipped presets of a kind ("system" or "die")."""
    names = []
    for entry in _preset_dir().iterdir():
        if entry.name.endswith(".toml"):
            doc = tomllib.loads(entry.read_text(encoding="utf-8"))
            if doc.get("kind", "system") == kind:
                names.append(entry.name[: -len(".toml")])
    return sorted(names)


def _read_preset(name: str) -> dict:
    path = _preset_dir() / f"{name}.toml"
    if not path.is_file():
        known = ", ".join(list_presets("system") + list_presets("die"))
        raise SpecError(f"unknown preset '{name}' (known: {known})")
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise SpecError(f"preset '{name}': invalid TOML: {exc}") from None


def _merge(base: dict, top: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in top.items():
        if isinstance(value, dict) and "value" not in value and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _resolve(name: str, seen: tuple[str, ...] = ()) -> dict:
    if name in seen:
        raise SpecError(f"preset '{name}' extends itself: {' -> '.join(seen + (name,))}")
    doc = _read_preset(name)
    parent = doc.get("extends")
    if parent:
        doc = _merge(_resolve(parent, seen + (name,)), {k: v for k, v in doc.items() if k != "extends"})
    return doc


def _field_types(cls) -> dict[str, type]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls) if f.name != "sources"}


def _check_type(path: str, value, want: type):
    """Return value converted to the field's type, or raise a SpecError naming the field."""
    if want is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if want is int and isinstance(value, int) and not isinstance(value, bool):
        return value
    if want is str and isinstance(value, str):
        return value
    raise SpecError(
        f"field '{path}' expects {want.__name__}, got {type(value).__name__} {value!r}"
    )


def _build_section(cls, table: dict, prefix: str, preset: str):
    types = _field_types(cls)
    values, sources = {}, {}
    for key, entry in table.items():
        path = f"{prefix}{key}"
        if key not in types:
            raise SpecError(f"preset '{preset}': unknown field '{path}'")
        if not isinstance(entry, dict) or "value" not in entry:
            raise SpecError(f"preset '{preset}': field '{path}' must be {{ value = ..., source = \"...\" }}")
        source = entry.get("source")
        if not isinstance(source, str) or not source.strip():
            raise SpecError(f"preset '{preset}': field '{path}' has no source")
        values[key] = _check_type(path, entry["value"], types[key])
        sources[key] = source
    missing = sorted(set(types) - set(values))
    if missing:
        raise SpecError(f"preset '{preset}': missing field(s) {', '.join(prefix + m for m in missing)}")
    return values, sources


def parse_override(text: str) -> tuple[str, object]:
    """Split ``a.b=value``; the value is read as a TOML value (so 7, 7.5, true, "x" work)."""
    if "=" not in text:
        raise SpecError(f"override '{text}' must look like path=value (e.g. ub.link_rate_gbit_per_s=200)")
    path, raw = (s.strip() for s in text.split("=", 1))
    if not path:
        raise SpecError(f"override '{text}' has an empty path")
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw  # a bare word: treat as a string, the type check decides
    return path, value


def _apply_overrides(doc: dict, overrides) -> dict:
    doc = copy.deepcopy(doc)
    system_types = _field_types(SystemSpec)
    for text in overrides:
        path, value = parse_override(text) if isinstance(text, str) else text
        parts = path.split(".")
        if len(parts) == 1:
            key = parts[0]
            if key not in system_types or key in _SECTIONS or key == "name":
                raise SpecError(f"unknown field '{path}' in --set {path}=...")
            table = doc
        elif len(parts) == 2 and parts[0] in _SECTIONS:
            section, key = parts
            if key not in _field_types(_SECTIONS[section]):
                raise SpecError(f"unknown field '{path}' in --set {path}=...")
            table = doc.setdefault(section, {})
        else:
            raise SpecError(f"unknown field '{path}' in --set {path}=...")
        table[key] = {"value": value, "source": f"override: --set {path}={value!r}"}
    return doc


def load_system(name: str = DEFAULT_SYSTEM, overrides=()) -> SystemSpec:
    """Load a system preset by name and apply ``--set`` overrides (strings ``path=value``)."""
    doc = _resolve(name)
    if doc.get("kind", "system") != "system":
        raise SpecError(f"preset '{name}' is a {doc.get('kind')} preset, not a system")
    if "die_preset" in doc:
        die_doc = _resolve(doc["die_preset"])
        if die_doc.get("kind") != "die":
            raise SpecError(f"preset '{name}': die_preset '{doc['die_preset']}' is not a die preset")
        # Values written in the system preset's own [die] table win over the die preset's.
        doc["die"] = _merge(die_doc.get("die", {}), doc.get("die", {}))
    doc = _apply_overrides(doc, overrides)
    parts = {}
    for section, cls in _SECTIONS.items():
        values, sources = _build_section(cls, doc.get(section, {}), f"{section}.", name)
        try:
            parts[section] = cls(**values, sources=sources)
        except ValueError as exc:
            raise SpecError(f"preset '{name}': {exc}") from None
    top = {k: v for k, v in doc.items() if k not in _SECTIONS and k not in _META_KEYS}
    values, sources = _build_section(_SystemTop, top, "", name)
    try:
        return SystemSpec(
            name=doc.get("name", name),
            description=doc.get("description", ""),
            **values,
            **parts,
            sources=sources,
        )
    except ValueError as exc:
        raise SpecError(f"preset '{name}': {exc}") from None


@dataclasses.dataclass
class _SystemTop:
    """The system's own physical fields (those of SystemSpec that are numbers)."""

    nodes: int
    npus_per_node: int
    dies_per_npu: int
    cpus_per_node: int
