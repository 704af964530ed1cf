"""Progress for long jobs: tqdm bars (plain lines off a terminal) and short notes on
stderr, or nothing at all."""

from __future__ import annotations

import importlib.util
import logging
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TextIO


class Bar:
    """One progress bar, called as ``bar(done, total)``. Its first call says where the work
    starts (trials an earlier run stored show as done before); ``note(text)`` adds state
    (the running loss, why it stopped). On a terminal a tqdm bar; elsewhere (a log file, CI)
    one line at every tenth of the way and a last one only if it says something new."""

    def __init__(self, description: str, total: int, unit: str, stream: TextIO | None,
                 interactive: bool) -> None:
        self.description, self.total, self.unit, self.stream = description, total, unit, stream
        self.interactive = interactive
        self.done: int | None = None  # None: not started
        self.start, self.text = 0, ""
        self._tqdm: Any = None
        self._tenth, self._printed = -1, ""

    def __call__(self, done: int, total: int | None = None) -> None:
        if total is not None:
            self.total = total
        if self.done is None:
            self.start = done
        self.done = done
        self._draw()

    def note(self, text: str) -> None:
        self.text = text
        if self._tqdm is not None:
            self._tqdm.set_postfix_str(self._extra())

    def _extra(self) -> str:
        before = f"{self.start} done before" if self.start else ""
        return ", ".join(p for p in (before, self.text) if p)

    def line(self) -> str:
        """The bar as one line of text."""
        done = self.done or 0
        share = f" ({100 * done // self.total}%)" if self.total else ""
        extra = self._extra()
        unit = self.unit if self.total == 1 else f"{self.unit}s"
        return f"{self.description}: {done}/{self.total} {unit}{share}" + (
            f", {extra}" if extra else "")

    def _draw(self) -> None:
        if self.stream is None:
            return
        if self.interactive:
            if self._tqdm is None:
                from tqdm import tqdm

                self._tqdm = tqdm(total=self.total, initial=self.start, desc=self.description,
                                  unit=self.unit, file=self.stream, leave=True,
                                  dynamic_ncols=True, mininterval=0.2)
            if self.total != self._tqdm.total:
                self._tqdm.total = self.total
            self._tqdm.set_postfix_str(self._extra(), refresh=False)
            self._tqdm.update(max(0, (self.done or 0) - self._tqdm.n))
            return
        tenth = 10 * (self.done or 0) // self.total if self.total else -1
        if tenth > self._tenth:
            self._tenth = tenth
            self._print()

    def _print(self) -> None:
        line = self.line()
        if line != self._printed and self.stream is not None:
            print(line, file=self.stream, flush=True)
            self._printed = line

    def close(self) -> None:
        if self._tqdm is not None:
            self._tqdm.set_postfix_str(self._extra())
            self._tqdm.close()
        elif self.stream is not None and not self.interactive and self.done is not None:
            self._print()


class Reporter:
    """Where a job says how far it got. ``Reporter(False)`` (the default) is silent.

    ``interactive``: draw tqdm bars (default: when the stream is a terminal and tqdm is
    installed); otherwise bars are plain lines, none repeated."""

    def __init__(self, enabled: bool = False, stream: TextIO | None = None,
                 interactive: bool | None = None) -> None:
        self.enabled = enabled
        self.stream = stream if stream is not None else sys.stderr
        if interactive is None:
            interactive = bool(getattr(self.stream, "isatty", lambda: False)()) and \
                importlib.util.find_spec("tqdm") is not None
        self.interactive = interactive

    def note(self, message: str) -> None:
        if self.enabled:
            print(message, file=self.stream, flush=True)

    @contextmanager
    def bar(self, description: str, total: int, unit: str = "it") -> Iterator[Bar]:
        """A :class:`Bar` (drawing nothing when disabled), closed at the end."""
        bar = Bar(description, total, unit, self.stream if self.enabled else None,
                  self.interactive)
        try:
            yield bar
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

__all__ = ["SILENT", "Bar", "Reporter", "libraries_silenced"]
