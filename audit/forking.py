"""Forking with Ctrl-C and SIGTERM held.

Ctrl-C reaches the whole process group, so also a child forked an instant before it. Until the
child's own handling takes over, it would run the parent's (a traceback on stderr, or the parent's
clean-up run a second time). So the signals are blocked over the fork: the parent takes one that
came meanwhile as soon as its mask is back, the child once it has set up its own handling.
"""

from __future__ import annotations

import os
import signal
from contextlib import contextmanager

HELD = frozenset({signal.SIGINT, signal.SIGTERM})


@contextmanager
def held():
    """Ctrl-C and SIGTERM blocked in this thread for the block, and in processes forked in it
    until they call `release()`. A forked child must not leave the block itself (its mask would
    come back there, before its own handling): use `fork()` for one that returns from the fork."""
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, HELD)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)


def fork() -> int:
    """os.fork() with the signals held: the parent's mask is back on return; the child's stays
    held until it calls `release()` where its own handling is in place (inside its try, say)."""
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, HELD)
    try:
        pid = os.fork()
    except BaseException:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        raise
    if pid != 0:  # not in the child: a mask put back there would let the signal in too early
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    return pid


def release() -> None:
    """In a child of `fork()` or of a fork under `held()`: take Ctrl-C and SIGTERM again."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, HELD)
