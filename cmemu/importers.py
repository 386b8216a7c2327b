"""`cmemu trace import` and `cmemu trace export`: the format converters of cmemu.trace.importers
with the system they are checked against and the files they write (whole, or not at all:
cmemu.output.atomic). docs/trace-format.md, "Importers"."""
from __future__ import annotations

from pathlib import Path

from cmemu.output.atomic import atomic_files, atomic_open
from cmemu.spec import SystemSpec
from cmemu.trace.importers.common import check_built
from cmemu.trace.writer import write_trace


def write_doc(doc: dict, output) -> None:
    """A trace document to ``output``: JSON, or JSONL when the name ends with ``.jsonl``."""
    output = Path(output)
    with atomic_open(output, "w", encoding="utf-8") as f:
        write_trace(doc, f, jsonl=output.suffix == ".jsonl")


def import_ascend_to_file(root, output, spec: SystemSpec, step=None, deps="time"):
    """Import Ascend profiles (cmemu.trace.importers.ascend) and write the trace, checked as
    ``cmemu run`` reads it; the ImportResult (its ``summary_lines``)."""
    from cmemu.trace.importers.ascend import import_ascend

    result = import_ascend(root, spec.dies, spec.name, step, deps, (spec.die.aic_cores, spec.die.aiv_cores))
    check_built(result.doc, output, spec.dies)
    write_doc(result.doc, output)
    return result


def import_chakra_to_file(prefix, output, system=None, overrides=()) -> list[str]:
    """Import a Chakra ET and write the trace; the system is ``system``, else a cmemu export's
    own, else the default. The lines to print."""
    from cmemu.run.pipeline import resolve_system
    from cmemu.trace.importers.chakra import chakra_to_doc

    doc, unmapped = chakra_to_doc(str(prefix), system)
    spec = resolve_system(doc.get("system"), system, overrides)
    doc["system"] = spec.name
    check_built(doc, output, spec.dies)
    write_doc(doc, output)
    ranks = len({n["rank"] for n in doc["nodes"]})
    return [f"wrote {output}: {len(doc['nodes']):,} nodes on {ranks} rank(s) from {prefix}.*.et"] + [
        f"  not mapped: {line}" for line in unmapped.lines()]


def export_chakra(path, prefix, system=None, overrides=()) -> list[str]:
    """Load a cmemu trace (checked against its system) and write it as Chakra ET files,
    ``PREFIX.{rank}.et``. The lines to print."""
    from cmemu.run.pipeline import resolve_system
    from cmemu.trace import load_trace, read_trace
    from cmemu.trace.importers.chakra import require_chakra, trace_to_chakra

    require_chakra()  # the missing extra is the first thing to say
    read = read_trace(path)
    header_system = read[0].get("system") if isinstance(read[0], dict) else None
    spec = resolve_system(header_system if isinstance(header_system, str) else None, system, overrides)
    trace = load_trace(path, num_ranks=spec.dies, read=read)
    files = trace_to_chakra(trace)
    base = Path(prefix)
    paths = [base.parent / f"{base.name}.{rank}.et" for rank in files]
    with atomic_files(paths, "wb", inputs=(trace.path,)) as outs:
        for f, data in zip(outs, files.values()):
            f.write(data)
    return [f"wrote {len(paths)} Chakra trace file(s) {base.name}.0.et ... ({len(trace.nodes):,} nodes)"]
