"""Imports go one way, down the layers (docs/architecture.md):

    base < spec < topology < workload < trace < die < lower < core < results < output < run
         < scenarios < sweep < cli

base is what every layer may use (errors, units, the codes of cmemu.vocab, the kernels' njit of
cmemu.kernels, the package's ``__version__``). A module may import its own layer and those below it, never one above, at the
top of the file or inside a function alike (every import statement is read, with ast; the Cython
engine's with a regular expression). The run pipeline (cmemu.run) conducts the layers below it.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

from conftest import REPO

LAYERS = ("base", "spec", "topology", "workload", "trace", "die", "lower", "core", "results", "output", "run",
          "scenarios", "sweep", "cli")
# cmemu.X -> its layer, for the top-level modules and packages whose name is not their layer's.
LAYER_OF = {"cmemu": "base", "errors": "base", "units": "base", "vocab": "base", "kernels": "base", "_core": "core",
            "faults": "topology", "ems": "topology", "fabric": "topology", "models": "workload", "clihelpers": "run",
            "options": "run", "generators": "run", "importers": "run", "__main__": "cli"}
PACKAGE = REPO / "cmemu"


def layer(module: str) -> str:
    parts = module.split(".")
    name = parts[1] if len(parts) > 1 else "cmemu"
    found = LAYER_OF.get(name, name)
    assert found in LAYERS, f"{module}: in no layer; give cmemu.{name} one in LAYER_OF"
    return found


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports(path: Path, module: str | None = None) -> list[tuple[int, str]]:
    """(line, module) of every import of a cmemu module in the file (of ``module``, by default
    the one at ``path``)."""
    text = path.read_text(encoding="utf-8")
    if path.suffix in (".pyx", ".pxd"):
        return [(text.count("\n", 0, m.start()) + 1, m.group(1))
                for m in re.finditer(r"^\s*(?:from|c?import)\s+(cmemu[\w.]*)", text, re.M)]
    me = (module or module_name(path)).split(".")
    package = me if path.name == "__init__.py" else me[:-1]
    out = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "cmemu"]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] == "cmemu":
                out.append((node.lineno, target))
    return out


def sources():
    return sorted(p for ext in ("*.py", "*.pyx", "*.pxd") for p in PACKAGE.rglob(ext))


def upward_imports() -> list[str]:
    bad = []
    for path in sources():
        me = module_name(path)
        if me == "cmemu":
            continue  # the package's front door: its lazy attributes (open_timeline) are the API
        for line, target in imports(path):
            if LAYERS.index(layer(target)) > LAYERS.index(layer(me)):
                bad.append(f"{path.relative_to(REPO)}:{line}: {me} ({layer(me)}) imports {target} ({layer(target)})")
    return bad


def test_no_import_goes_up_the_layers():
    bad = upward_imports()
    assert not bad, "imports going up the layers:\n" + "\n".join(bad)


def test_every_module_has_a_layer():
    for path in sources():
        layer(module_name(path))


def test_the_checker_sees_imports_inside_functions(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("def f():\n    from cmemu.cli import main\n    import cmemu.run\n    from ..run import x\n")
    assert sorted(t for _, t in imports(f, "cmemu.trace.m")) == ["cmemu.cli", "cmemu.run", "cmemu.run"]


def test_every_test_file_is_in_one_test_layer():
    from conftest import LAYER_OF_TEST, TEST_LAYERS

    files = {p.stem for p in (REPO / "tests").rglob("test_*.py")}
    named = [n for names in TEST_LAYERS.values() for n in names]
    assert len(named) == len(set(named)), "a test file in two layers"
    assert files == set(LAYER_OF_TEST), (sorted(files - set(LAYER_OF_TEST)), sorted(set(LAYER_OF_TEST) - files))
