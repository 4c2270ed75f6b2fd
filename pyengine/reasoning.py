"""Split a model's `<think>…</think>` reasoning from its answer, chunk by chunk.

Qwen3.5 chat templates end the generation prompt with "<think>\\n" when thinking is on
(the output then starts inside the reasoning), with "<think>\\n\\n</think>\\n\\n" when it is
off, and older templates let the model write "<think>" itself. `ReasoningParser` handles all
three: it is told whether the prompt left the output inside a think block, and it also accepts
an opening tag at the very start of the output.

Streaming and one-shot use give the same strings: `split_reasoning(text)` is one `feed` plus
`finish`. Tags split across chunks are held back until they can be decided.
"""

THINK_START = "<think>"
THINK_END = "</think>"


def prompt_opens_reasoning(prompt: str) -> bool:
    """True if the rendered prompt ends inside an unclosed think block."""
    tail = prompt.rstrip()
    return tail.endswith(THINK_START)


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `tag`."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0


class ReasoningParser:
    """Incremental splitter. feed() returns (reasoning_delta, content_delta).

    Leading whitespace of each part and whitespace just before "</think>" are dropped, so the
    reasoning reads "plan" rather than "\\nplan\\n\\n" and the content starts at its first word.
    """

    def __init__(self, starts_in_reasoning: bool = False):
        self.in_reasoning = starts_in_reasoning
        self.saw_reasoning = starts_in_reasoning
        self._may_open = not starts_in_reasoning  # an opening tag is accepted at the start only
        self._pending = ""  # text held back: a possible tag and/or trailing reasoning whitespace
        self._reasoning_started = False
        self._content_started = False

    def feed(self, text: str) -> tuple[str, str]:
        self._pending += text
        reasoning, content = [], []
        while self._pending:
            if self._may_open:
                stripped = self._pending.lstrip()
                if stripped.startswith(THINK_START):
                    self._pending = stripped[len(THINK_START):]
                    self._may_open = False
                    self.in_reasoning = self.saw_reasoning = True
                    continue
                if THINK_START.startswith(stripped):
                    break  # empty or a partial opening tag: wait for more text
                self._may_open = False
            if self.in_reasoning:
                end = self._pending.find(THINK_END)
                if end >= 0:
                    reasoning.append(self._emit_reasoning(self._pending[:end].rstrip()))
                    self._pending = self._pending[end + len(THINK_END):]
                    self.in_reasoning = False
                    continue
                keep = _partial_suffix(self._pending, THINK_END)
                body = self._pending[:len(self._pending) - keep]
                ready = body.rstrip()
                reasoning.append(self._emit_reasoning(ready))
                self._pending = self._pending[len(ready):]
                break
            content.append(self._emit_content(self._pending))
            self._pending = ""
        return "".join(reasoning), "".join(content)

    def finish(self) -> tuple[str, str]:
        """Flush what was held back at the end of the output."""
        pending, self._pending = self._pending, ""
        if self.in_reasoning:
            return self._emit_reasoning(pending.rstrip()), ""
        return "", self._emit_content(pending)

    def _emit_reasoning(self, text: str) -> str:
        if not self._reasoning_started:
            text = text.lstrip()
            self._reasoning_started = bool(text)
        return text

    def _emit_content(self, text: str) -> str:
        if not self._content_started:
            text = text.lstrip()
            self._content_started = bool(text)
        return text


def split_reasoning(text: str, starts_in_reasoning: bool = False) -> tuple[str | None, str]:
    """One-shot split: (reasoning or None when the model did not think, content)."""
    parser = ReasoningParser(starts_in_reasoning)
    r1, c1 = parser.feed(text)
    r2, c2 = parser.finish()
    reasoning = r1 + r2
    return (reasoning if parser.saw_reasoning else None), c1 + c2
