"""One process at a time in a run directory: ``train``, ``campaign`` and ``report`` hold it.

The lock is an advisory ``flock`` on the run directory itself (non-blocking: a second
process fails at once), so the kernel drops it when its holder dies, even by
``kill -9``. While held, ``RUN_DIR/.lock`` names the holder (pid, host, command, start
time) for the second process's error; it is removed on release. Where ``fcntl`` does not
exist (Windows) nothing is locked.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

try:
    import fcntl
except ModuleNotFoundError:  # Windows
    fcntl = None  # type: ignore[assignment]

LOCK_FILE = ".lock"


class RunDirBusy(OSError):
    """Another process holds the run directory."""


def _holder(path: Path) -> str:
    try:
        info = json.loads((path / LOCK_FILE).read_text(encoding="utf-8"))
        return (f"pid {info['pid']} on {info['host']} ({info['command']}, since "
                f"{info['since']})")
    except (OSError, ValueError, KeyError, TypeError):
        return "another process"


@contextmanager
def lock_run_dir(path: str | os.PathLike[str], command: str) -> Iterator[None]:
    """Hold ``path`` (an existing directory) for ``command``; a busy one raises RunDirBusy."""
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"{path}: no such run directory")
    if fcntl is None:
        yield
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RunDirBusy(f"{path}: in use by {_holder(path)}; wait for it to finish (or "
                             "use another run directory)") from None
        info = {"pid": os.getpid(), "host": platform.node(), "command": command,
                "argv": sys.argv, "since": time.strftime("%Y-%m-%d %H:%M:%S")}
        lock_file = path / LOCK_FILE
        with suppress(OSError):  # a read-only directory is still locked, just not described
            lock_file.write_text(json.dumps(info) + "\n", encoding="utf-8")
        try:
            yield
        finally:
            with suppress(OSError):
                lock_file.unlink(missing_ok=True)
    finally:
        os.close(fd)  # releases the flock


__all__ = ["LOCK_FILE", "RunDirBusy", "lock_run_dir"]
