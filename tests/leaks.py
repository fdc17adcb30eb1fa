"""What a test may not leave behind, counted for this process tree only.

Another test suite may run beside this one on the same machine, so shared-memory
files are counted only when torch named them after this process or one of the
processes it started (``torch_<pid>_...``), never the whole of /dev/shm.
"""

from __future__ import annotations

import contextlib
import gc
import multiprocessing.process
import os
import re
import tempfile
import threading
import time
from multiprocessing import resource_tracker

from torch.utils.data._utils import signal_handling

from pincollate._memory import ownership as _ownership
from pincollate._memory import receiver as _receiver

_started: set[int] = set()
_start = multiprocessing.process.BaseProcess.start


def _recording_start(self: multiprocessing.process.BaseProcess) -> None:
    _start(self)
    if self.pid is not None:
        _started.add(self.pid)


multiprocessing.process.BaseProcess.start = _recording_start  # type: ignore[method-assign]

_TORCH_FILE = re.compile(r"torch_(\d+)_")


# When a worker fails, torch's DataLoader opens ten named temporary files to see how
# close the process is to its descriptor limit; its own SIGCHLD handler can raise in the
# middle of that and orphan one. Such a file is torch's, not a test's.
_PROBE_FILE = re.compile(re.escape(os.path.join(tempfile.gettempdir(), "tmp")) + r"[a-z0-9_]+$")


def fds() -> dict[str, str]:
    """This process's open file descriptors and what each one is (torch's probe files left out)."""
    found = {}
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # the descriptor listdir itself used
            target = os.readlink(f"/proc/self/fd/{fd}")
            if not _PROBE_FILE.match(target):
                found[fd] = target
    return found


def shm_files() -> set[str]:
    """The /dev/shm files that this process or one of its children created and left."""
    if not os.path.isdir("/dev/shm"):
        return set()
    ours = {os.getpid(), *_started}
    found = set()
    for name in os.listdir("/dev/shm"):
        match = _TORCH_FILE.match(name)
        if match and int(match.group(1)) in ours:
            found.add(name)
    return found


def stop_watching(iterator) -> None:
    """Stop torch's SIGCHLD handler from watching a DataLoader iterator's workers.

    That handler raises a dead worker's error wherever the main thread happens to be
    when any child exits (inside ``pytest.raises``, inside the shutdown), so a test
    that kills a worker on purpose stops it first; torch still reports the death
    from ``next()`` (a RuntimeError, or the ConnectionResetError or EOFError of the
    message that was in flight).
    """
    while getattr(iterator, "_worker_pids_set", False):
        try:
            signal_handling._remove_worker_pids(id(iterator))
            iterator._worker_pids_set = False
        except RuntimeError:
            continue  # the handler fired during the removal: it has nothing more to say


def shut_down(iterator) -> None:
    """Shut a DataLoader iterator's workers down at once, also after a worker died."""
    stop_watching(iterator)
    iterator._shutdown_workers()


class Snapshot:
    """Descriptors, our /dev/shm files, threads, rings and leases at one moment."""

    def __init__(self) -> None:
        # Started once per process by the first spawn, and kept: not a test's own.
        resource_tracker.ensure_running()
        gc.collect()
        self.fds = fds()
        self.files = shm_files()
        self.threads = threading.active_count()

    def left(self) -> str | None:
        """What is open now that was not then, or ``None`` when nothing is."""
        gc.collect()
        now = fds()
        extra = {fd: target for fd, target in now.items() if self.fds.get(fd) != target}
        problems = []
        if len(now) > len(self.fds):
            problems.append(f"{len(now) - len(self.fds)} file descriptors ({sorted(extra.values())})")
        files = shm_files() - self.files
        if files:
            problems.append(f"/dev/shm files {sorted(files)}")
        if threading.active_count() > self.threads:
            problems.append(f"threads {[t.name for t in threading.enumerate()]}")
        if _receiver.open_rings():
            problems.append(f"{_receiver.open_rings()} open rings")
        return "; ".join(problems) or None

    def settled(self, seconds: float = 20) -> None:
        """Wait (a bounded time) until nothing is left; fail saying what is."""
        deadline = time.monotonic() + seconds
        while True:
            left = self.left()
            if left is None:
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"left behind: {left}; {_ownership.live()} leases not over")
            time.sleep(0.05)
