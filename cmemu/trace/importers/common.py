"""What the importers share: their error, the summary of what they could not map, and the check
of the trace they built (docs/trace-format.md, "Importers"). Writing the files is cmemu.importers'."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from cmemu.errors import CmemuError

EXAMPLES = 3  # names shown per summary line


class InputFileError(CmemuError):
    """An input file cannot be imported: the message names the file, and the line and column
    where the file has them."""

    def __init__(self, path, message, line=None, column=None):
        self.path, self.line, self.column, self.detail = str(path), line, column, message
        where = self.path
        if line is not None:
            where += f": line {line}"
        if column is not None:
            where += f", column {column}"
        super().__init__(f"{where}: {message}")


@dataclass
class Unmapped:
    """What an import could not map exactly, by kind: one summary line each (count, examples)."""

    kinds: dict = field(default_factory=dict)  # kind -> [count, examples]

    def add(self, kind: str, example: str) -> None:
        entry = self.kinds.setdefault(kind, [0, []])
        entry[0] += 1
        if len(entry[1]) < EXAMPLES and example not in entry[1]:
            entry[1].append(example)

    def lines(self) -> list[str]:
        return [f"{kind}: {count:,} (e.g. {', '.join(examples)})"
                for kind, (count, examples) in sorted(self.kinds.items(), key=lambda kv: (-kv[1][0], kv[0]))]


def read_json(path: Path):
    """A JSON file's value; a missing or malformed file is an InputFileError naming line and column."""
    try:
        text = path.read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        raise InputFileError(path, "no such file") from None
    except UnicodeDecodeError as exc:
        line = path.read_bytes()[:exc.start].count(b"\n") + 1
        raise InputFileError(path, "not UTF-8 text", line) from None
    except OSError as exc:
        raise InputFileError(path, f"cannot read: {exc.strerror or exc}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputFileError(path, f"invalid JSON: {exc.msg}", exc.lineno, exc.colno) from None


def check_built(doc: dict, output, num_ranks: int) -> None:
    """The trace an importer built must be valid; if it is not, the importer's mapping is at
    fault, and the first problem says where."""
    from cmemu.trace.check import check_trace

    errors = check_trace(doc, str(output), num_ranks)
    if errors:
        raise CmemuError(f"the imported trace is not valid ({len(errors)} problem(s)); the first: {errors[0]}")
