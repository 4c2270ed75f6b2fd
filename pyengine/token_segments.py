"""Tokenization of long texts by segments, each segment's ids kept for the next text.

`tokenizers` first cuts a text at its added tokens (<|im_start|>, <tool_response>, ...: the
leftmost, longest match), then normalizes, pre-tokenizes and models each piece between them on
its own; so the ids of a text are its pieces' ids and the added tokens' ids, in order. An
agent's prompt is the previous prompt plus a few messages: with the pieces' ids kept (least
recently used first out, by characters), each turn tokenizes only its new pieces instead of the
whole conversation.

This is exact only when added tokens match as plain strings, i.e. none strips the whitespace
beside it (lstrip, rstrip), matches whole words only (single_word), or is matched after a
normalizer (normalized, with a normalizer present), and special tokens are split out
(encode_special_tokens off); `SegmentCache.for_tokenizer` returns None for any other tokenizer.
Texts encoded with add_special_tokens=True (a post-processor adds tokens) do not come here.
"""

from __future__ import annotations

import re
import threading
from array import array
from collections import OrderedDict
from collections.abc import Callable

import tokenizers

# Characters of pieces kept (about 4 bytes of ids and 1-4 of text per character): a few agent
# sessions of 100K tokens.
DEFAULT_MAX_CHARS = 2_000_000


class SegmentCache:
    def __init__(self, added_tokens: dict[str, int], max_chars: int = DEFAULT_MAX_CHARS):
        """added_tokens: the text -> id of every added token (all matched as plain strings)."""
        self._added = dict(added_tokens)
        # Longest first: Python's alternation takes the first alternative that matches at the
        # leftmost position, so this is the leftmost-longest match of tokenizers.
        alternatives = sorted(self._added, key=len, reverse=True)
        self._split = re.compile("(" + "|".join(map(re.escape, alternatives)) + ")") if alternatives else None
        self._pieces: OrderedDict[str, array] = OrderedDict()
        self._chars = 0
        self.max_chars = max_chars
        self._lock = threading.Lock()  # HTTP threads tokenize concurrently
        self.pieces_encoded = 0  # counters for tests and stats
        self.pieces_reused = 0

    @classmethod
    def for_tokenizer(cls, tokenizer: tokenizers.Tokenizer, max_chars: int = DEFAULT_MAX_CHARS) -> SegmentCache | None:
        """A cache for this tokenizer, or None when its added tokens do not split texts into
        independent pieces (see the module's docstring)."""
        if getattr(tokenizer, "encode_special_tokens", False):
            return None
        added = {}
        for token_id, token in tokenizer.get_added_tokens_decoder().items():
            if token.lstrip or token.rstrip or token.single_word or not token.content:
                return None
            if token.normalized and tokenizer.normalizer is not None:
                return None
            added[token.content] = token_id
        return cls(added, max_chars)

    def encode(self, text: str, encode_piece: Callable[[str], list[int]]) -> list[int]:
        """The ids of text; encode_piece(piece) tokenizes a piece free of added tokens (called
        without the cache's lock, for the pieces not kept)."""
        parts = self._split.split(text) if self._split is not None else [text]
        # re.split with one group: pieces at even indices, the added tokens at odd ones.
        with self._lock:
            kept = [self._get(p) if i % 2 == 0 and p else None for i, p in enumerate(parts)]
        ids: list[int] = []
        new: dict[str, array] = {}
        for i, part in enumerate(parts):
            if i % 2:
                ids.append(self._added[part])
            elif part:
                piece_ids = kept[i] if kept[i] is not None else new.get(part)
                if piece_ids is None:
                    piece_ids = new[part] = array("i", encode_piece(part))
                ids.extend(piece_ids)
        with self._lock:
            self.pieces_encoded += len(new)
            self.pieces_reused += sum(k is not None for k in kept)
            for part, piece_ids in new.items():
                self._put(part, piece_ids)
        return ids

    def _get(self, piece: str) -> array | None:
        piece_ids = self._pieces.get(piece)
        if piece_ids is not None:
            self._pieces.move_to_end(piece)
        return piece_ids

    def _put(self, piece: str, piece_ids: array) -> None:
        if len(piece) > self.max_chars or piece in self._pieces:
            return
        self._pieces[piece] = piece_ids
        self._chars += len(piece)
        while self._chars > self.max_chars:
            old, _ = self._pieces.popitem(last=False)
            self._chars -= len(old)
