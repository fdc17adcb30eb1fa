"""Locks a forked child gets unlocked.

A DataLoader forks its workers from whichever thread starts an epoch, while another thread of
the process may be collating (a validation loader, a thread pool): a lock that thread holds at
the fork is held for good in the child, whose copy of the holder never runs, and the worker's
first batch waits on it forever. Every lock of the package is made here and re-made unlocked in
a forked child (``_at_fork_reinit``, as the standard library does for its own locks), whatever
the parent's thread was doing: what the lock guarded is the child's own copy from then on.
"""

from __future__ import annotations

import os
import threading
import weakref
from typing import Any

__all__ = ["new_lock", "new_rlock"]

_made: weakref.WeakSet[Any] = weakref.WeakSet()


def new_lock() -> threading.Lock:
    """A ``threading.Lock`` that a forked child gets unlocked."""
    lock = threading.Lock()
    _made.add(lock)
    return lock


def new_rlock() -> threading.RLock:
    """A ``threading.RLock`` that a forked child gets unlocked."""
    lock = threading.RLock()
    _made.add(lock)
    return lock


def _after_fork_in_child() -> None:
    for lock in list(_made):
        lock._at_fork_reinit()


os.register_at_fork(after_in_child=_after_fork_in_child)
