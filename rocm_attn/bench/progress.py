"""Progress of a benchmark sweep on stderr (stdout stays the report).

tqdm draws the bar when it is importable; otherwise a plain line is written: redrawn in place
on a terminal, one line per step when stderr goes to a log file (carriage returns would make
the log unreadable).
"""

from __future__ import annotations

import sys
import time
from typing import Iterable, Iterator, Sequence, TypeVar

T = TypeVar("T")


def progress(items: Sequence[T], desc: str, enabled: bool = True) -> Iterator[T]:
    """Yield ``items``, reporting ``desc [i/n] item  elapsed`` before each one."""
    if not enabled:
        yield from items
        return
    try:
        from tqdm import tqdm
    except ImportError:
        yield from _plain(items, desc)
        return
    bar = tqdm(items, desc=desc, file=sys.stderr, unit="case", dynamic_ncols=True)
    for item in bar:
        bar.set_postfix_str(str(item))
        yield item


def _plain(items: Sequence[T], desc: str) -> Iterable[T]:
    n, start = len(items), time.monotonic()
    tty = sys.stderr.isatty()
    for i, item in enumerate(items):
        line = f"{desc} [{i + 1}/{n}] {item}  {time.monotonic() - start:.0f} s"
        sys.stderr.write(f"\r\x1b[K{line}" if tty else f"{line}\n")
        sys.stderr.flush()
        yield item
    done = f"{desc} [{n}/{n}] done in {time.monotonic() - start:.0f} s"
    sys.stderr.write(f"\r\x1b[K{done}\n" if tty else f"{done}\n")
    sys.stderr.flush()
