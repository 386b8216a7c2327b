"""Reading a trace: a JSON or JSONL file parsed into a document of docs/trace-format.md's shape
(``read_trace``), or a document in memory to run (``TraceDocument``), and the shipped JSON Schema
(``schema_path``). What the document holds is checked by cmemu.trace.check.
"""
from __future__ import annotations

import gc
import hashlib
import json
import sys
from contextlib import contextmanager
from importlib import resources
from pathlib import Path

from cmemu.errors import TraceError


def schema_path():
    """The shipped JSON Schema (draft 2020-12) of trace v1, as a path-like Traversable."""
    return resources.files("cmemu.trace") / "schema" / "trace-v1.schema.json"


@contextmanager
def gc_paused():
    """Pause the cyclic garbage collector while a trace is parsed, generated or checked (a
    context manager, or a function's decorator).

    Parsing, generating and checking allocate millions of small objects, none of them in a cycle;
    with the collector on, it rescans the whole growing trace again and again (about half the load
    time; 1.7 s of the 61-layer decode step's generation, in 11 full collections).
    On the way out they are moved to the oldest generation without a scan (``gc.freeze()`` then
    ``gc.unfreeze()``): left in the youngest, the first allocation after would start a
    collection of all of them (0.5 s for a 670,000-node trace, once after reading and again
    after checking).
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        gc.unfreeze()
        if was_enabled:
            gc.enable()


def read_trace(path) -> tuple[dict, str]:
    """Parse a trace file into ``(doc, sha256)``; ``doc`` has the JSON document's shape.

    ``.jsonl`` files hold the header object (without ``nodes``) on their first non-blank line and
    one node object on each further non-blank line; anything else is read as one JSON document.
    Raises TraceError for a missing or unreadable file and for malformed JSON (line and column).
    """
    spath = str(path)
    p = Path(path)
    try:
        data = p.read_bytes()
    except FileNotFoundError:
        raise TraceError(spath, "no such file") from None
    except IsADirectoryError:
        raise TraceError(spath, "is a directory, not a trace file") from None
    except OSError as exc:
        raise TraceError(spath, f"cannot read: {exc.strerror}") from None
    sha256 = hashlib.sha256(data).hexdigest()
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise TraceError(spath, f"not UTF-8 text: invalid byte at line {line}") from None
    with gc_paused():
        if p.suffix == ".jsonl":
            return _parse_jsonl(text, spath), sha256
        return _parse_json(text, spath, 0), sha256


class TraceDocument:
    """A trace in memory, ready to check and run: a document of docs/trace-format.md's shape
    (what ``read_trace`` parses a file into, or what a generator builds: the scenarios'), the
    name its errors carry, and the file it came from, if any. ``cmemu run`` reads its file into
    one (``read_document``) and the scenarios make one of the dict they generated; both hand it
    to cmemu.run.run_trace, which checks and runs it the same way, so a generated trace needs no
    file. The run takes the document over (``take``) and reads it without changing it: with no
    other reference, it is freed once checked."""

    __slots__ = ("doc", "name", "file", "_sha256")

    def __init__(self, doc: dict, name: str = "<generated trace>", sha256: str | None = None, file=None):
        self.doc, self.name, self.file, self._sha256 = doc, str(name), file, sha256

    @property
    def sha256(self) -> str:
        """The file's sha256; a generated document's is that of the file `cmemu trace gen` would
        write of it (cmemu.trace.writer: the same digest as the run of that file records)."""
        if self._sha256 is None:
            from cmemu.trace.writer import write_trace

            digest = hashlib.sha256()

            class _Hashing:
                def write(self, text):
                    digest.update(text.encode())

            write_trace(self.doc, _Hashing())
            self._sha256 = digest.hexdigest()
        return self._sha256

    def take(self) -> tuple[dict, str]:
        """(document, sha256) for ``load_trace(read=...)``, and this object keeps the document no
        more. The sha256 is "" for a generated document whose ``sha256`` was never asked for (it
        costs a serialisation: a run asks only when it writes a timeline, which records it)."""
        if self.doc is None:
            raise ValueError(f"{self.name}: this trace document was already run")
        read = self.doc, self._sha256 or ""
        self.doc = None
        return read


def read_document(path) -> TraceDocument:
    """A trace file read into memory (``read_trace``)."""
    doc, sha256 = read_trace(path)
    return TraceDocument(doc, str(path), sha256, file=Path(path))


_JSON_SPACE = " \t\n\r"  # JSON's whitespace (str.strip() would take Unicode's, which JSON refuses)


def _parse_json(text: str, spath: str, line_offset: int):
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise TraceError(
            spath,
            f"invalid JSON at line {exc.lineno + line_offset} column {exc.colno}: {exc.msg}",
        ) from None
    except RecursionError:
        raise TraceError(spath, "invalid JSON: nested too deeply") from None
    except ValueError:
        # Python refuses integer literals of more than sys.get_int_max_str_digits() digits.
        raise TraceError(spath, "invalid JSON: a number has too many digits "
                         f"(more than {sys.get_int_max_str_digits()})") from None


def _parse_jsonl(text: str, spath: str) -> dict:
    header = None
    nodes = []
    # json.loads per line, without its wrapper's cost per call (half the read of a 670,000-line
    # trace): the decoder's scanner on the line without its JSON whitespace, which must be one
    # value; anything else goes through json.loads itself, for its error (or, all the same, value).
    scan = json.JSONDecoder().scan_once
    for lineno, line in enumerate(text.split("\n")):
        value = line.strip(_JSON_SPACE)
        if not value:
            continue
        try:
            obj, end = scan(value, 0)
            if end != len(value):
                raise ValueError("extra data")
        except (StopIteration, ValueError, RecursionError):
            if not line.strip():  # blank but for Unicode's whitespace: skipped, as every blank line
                continue
            obj = _parse_json(line, spath, lineno)
        if header is None:
            if type(obj) is not dict:
                raise TraceError(
                    spath, f"line {lineno + 1}: the first line of a JSONL trace must be the "
                    f"header object, got {value_kind(obj)}"
                )
            if "nodes" in obj:
                raise TraceError(
                    spath, f"line {lineno + 1}: a JSONL header must not hold 'nodes'; write one "
                    "node per line after it", field="nodes"
                )
            header = obj
        else:
            nodes.append(obj)
    if header is None:
        raise TraceError(spath, "empty file: expected a header line and node lines")
    doc = dict(header)
    doc["nodes"] = nodes
    return doc


def value_kind(v) -> str:
    if v is None:
        return "null"
    if type(v) is bool:
        return "a boolean"
    if type(v) is str:
        return json.dumps(v if len(v) <= 60 else v[:57] + "...")
    if type(v) is list:
        return "an array"
    if type(v) is dict:
        return "an object"
    return number_text(v)


def number_text(v) -> str:
    """A number for a one-line message: a huge integer by its number of digits, not in full."""
    text = repr(v)
    return text if len(text) <= 40 else f"a {len(text.lstrip('-'))}-digit number"

