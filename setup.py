"""Build for cmemu: the Cython event core in cmemu/_core is compiled at install time, and so are
the Numba kernels the README's main command uses (``warm_up``: a wheel's build runs that
command's trace once from the built package, and the kernels Numba caches beside their sources
go into the wheel; cmemu/kernels.py says when they are used)."""
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy
from Cython.Build import cythonize
from setuptools import Extension, find_packages, setup

try:
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:  # setuptools < 70.1
    try:
        from wheel.bdist_wheel import bdist_wheel
    except ImportError:
        bdist_wheel = None

HERE = Path(__file__).resolve().parent
WARM_UP_TRACE = HERE / "traces" / "deepseek_r1_decode_mini_2layers.json"
# The README's main command, `cmemu run TRACE` (its timeline written in the current folder), with
# this Python. pip builds a wheel where only the build requirements are installed
# (pyproject.toml), so they hold everything this command imports; tests/test_kernels.py checks.
WARM_UP = [sys.executable, "-m", "cmemu.cli", "run", str(WARM_UP_TRACE)]


def warm_up(build_lib) -> None:
    """Compile the Numba kernels into the built package's __pycache__ folders (cache=True), by a
    run of the README's main command in a child process that imports the built package. A build
    without the trace (from an sdist) skips it, and a failed one is reported and skipped: the
    kernels then compile on first use, as they always may (another Numba, Python or CPU than the
    build's, a kernel or signature the command does not use)."""
    if not WARM_UP_TRACE.exists():
        return
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    env["PYTHONPATH"] = os.pathsep.join([str(Path(build_lib).resolve()), *filter(None, [env.get("PYTHONPATH")])])
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # the kernels into the wheel, not the run's .pyc files
    print("compiling the Numba kernels of the README's main command (cmemu/kernels.py)", flush=True)
    with tempfile.TemporaryDirectory(prefix="cmemu-build-") as tmp:
        done = subprocess.run(WARM_UP, env=env, cwd=tmp, capture_output=True, text=True)
    if done.returncode != 0:
        print(f"skipped: the kernels will compile on first use ({done.stderr.strip().splitlines()[-1:]})")


cmdclass = {}
if bdist_wheel is not None:
    class bdist_wheel_with_kernels(bdist_wheel):
        """A wheel with the kernels compiled (``warm_up``); editable installs are not wheels of
        this kind and compile on first use."""

        def run(self):
            self.run_command("build")
            warm_up(self.get_finalized_command("build").build_lib)
            super().run()

    cmdclass["bdist_wheel"] = bdist_wheel_with_kernels

extensions = [
    Extension(
        "cmemu._core.engine",
        ["cmemu/_core/engine.pyx"],
        include_dirs=[numpy.get_include()],
        define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
        extra_compile_args=["-O3"],
    ),
]

setup(
    name="cmemu",
    version="0.1.0",
    description="Cycle-approximate emulator of the Huawei CloudMatrix384 AI supernode",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    python_requires=">=3.11",
    packages=find_packages(include=["cmemu", "cmemu.*"]),
    package_data={
        "cmemu.spec": ["presets/*.toml"],
        "cmemu.trace": ["schema/*.json"],
        "cmemu._core": ["*.pxd"],  # the engine's codes (vocab.pxd), for a build from the sources
        "cmemu.models": ["configs/*.json", "configs/*.toml"],
    },
    ext_modules=cythonize(
        extensions,
        language_level=3,
        compiler_directives={"boundscheck": False, "wraparound": False, "cdivision": True},
    ),
    install_requires=["numpy>=1.26", "numba>=0.60", "h5py>=3.10", "click>=8.1", "matplotlib>=3.7",
                      "distributed>=2024.1", "tqdm>=4.66",  # cmemu sweep: Dask cluster, progress bar
                      "isal>=1.6"],  # the timeline's gzip chunks: ISA-L's deflate, 7x zlib's speed
    extras_require={
        "pandas": ["pandas>=2.0"],  # cmemu.open_timeline returns DataFrames when it is installed
        "chakra": ["mlc-chakra>=1.0"],  # cmemu trace import/export chakra: Chakra's protobuf schema
        "test": ["pytest>=8", "pytest-benchmark>=4", "jsonschema>=4.20", "hypothesis>=6.100"],
    },
    entry_points={"console_scripts": ["cmemu=cmemu.__main__:main"]},
    zip_safe=False,
    cmdclass=cmdclass,
)
