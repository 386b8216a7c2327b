"""cmemu: a cycle-approximate emulator of the Huawei CloudMatrix384 AI supernode.

Importing the package does no work: presets, topology and the native core load on demand.
"""
__version__ = "0.1.0"

from cmemu.errors import CmemuError  # noqa: E402

__all__ = ["CmemuError", "__version__", "open_timeline"]


def __getattr__(name):
    # Loaded on first use, so that importing cmemu stays free of h5py and numpy.
    if name == "open_timeline":
        from cmemu.output.reader import open_timeline

        return open_timeline
    raise AttributeError(f"module 'cmemu' has no attribute {name!r}")
