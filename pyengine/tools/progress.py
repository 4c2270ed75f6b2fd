"""tqdm progress bars on stderr (shown on a terminal only), or nothing where tqdm is missing."""

from __future__ import annotations

import sys
from contextlib import contextmanager


class _NoBar:
    def update(self, n: int = 1) -> None:
        pass

    def set_postfix_str(self, text: str) -> None:
        pass


@contextmanager
def progress(total: int, desc: str, unit: str = "it"):
    try:
        from tqdm import tqdm
    except ImportError:  # the `tools` extra is not installed: run without a bar
        yield _NoBar()
        return
    # disable=None: draw only when stderr is a terminal, so logs and pipes stay clean.
    with tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, disable=None, dynamic_ncols=True) as bar:
        yield bar
