"""cmemu.kernels: Numba's compiles are timed and told once (the first run's compile is kept out of
a run's events/s); the kernels' cache is found by the source's content wherever the source is,
and read beside it when Numba caches elsewhere; the build's warm-up needs only the build's
requirements."""
import ast
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tomllib
from importlib import metadata

import numpy as np
import pytest

from cmemu import kernels
from conftest import REPO


@pytest.fixture(autouse=True)
def numba_caches_beside_the_source(monkeypatch):
    """Numba's default: its cache beside the source, as these tests expect, whatever
    NUMBA_CACHE_DIR the suite runs under (a test that wants it elsewhere sets it itself)."""
    import numba

    monkeypatch.setattr(numba.config, "CACHE_DIR", "")


def test_compiles_are_timed_and_told_once(monkeypatch):
    told = []
    monkeypatch.setattr(kernels._COMPILES, "told", False)
    monkeypatch.setattr(kernels._COMPILES, "tell", lambda: told.append(1))

    @kernels.njit(cache=False)
    def inner(x):
        return x * 2

    @kernels.njit(cache=False)
    def outer(a):
        s = 0
        for v in a:
            s += inner(v)
        return s

    before = kernels.compile_seconds()
    assert outer(np.arange(4)) == 12  # compiles outer, and inner within it
    after = kernels.compile_seconds()
    assert after > before and told == [1]
    assert outer(np.arange(5)) == 20  # compiled already: no time, no word
    assert kernels.compile_seconds() == after and told == [1]
    assert outer(np.arange(3.0)) == 6.0  # a new signature compiles, but is not told again
    assert kernels.compile_seconds() > after and told == [1]
    assert kernels._COMPILES.depth == 0


# A module of kernels written to a folder, imported from there as a package's module is.
KERNELS = """
from cmemu.kernels import njit


@njit(cache=True)
def twice(x):
    return x * 2
"""


def load_kernels(folder, source=KERNELS, name="kernels_under_test"):
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "cached_kernels.py"
    if not path.exists() or path.read_text() != source:
        path.write_text(source)
    spec = importlib.util.spec_from_file_location(f"{name}_{abs(hash(str(folder)))}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def compiled(kernel, *args):
    """Call ``kernel``; True if it compiled, False if its cache had it."""
    kernel(*args)
    return sum(kernel.stats.cache_misses.values()) > 0


def test_a_cache_is_found_beside_a_copy_of_the_same_source(tmp_path):
    built = load_kernels(tmp_path / "build")
    assert compiled(built.twice, 3)
    assert sorted(p.suffix for p in (tmp_path / "build" / "__pycache__").glob("cached_kernels.*.nb?")) == [".nbc", ".nbi"]
    # Installed elsewhere, as pip does with a wheel: another folder, the file written anew (its
    # modification time the installation's, here a day earlier than the build's).
    shutil.copytree(tmp_path / "build", tmp_path / "site")
    st = os.stat(tmp_path / "site" / "cached_kernels.py")
    os.utime(tmp_path / "site" / "cached_kernels.py", (st.st_atime - 86400, st.st_mtime - 86400))
    installed = load_kernels(tmp_path / "site")
    assert not compiled(installed.twice, 3) and installed.twice(3) == 6


def test_an_edited_source_compiles_again(tmp_path):
    assert compiled(load_kernels(tmp_path).twice, 3)
    assert not compiled(load_kernels(tmp_path).twice, 3)
    edited = load_kernels(tmp_path, KERNELS.replace("x * 2", "x * 3"))
    assert compiled(edited.twice, 3) and edited.twice(3) == 9
    # ... and so does an edit elsewhere in the file, which leaves the kernel's bytecode as it was
    moved = load_kernels(tmp_path, KERNELS + "\nLIMIT = 4\n")
    assert compiled(moved.twice, 3)


def test_kernels_beside_the_source_are_read_when_numba_caches_elsewhere(tmp_path, monkeypatch):
    """NUMBA_CACHE_DIR set, or a site-packages that is not writable (Numba then caches in the
    user's folder): the kernels the wheel carries beside the sources are read all the same."""
    import numba

    assert compiled(load_kernels(tmp_path / "site").twice, 3)
    monkeypatch.setattr(numba.config, "CACHE_DIR", str(tmp_path / "elsewhere"))
    elsewhere = load_kernels(tmp_path / "site")
    assert elsewhere.twice._cache.cache_path.startswith(str(tmp_path / "elsewhere"))
    assert not compiled(elsewhere.twice, 3)
    assert compiled(elsewhere.twice, 3.0)  # a new signature compiles, and is kept in Numba's folder
    assert [p.suffix for p in (tmp_path / "elsewhere").rglob("cached_kernels.*.nbi")] == [".nbi"]


def test_with_no_writable_folder_the_kernels_are_only_read(tmp_path, monkeypatch):
    assert compiled(load_kernels(tmp_path).twice, 3)
    before = sorted(p.name for p in (tmp_path / "__pycache__").iterdir())
    # Numba's own locators find nothing they can write: cmemu's last one reads beside the source.
    impl = kernels._kernel_cache()._impl_class
    monkeypatch.setattr(impl, "_locator_classes", impl._locator_classes[-1:])
    read_only = load_kernels(tmp_path)
    assert not compiled(read_only.twice, 3)
    assert compiled(read_only.twice, 3.0) and read_only.twice(1.5) == 3.0  # compiled, not kept
    assert sorted(p.name for p in (tmp_path / "__pycache__").iterdir()) == before


def requirement_names(specs):
    """Distribution names of requirement strings, leaving out those only for an extra."""
    return {re.match(r"[A-Za-z0-9._-]+", s).group().lower().replace("_", "-")
            for s in specs if "extra ==" not in s}


def test_the_build_warm_up_needs_only_the_build_requirements(tmp_path):
    """pip builds the wheel where only pyproject.toml's build requirements are installed, and the
    warm-up (setup.py) runs the README's main command there, so that the wheel carries its
    kernels; a module it imports from any other distribution would make it fail, and the first
    run after `pip install .` compile. Run it with every other distribution hidden."""
    readme_command = re.search(r"&& (cmemu run (\S+))\n", (REPO / "README.md").read_text())
    setup = ast.parse((REPO / "setup.py").read_text())
    warm_up_trace = next(n.value for n in ast.walk(setup) if isinstance(n, ast.Assign)
                         and getattr(n.targets[0], "id", "") == "WARM_UP_TRACE")
    parts = sorted((c.col_offset, c.value) for c in ast.walk(warm_up_trace) if isinstance(c, ast.Constant))
    assert "/".join(value for _, value in parts) == readme_command.group(2)  # HERE / "traces" / ...

    allowed, todo = {"cmemu"}, requirement_names(tomllib.loads((REPO / "pyproject.toml").read_text())
                                                 ["build-system"]["requires"])
    while todo:
        name = todo.pop()
        allowed.add(name)
        try:
            todo |= requirement_names(metadata.requires(name) or []) - allowed
        except metadata.PackageNotFoundError:
            pass  # not installed here (a platform's dependency): nothing of it can be imported
    hidden = sorted(module for module, dists in metadata.packages_distributions().items()
                    if not {d.lower().replace("_", "-") for d in dists} & allowed)
    assert "tqdm" in hidden  # a dependency of cmemu, not of its build
    script = (
        "import importlib.abc, runpy, sys\n"
        "hidden = set(sys.argv[1].split(','))\n"
        "class Hide(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path, target=None):\n"
        "        if name.partition('.')[0] in hidden:\n"
        "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
        "sys.meta_path.insert(0, Hide())\n"
        "sys.argv = ['cmemu', *sys.argv[2:]]\n"
        "runpy.run_module('cmemu.cli', run_name='__main__')\n"
    )
    done = subprocess.run([sys.executable, "-c", script, ",".join(hidden), *readme_command.group(1).split()[1:-1],
                           str(REPO / readme_command.group(2))], cwd=tmp_path, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "deepseek_r1_decode_mini_2layers.h5").exists()
