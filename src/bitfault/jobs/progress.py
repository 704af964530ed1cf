"""Progress for long jobs: tqdm bars and short notes on stderr, or nothing at all."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TextIO


class Reporter:
    """Where a job says how far it got. ``Reporter(False)`` (the default) is silent."""

    def __init__(self, enabled: bool = False, stream: TextIO | None = None) -> None:
        self.enabled = enabled
        self.stream = stream if stream is not None else sys.stderr

    def note(self, message: str) -> None:
        if self.enabled:
            print(message, file=self.stream, flush=True)

    @contextmanager
    def bar(self, description: str, total: int, unit: str = "it"
            ) -> Iterator[Callable[[int, int], None]]:
        """A ``(done, total)`` callback drawing one bar (a no-op when disabled)."""
        if not self.enabled:
            yield lambda done, total: None
            return
        try:
            from tqdm import tqdm
        except ModuleNotFoundError:  # no tqdm: one line at the end instead of a bar
            seen = [0]
            yield lambda done, total: seen.__setitem__(0, done)
            self.note(f"{description}: {seen[0]}/{total} {unit}")
            return
        bar: Any = tqdm(total=total, desc=description, unit=unit, file=self.stream,
                        leave=True, dynamic_ncols=True, mininterval=0.2)

        def update(done: int, new_total: int) -> None:
            if new_total != bar.total:
                bar.total = new_total
            bar.update(max(0, done - bar.n))

        try:
            yield update
        finally:
            bar.close()


def _silence_loggers() -> None:
    """Log levels set before TensorFlow is imported (its C++ side reads them once)."""
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
    for name in ("tensorflow", "absl", "keras"):
        logging.getLogger(name).setLevel(logging.ERROR)


@contextmanager
def libraries_silenced() -> Iterator[None]:
    """For --quiet/--json: TensorFlow's, absl's and Keras' logs off, and what native code
    writes to file descriptor 2 (TensorFlow's C++ start-up lines, which no log level
    reaches) to /dev/null; ``sys.stderr`` (bitfault's error line) still reaches stderr."""
    _silence_loggers()
    try:
        uses_fd2 = sys.stderr.fileno() == 2
    except (AttributeError, OSError, ValueError):  # a captured stream: leave it be
        uses_fd2 = False
    sys.stderr.flush()
    saved, devnull, before = os.dup(2), os.open(os.devnull, os.O_WRONLY), sys.stderr
    try:
        if uses_fd2:
            sys.stderr = open(saved, "w", closefd=False, encoding=before.encoding,
                              errors=before.errors, buffering=1)
        os.dup2(devnull, 2)
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        if uses_fd2:
            sys.stderr.close()
            sys.stderr = before
        os.close(devnull)
        os.close(saved)


SILENT = Reporter(False)

__all__ = ["SILENT", "Reporter", "libraries_silenced"]
