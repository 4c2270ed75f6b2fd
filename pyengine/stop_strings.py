"""Stop strings over a stream of text deltas.

A stop string may be split across tokens ("<|" + "end|>") and may start anywhere in a delta,
so the matcher holds back the longest tail of the text that could still become the start of a
stop string; the client never sees text that a later delta turns into a stop. The result is
the same as checking the text one character at a time: the first stop string to complete wins.
"""

from __future__ import annotations

from collections.abc import Sequence


class StopStringMatcher:
    def __init__(self, stop: Sequence[str], include_stop_str_in_output: bool = False):
        if any(not s for s in stop):
            raise ValueError("stop strings must not be empty")
        self.stop = list(stop)
        self.include_stop_str_in_output = include_stop_str_in_output
        self._max_hold = max((len(s) for s in self.stop), default=1) - 1
        self._held = ""  # text received but not yet emitted
        self.matched: str | None = None

    def feed(self, delta: str) -> tuple[str, str | None]:
        """Returns (text safe to emit now, the stop string that matched or None).

        After a match the request is over: later calls return ("", None)."""
        if self.matched is not None:
            return "", None
        text = self._held + delta
        match = self._first_match(text)
        if match is not None:
            start, stop = match
            self.matched = stop
            self._held = ""
            end = start + len(stop) if self.include_stop_str_in_output else start
            return text[:end], stop
        hold = self._longest_partial_suffix(text)
        self._held = text[len(text) - hold :] if hold else ""
        return text[: len(text) - hold], None

    def flush(self) -> str:
        """At the end of generation without a match: the held-back text."""
        held, self._held = self._held, ""
        return held

    def _first_match(self, text: str) -> tuple[int, str] | None:
        best: tuple[int, int, str] | None = None  # (end, start, stop)
        for stop in self.stop:
            start = text.find(stop)
            if start < 0:
                continue
            # Earliest end = the first to complete when read character by character; among
            # those ending together, the one starting first (the longer) is the one seen.
            candidate = (start + len(stop), start, stop)
            if best is None or candidate[:2] < best[:2]:
                best = candidate
        return None if best is None else (best[1], best[2])

    def _longest_partial_suffix(self, text: str) -> int:
        for length in range(min(len(text), self._max_hold), 0, -1):
            tail = text[len(text) - length :]
            if any(stop.startswith(tail) for stop in self.stop):
                return length
        return 0
