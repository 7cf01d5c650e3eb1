"""Independent pieces of work spread over the machine's cores, results in input order.

Worker processes are forked: they start with everything this process holds (the policy and its
compiled patterns, the expanded inputs, the resolvers), so nothing is re-imported or pickled on
the way in; only each result is pickled back. Output does not depend on the number of workers.
With one core, one piece of work, or no fork on the platform, the work runs here, in order.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Sequence

from audit import forking
from audit.errors import AuditError

_work: tuple[Callable, Sequence] | None = None  # what forked workers run (set before they start)


def cpu_count() -> int:
    """Cores this process may run on (the affinity mask, not the machine's total)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _run(i: int):
    fn, items = _work
    return fn(items[i])


def map_ordered(fn: Callable, items: Sequence, jobs: int, order: Sequence[int] | None = None) -> list:
    """[fn(x) for x in items], on up to `jobs` forked processes.

    `order`: the indices in the order to start them (the largest first keeps both cores busy
    to the end). An exception in `fn` is raised here, as it would be in a loop; a worker that
    dies (killed for memory, say) is an AuditError (exit 4), never a hang."""
    global _work, _parent
    n = len(items)
    if jobs <= 1 or n < 2:
        return [fn(x) for x in items]
    import multiprocessing  # here: a one-file audit never pays for importing them
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    if "fork" not in multiprocessing.get_all_start_methods():
        return [fn(x) for x in items]
    idx = list(order) if order is not None else list(range(n))
    out: list = [None] * n
    _work, _parent = (fn, items), os.getpid()
    pool = ProcessPoolExecutor(min(jobs, n), mp_context=multiprocessing.get_context("fork"),
                               initializer=_worker_start)
    try:
        # the workers are forked with Ctrl-C and SIGTERM held until _worker_start has set their
        # own handling (audit.forking)
        with forking.held():
            results = pool.map(_run, idx)  # forks every worker (fork: all at the first submit)
        for i, result in zip(idx, results):
            out[i] = result
    except BrokenProcessPool:
        raise AuditError("a worker process died (out of memory?); run again with --jobs 1") from None
    except BaseException:
        # interrupted (Ctrl-C, SIGTERM) or failed: stop the workers now, not after the whole queue
        for proc in list((getattr(pool, "_processes", None) or {}).values()):
            proc.terminate()
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        _work = None
    return out


def _worker_start() -> None:
    """A worker is stopped by the process that started it: it ignores the terminal's Ctrl-C
    (sent to the whole process group), dies at once on SIGTERM, and is sent SIGTERM by the
    kernel when that process dies without stopping it (killed with SIGKILL, say): an orphaned
    worker would otherwise wait forever for work."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C pending since the fork is dropped
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    forking.release()  # held by map_ordered over the fork
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != _parent:  # it died before the request was made
            os._exit(1)
    except (OSError, AttributeError):  # not Linux: the parent's own handling has to do
        pass


_PR_SET_PDEATHSIG = 1
_parent = os.getpid()  # the process that forks the workers (reset in map_ordered)
