"""Progress for long jobs: tqdm bars and short notes on stderr, or nothing at all."""

from __future__ import annotations

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


SILENT = Reporter(False)

__all__ = ["SILENT", "Reporter"]
