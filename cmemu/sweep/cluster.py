"""The Dask cluster a sweep runs on: a LocalCluster of worker processes, or a running scheduler.

Worker *processes*, one thread each: the event loop of the Cython core holds the GIL, so threads
would run the points one at a time; processes also keep a crashing point (a segfault, memory
exhaustion) to its own worker, which the nanny restarts. Scheduling, retries of lost workers and
data movement are Dask's; cmemu only submits one task per point. The local cluster's workers
leave a Ctrl-C (which a terminal sends to the whole process group) to cmemu, which closes them.
"""
from __future__ import annotations

import contextlib
import logging
import os
import signal

from cmemu.errors import CmemuError
from cmemu.output.atomic import signals_deferred

WORKERS_TIMEOUT_S = 60
LOCAL_RETRIES = 1


def default_workers() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


@contextlib.contextmanager
def _sigint_blocked():
    """SIGINT blocked in this thread for the block (and in the threads it starts, and in the
    processes those start, which inherit the mask); delivered when the block ends."""
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    # multiprocessing's resource tracker, started on first use, unblocks SIGINT in the thread
    # that starts it (the event loop's, as a worker starts): start it here, before.
    from multiprocessing import resource_tracker

    resource_tracker.ensure_running()
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


class _QuietWhileClosing(logging.Filter):
    """Drops a worker's log records (but critical ones) once it is closing: Dask's races at
    shutdown (a heartbeat to a scheduler already gone, a result no longer wanted) log errors
    with tracebacks that are noise once the sweep has ended or been interrupted."""

    def __init__(self, worker):
        super().__init__()
        self.worker = worker

    def filter(self, record) -> bool:
        from distributed.core import Status

        return record.levelno >= logging.CRITICAL or self.worker.status not in (
            Status.closing, Status.closing_gracefully, Status.closed, Status.failed)


def dask_setup(worker) -> None:
    """Run in each worker process of the local cluster as it starts (Dask's preload hook): the
    worker ignores SIGINT. A Ctrl-C at the terminal goes to the whole process group; the workers
    are this process's to stop (closing the cluster stops them), and a worker stopped by the
    signal itself logs dozens of lines of tracebacks before cmemu's one line. And what it logs
    while it closes is dropped (_QuietWhileClosing)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    quiet = _QuietWhileClosing(worker)
    for handler in logging.getLogger("distributed").handlers:
        handler.addFilter(quiet)


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
    from distributed.utils import silence_logging_cmgr

    quiet = contextlib.ExitStack()  # closed after the cluster: see the end
    with quiet, contextlib.ExitStack() as stack:
        if scheduler is None:
            # A point whose worker dies is tried once more (the death may have been another
            # process's doing), not Dask's default three times more: a point that crashes or
            # runs out of memory does so every time. A worker holds only the point it runs
            # (saturation 1.0, no queue of its own), so a worker's death counts against that
            # point alone and never against points that were merely waiting on it.
            stack.enter_context(dask.config.set({"distributed.scheduler.allowed-failures": LOCAL_RETRIES,
                                                 "distributed.scheduler.worker-saturation": 1.0}))
            # The worker processes must not take a Ctrl-C (it goes to the whole process group) as
            # their own: closing the cluster stops them. SIGINT is blocked while the cluster
            # starts its event loop's thread, which starts the workers: both inherit the mask,
            # so a worker never sees it, not even while it imports; dask_setup ignores it in
            # each worker as well. Here, SIGINT and SIGTERM are held off until the cluster and
            # its client are up: one that stopped them half-started would leave Dask to close
            # them at exit, with a traceback.
            with _sigint_blocked(), signals_deferred():
                cluster = stack.enter_context(LocalCluster(
                    n_workers=workers, threads_per_worker=1, processes=True,
                    dashboard_address=":0",  # any free port: other users of the machine may hold 8787
                    silence_logs=logging.ERROR,
                    preload=[__name__],  # dask_setup, in every worker process
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
        try:
            yield client
        except KeyboardInterrupt:
            # Work cut short: what Dask logs about it while the cluster closes (a result it could
            # not gather any more, a worker that stopped mid-task) is noise after cmemu's line.
            quiet.enter_context(silence_logging_cmgr(logging.CRITICAL))
            raise


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
