"""cmemu: a cycle-approximate emulator of the Huawei CloudMatrix384 AI supernode.

Importing the package does no work: presets, topology and the native core load on demand.
"""
__version__ = "0.1.0"

from cmemu.errors import CmemuError  # noqa: E402

__all__ = ["CmemuError", "__version__"]
