"""Build for cmemu: the Cython event core in cmemu/_core is compiled at install time."""
import numpy
from Cython.Build import cythonize
from setuptools import Extension, find_packages, setup

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
    entry_points={"console_scripts": ["cmemu=cmemu.cli:main"]},
    zip_safe=False,
)
