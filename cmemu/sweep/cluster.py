"""The Dask cluster a sweep runs on: a LocalCluster of worker processes, or a running scheduler.

Worker *processes*, one thread each: the event loop of the Cython core holds the GIL, so threads
would run the points one at a time; processes also keep a crashing point (a segfault, memory
exhaustion) to its own worker, which the nanny restarts. Scheduling, retries of lost workers and
data movement are Dask's; cmemu only submits one task per point.
"""
from __future__ import annotations

import contextlib
import logging
import os

from cmemu.errors import CmemuError

WORKERS_TIMEOUT_S = 60
LOCAL_RETRIES = 1


def default_workers() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def _worker_version():
    import cmemu

    return cmemu.__version__


@contextlib.contextmanager
def connect(scheduler: str | None, workers: int):
    """A ``distributed.Client``; the local cluster (when there is one) and the client are closed
    on the way out, whatever happens."""
    try:
        from distributed import Client, LocalCluster
    except ImportError:
        raise CmemuError("cmemu sweep needs Dask: pip install distributed") from None
    import dask

    with contextlib.ExitStack() as stack:
        if scheduler is None:
            # A point whose worker dies is tried once more (the death may have been another
            # process's doing), not Dask's default three times more: a point that crashes or
            # runs out of memory does so every time. A worker holds only the point it runs
            # (saturation 1.0, no queue of its own), so a worker's death counts against that
            # point alone and never against points that were merely waiting on it.
            stack.enter_context(dask.config.set({"distributed.scheduler.allowed-failures": LOCAL_RETRIES,
                                                 "distributed.scheduler.worker-saturation": 1.0}))
            cluster = stack.enter_context(LocalCluster(
                n_workers=workers, threads_per_worker=1, processes=True,
                dashboard_address=":0",  # any free port: other users of the machine may hold 8787
                silence_logs=logging.ERROR,
            ))
            client = stack.enter_context(Client(cluster))
        else:
            # The connect timeout is Dask's: distributed.comm.timeouts.connect (30 s unless set,
            # e.g. DASK_DISTRIBUTED__COMM__TIMEOUTS__CONNECT=5s).
            try:
                client = stack.enter_context(Client(scheduler))
            except (OSError, TimeoutError, ValueError) as exc:
                raise CmemuError(f"cannot reach the Dask scheduler at {scheduler}: {exc}") from None
            check_workers(client, scheduler)
        yield client


def check_workers(client, scheduler: str) -> None:
    """Workers of a cluster we did not start must run this cmemu (a point's key includes the
    version, so another version would file its results under the wrong key)."""
    from cmemu import __version__

    try:
        client.wait_for_workers(1, timeout=WORKERS_TIMEOUT_S)
    except TimeoutError:
        raise CmemuError(f"no Dask worker joined the scheduler at {scheduler} within "
                         f"{WORKERS_TIMEOUT_S} s") from None
    try:
        versions = client.run(_worker_version)
    except ImportError:
        raise CmemuError(f"the workers of {scheduler} cannot import cmemu; install it on them") from None
    wrong = {w: v for w, v in versions.items() if v != __version__}
    if wrong:
        w, v = next(iter(wrong.items()))
        raise CmemuError(f"worker {w} of {scheduler} runs cmemu {v}, this is {__version__}; "
                         "install the same version everywhere")
