"""cmemu's Numba kernels: how they are compiled and cached, and the time compiling takes.

Every kernel is ``njit(cache=True)``, with this module's ``njit`` (Numba's, imported on the first
kernel's definition, so that importing this module costs nothing). Numba compiles a kernel on its
first call with a new signature and keeps the machine code on disk, keyed by Numba's version, the
Python version, the CPU and the function's bytecode; cmemu's cache (``_kernel_cache``) differs
from Numba's own in two ways, so that the kernels a wheel carries are found where it is installed:

- the source is stamped by the hash of its content, as Numba does from 0.68 on (before, by its
  modification time and size, which an installed file never keeps: pip gives it the time of
  installation), so a copy of the same source finds the kernels, and an edit recompiles them;
- the ``__pycache__`` folder beside the source, where the wheel's kernels are (setup.py,
  ``warm_up``: ``pip install .`` compiles those the README's main command uses as it builds), is
  read as well when Numba keeps its cache elsewhere: with ``NUMBA_CACHE_DIR`` set, or when
  site-packages is not writable (the user's cache folder then); and when nothing is writable at
  all it is only read, where Numba's own cache fails at the kernel's definition.

A kernel, a signature or a machine (Numba, Python, CPU) the build did not see is compiled on
first use, once, into the folder Numba picked.

Numba's ``numba:compile`` events are watched from the first kernel's definition: the compile
time so far (``compile_seconds``), which a run keeps out of its events/s figure, and one line to
the user the first time anything compiles in a process (``tell_compiles``: the command line's).
"""
from __future__ import annotations

import functools
import hashlib
import os
import threading
import time

COMPILE_NOTICE = "cmemu: compiling kernels (first run only: Numba keeps them) ..."


class _Compiles:
    """Wall time in Numba's compiler, counted once however deep compiles nest."""

    def __init__(self):
        self.lock = threading.Lock()
        self.depth = 0
        self.since = 0.0
        self.total_s = 0.0
        self.tell = None  # called once, at the first compile
        self.told = False

    def on_start(self, event):
        with self.lock:
            if self.depth == 0:
                self.since = time.perf_counter()
                if self.tell is not None and not self.told:
                    self.told = True
                    self.tell()
            self.depth += 1

    def on_end(self, event):
        with self.lock:
            self.depth -= 1
            if self.depth == 0:
                self.total_s += time.perf_counter() - self.since


_COMPILES = _Compiles()
_WATCHING = []


def njit(*args, **options):
    """numba.njit, with the compiles watched and ``cache=True`` meaning cmemu's cache (module
    docstring)."""
    import numba

    if not _WATCHING:
        from numba.core import event

        class Listener(event.Listener):
            def on_start(self, e):
                _COMPILES.on_start(e)

            def on_end(self, e):
                _COMPILES.on_end(e)

        event.register("numba:compile", Listener())
        _WATCHING.append(True)
    if not options.pop("cache", False):
        return numba.njit(*args, **options)
    if args and callable(args[0]):  # njit(f, cache=True), for @njit(cache=True)
        return njit(**options, cache=True)(args[0])
    if args:  # numba would compile them as it decorates, before the cache is set
        raise TypeError("njit(cache=True) takes no signatures: a kernel compiles on its first call")
    decorate = numba.njit(**options)

    def cached(func):
        kernel = decorate(func)
        if hasattr(kernel, "enable_caching"):  # not with NUMBA_DISABLE_JIT: a plain function
            kernel._cache = _kernel_cache()(kernel.py_func)  # in place of enable_caching()'s
        return kernel

    return cached


def source_stamp(path) -> bytes:
    """The stamp of a kernel's source file in cmemu's cache: the SHA-256 of its bytes (Numba's
    own from 0.68 on, so that either reads what the other wrote)."""
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).digest()


@functools.cache
def _kernel_cache():
    """cmemu's cache of a kernel (module docstring): a numba FunctionCache whose source stamp is
    ``source_stamp``, which reads the kernels beside the source when Numba's cache is elsewhere,
    and which only reads them there when no folder is writable. Made on first use, as Numba is
    imported then."""
    import inspect

    from numba.core.caching import CompileResultCacheImpl, FunctionCache, IndexDataCacheFile, _CacheLocator

    def beside(py_file):
        return os.path.join(os.path.dirname(os.path.abspath(py_file)), "__pycache__")

    class ShippedLocator(_CacheLocator):
        """The ``__pycache__`` folder beside the source, read-only: the last resort, after
        Numba's own locators found no folder they can write."""

        def __init__(self, py_func, py_file):
            self._py_file = py_file
            self._lineno = py_func.__code__.co_firstlineno

        def ensure_cache_path(self):
            raise OSError(f"{self.get_cache_path()}: kernels are only read from here")

        def get_cache_path(self):
            return beside(self._py_file)

        def get_source_stamp(self):
            return source_stamp(self._py_file)

        def get_disambiguator(self):
            return str(self._lineno)  # Numba's, for a function in a source file

        @classmethod
        def from_function(cls, py_func, py_file):
            return cls(py_func, py_file) if os.path.exists(py_file) else None

    class KernelCacheImpl(CompileResultCacheImpl):
        _locator_classes = [*CompileResultCacheImpl._locator_classes, ShippedLocator]

    class KernelCache(FunctionCache):
        _impl_class = KernelCacheImpl

        def __init__(self, py_func):
            super().__init__(py_func)
            py_file = inspect.getfile(py_func)
            stamp = source_stamp(py_file)
            base = self._impl.filename_base
            self._cache_file = IndexDataCacheFile(self._cache_path, base, stamp)
            shipped = beside(py_file)
            same = os.path.normcase(os.path.abspath(self._cache_path)) == os.path.normcase(shipped)
            self._shipped = None if same else IndexDataCacheFile(shipped, base, stamp)

        def _load_overload(self, sig, target_context):
            found = super()._load_overload(sig, target_context)
            if found is None and self._enabled and self._shipped is not None:
                data = self._shipped.load(self._index_key(sig, target_context.codegen()))
                if data is not None:
                    found = self._impl.rebuild(target_context, data)
            return found

        def _save_overload(self, sig, data):
            if not isinstance(self._impl.locator, ShippedLocator):
                super()._save_overload(sig, data)

        def flush(self):
            if not isinstance(self._impl.locator, ShippedLocator):
                super().flush()

    return KernelCache


def compile_seconds() -> float:
    """Seconds this process has spent compiling kernels so far (a compile under way included)."""
    with _COMPILES.lock:
        running = time.perf_counter() - _COMPILES.since if _COMPILES.depth else 0.0
        return _COMPILES.total_s + running


def tell_compiles(tell) -> None:
    """Call ``tell()`` once, when a kernel is first compiled in this process (not for cached ones)."""
    _COMPILES.tell = tell
