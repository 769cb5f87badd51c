"""One writer per output folder: `inferchain run` holds an OS lock on it while it runs.

The lock is `fcntl.flock` on `.inferchain.lock` in the folder, taken without waiting. The
operating system releases it when the process ends, however it ends (SIGKILL included), so
a killed run never leaves a stale lock; the file itself stays (removing it would let two
runs lock two different files). It holds the pid of the run that has it, which a second
run names in its one-line refusal.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import Self

from inferchain.closing import Closing
from inferchain.errors import ConfigError

LOCK = ".inferchain.lock"


class OutputLock(Closing):
    """The exclusive lock of one output folder (made if missing); `with` holds it."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.path = folder / LOCK
        self._fd: int | None = None

    def acquire(self) -> Self:
        """Take the lock now, or raise `ConfigError` naming the folder and the holder's pid."""
        if self._fd is not None:
            return self
        if self.folder.exists() and not self.folder.is_dir():
            raise ConfigError(f"--output {self.folder} is a file, not a folder")
        self.folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "unknown"
            os.close(fd)
            raise ConfigError(
                f"{self.folder} is in use by another inferchain run (pid {holder}): one run "
                "writes an output folder at a time; wait for it, or pass another --output"
            ) from None
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode("ascii"), 0)
        self._fd = fd
        return self

    def close(self) -> None:
        """Release the lock (the process's end does it too)."""
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)  # closing the last descriptor releases the flock

    def __enter__(self) -> Self:
        return self.acquire()
