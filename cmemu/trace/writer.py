"""Writing a trace document (a dict, docs/trace-format.md) to a text file: JSON with one node per
line, or JSONL (the header, then one node per line). What `cmemu trace gen`, the sweeps'
generated points and the scenarios write their traces with."""
from __future__ import annotations

import json


def write_trace(doc: dict, f, jsonl: bool = False) -> None:
    """Write ``doc`` to the open text file ``f`` (JSONL if ``jsonl``)."""
    header = {k: v for k, v in doc.items() if k != "nodes"}
    if jsonl:
        f.write(json.dumps(header) + "\n")
        for node in doc["nodes"]:
            f.write(json.dumps(node, separators=(",", ":")) + "\n")
    else:
        f.write(json.dumps(header)[:-1] + ', "nodes": [\n')
        f.write(",\n".join(json.dumps(n, separators=(",", ":")) for n in doc["nodes"]))
        f.write("\n]}\n")
