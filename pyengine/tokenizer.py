"""Tokenization with the `tokenizers` library and incremental (streaming) detokenization.

The checkpoint's tokenizer.json does the work; tokenizer_config.json only adds which tokens
are special (eos, bos, pad, added_tokens_decoder) and the chat template (chat_template.py).

Long texts are a server's risk: `encode_within` refuses a text over a token limit after work
bounded by the limit, not by the text (a character bound first, then a count on pieces), and
long texts are tokenized with the GIL released, one at a time, so other requests keep streaming.
Long texts go by segments between added tokens, whose ids are kept (token_segments.py): a chat's
next prompt tokenizes only its new messages.
"""

from __future__ import annotations

import json
import os
import re
import threading
from collections.abc import Iterable, Sequence

import tokenizers

from .errors import CheckpointError, PromptTooLongError
from .token_segments import SegmentCache

TOKENIZER_FILE_NAME = "tokenizer.json"
TOKENIZER_CONFIG_FILE_NAME = "tokenizer_config.json"


def read_tokenizer_config(model_dir: str | os.PathLike) -> dict:
    """tokenizer_config.json as a dict ({} when the file does not exist)."""
    path = os.path.join(os.fspath(model_dir), TOKENIZER_CONFIG_FILE_NAME)
    if not os.path.exists(path):
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path}: cannot read JSON: {e}") from None
    if not isinstance(config, dict):
        raise CheckpointError(f"{path}: expected a JSON object")
    return config


def special_token_text(value: object) -> str | None:
    """A special token as written in tokenizer_config.json: a string or a serialized AddedToken."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


# Texts up to this many characters are tokenized in one call that holds the GIL (a few ms).
LONG_TEXT_CHARS = 16384
# Longer ones go through encode_batch, which releases the GIL, one at a time: on a small machine
# concurrent tokenizations would take the cores from the engine thread.
_long_encodes = threading.BoundedSemaphore(1)
# Texts over this many characters are tokenized by segments (token_segments.py); below it one
# call costs about as much as splitting.
SEGMENT_TEXT_CHARS = 4096
# A text with more characters per allowed token than this is counted in pieces before it is
# tokenized whole (prose has ~4 characters per token; CJK ~1).
_PROBE_CHARS_PER_TOKEN = 4
_SURROGATE = re.compile("[\ud800-\udfff]")

# How far a normalizer can shrink a text (canonical composition merges up to 4 code points into
# one); normalizers not listed can delete characters, which voids the character bound.
_NORMALIZER_SHRINK = {"NFC": 4, "NFKC": 4, "NFD": 1, "NFKD": 1, "Lowercase": 1, "Prepend": 1}
# Pre-tokenizers that keep every character (Split and Punctuation unless their behavior removes).
_KEEPING_PRE_TOKENIZERS = {"ByteLevel", "Metaspace", "Digits", "Split", "Punctuation",
                           "UnicodeScripts"}


def check_text(text: object) -> str:
    """The text itself, or ValueError for a non-string or one with a lone UTF-16 surrogate
    (JSON can carry "\\ud800"; it is no Unicode character and no tokenizer takes it)."""
    if not isinstance(text, str):
        raise ValueError(f"text must be a string, got {type(text).__name__}")
    if not text.isascii():
        bad = _SURROGATE.search(text)
        if bad is not None:
            raise ValueError(f"the text has a lone surrogate U+{ord(bad.group()):04X} at "
                             f"character {bad.start()}, which is not valid Unicode")
    return text


def _shrink_factor(node: dict | None, kind: str) -> int | None:
    """For tokenizer.json's normalizer / pre_tokenizer tree: how many characters may become
    one (1: none merge), or None when characters may be dropped."""
    if node is None:
        return 1
    name = node.get("type")
    if name == "Sequence":
        factor = 1
        for child in node.get("normalizers" if kind == "normalizer" else "pretokenizers", []):
            f = _shrink_factor(child, kind)
            if f is None:
                return None
            factor *= f
        return factor
    if kind == "normalizer":
        return _NORMALIZER_SHRINK.get(name)
    if name in _KEEPING_PRE_TOKENIZERS and node.get("behavior") != "Removed":
        return 1
    return None


class Tokenizer:
    def __init__(self, model_dir: str | os.PathLike, extra_eos_token_ids: Iterable[int] = ()):
        """Loads model_dir/tokenizer.json; extra_eos_token_ids (e.g. ModelConfig.eos_token_ids)
        are added to the eos token named in tokenizer_config.json."""
        model_dir = os.fspath(model_dir)
        path = os.path.join(model_dir, TOKENIZER_FILE_NAME)
        if not os.path.exists(path):
            raise CheckpointError(f"{path}: file not found")
        try:
            self._tokenizer = tokenizers.Tokenizer.from_file(path)
        except Exception as e:  # the library raises a bare Exception for malformed files
            raise CheckpointError(f"{path}: cannot load tokenizer: {e}") from None
        self.config = read_tokenizer_config(model_dir)
        self.eos_token = special_token_text(self.config.get("eos_token"))
        self.bos_token = special_token_text(self.config.get("bos_token"))
        self.pad_token = special_token_text(self.config.get("pad_token"))
        self.special_tokens = self._special_tokens(path)
        self.special_token_ids = frozenset(self.special_tokens.values())
        eos_ids = [] if self.eos_token is None else [self._required_id(self.eos_token, "eos_token")]
        for token_id in extra_eos_token_ids:
            if token_id not in eos_ids:
                eos_ids.append(token_id)
        self.eos_token_ids: tuple[int, ...] = tuple(eos_ids)
        self.bos_token_id = (
            None if self.bos_token is None else self._required_id(self.bos_token, "bos_token")
        )
        self.max_token_chars = self._max_token_chars()
        self.pad_token_id = (
            None if self.pad_token is None else self._required_id(self.pad_token, "pad_token")
        )
        self.segments = SegmentCache.for_tokenizer(self._tokenizer)  # None: not splittable

    def _special_tokens(self, path: str) -> dict[str, int]:
        """Special token text -> id: tokenizer.json's special added tokens, then
        tokenizer_config.json's added_tokens_decoder entries marked special."""
        special = {
            token.content: token_id
            for token_id, token in self._tokenizer.get_added_tokens_decoder().items()
            if token.special
        }
        decoder = self.config.get("added_tokens_decoder") or {}
        for token_id, token in decoder.items():
            if (
                isinstance(token, dict)
                and token.get("special")
                and isinstance(token.get("content"), str)
            ):
                try:
                    special.setdefault(token["content"], int(token_id))
                except ValueError:
                    raise CheckpointError(
                        f"{path}: added_tokens_decoder key {token_id!r} is not an id"
                    ) from None
        return special

    def _max_token_chars(self) -> int | None:
        """An upper bound on the characters of text one token stands for, or None when the
        tokenizer can drop characters. A vocabulary entry's length bounds what its token
        covers: byte-level entries have one character per byte, Metaspace ones one per
        character, byte-fallback ones (<0x41>) more than their byte."""
        spec = json.loads(self._tokenizer.to_str())
        factor = 1
        for kind in ("normalizer", "pre_tokenizer"):
            f = _shrink_factor(spec.get(kind), kind)
            if f is None:
                return None
            factor *= f
        longest = max(map(len, self._tokenizer.get_vocab(with_added_tokens=True)), default=1)
        return max(longest, 1) * factor

    def _required_id(self, token: str, field: str) -> int:
        token_id = self._tokenizer.token_to_id(token)
        if token_id is None:
            raise CheckpointError(
                f"{TOKENIZER_CONFIG_FILE_NAME}: {field} {token!r} is not in the vocabulary"
            )
        return token_id

    @property
    def vocab_size(self) -> int:
        """Ids in the vocabulary, added tokens included (like len() of a transformers tokenizer)."""
        return self._tokenizer.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        # Chat templates already contain their special tokens, hence the default False.
        check_text(text)
        if self.segments is not None and not add_special_tokens and len(text) > SEGMENT_TEXT_CHARS:
            return self.segments.encode(text, self._encode_piece)
        return self._encode_piece(text, add_special_tokens)

    def _encode_piece(self, text: str, add_special_tokens: bool = False) -> list[int]:
        if len(text) <= LONG_TEXT_CHARS:
            return self._tokenizer.encode(text, add_special_tokens=add_special_tokens).ids
        with _long_encodes:
            return self._encode_nogil(text, add_special_tokens)

    def _encode_nogil(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return self._tokenizer.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids

    def encode_within(
        self, text: str, max_tokens: int, add_special_tokens: bool = False
    ) -> list[int]:
        """encode(text), or PromptTooLongError when it has more than max_tokens tokens. A text
        far over the limit is refused after work bounded by max_tokens: by its character count
        when no max_tokens tokens can cover it, else by counting tokens of successive pieces
        until the count passes max_tokens with a margin (a piece boundary moves the count by a
        few tokens; the margin is 50 % + 1024). Below the margin the whole text is tokenized."""
        check_text(text)
        n_chars = len(text)
        bound = self.max_token_chars
        if bound is not None and n_chars > max_tokens * bound:
            raise PromptTooLongError(
                f"the text has {n_chars} characters, more than the limit of {max_tokens} tokens "
                f"can cover (a token of this tokenizer covers at most {bound} characters)",
                max_tokens)
        if n_chars > LONG_TEXT_CHARS and n_chars > _PROBE_CHARS_PER_TOKEN * max_tokens:
            self._refuse_if_far_over(text, max_tokens)
        ids = self.encode(text, add_special_tokens)
        if len(ids) > max_tokens:
            raise PromptTooLongError(f"the text has {len(ids)} tokens, more than the limit of "
                                     f"{max_tokens}", max_tokens, len(ids))
        return ids

    def _refuse_if_far_over(self, text: str, max_tokens: int) -> None:
        margin = max_tokens // 2 + 1024
        piece = max(LONG_TEXT_CHARS, 2 * max_tokens)
        counted = 0
        with _long_encodes:
            for start in range(0, len(text), piece):
                counted += len(self._encode_nogil(text[start:start + piece]))
                if counted > max_tokens + margin:
                    raise PromptTooLongError(
                        f"the text has about {counted} tokens or more (counted in its first "
                        f"{min(start + piece, len(text))} of {len(text)} characters), more than "
                        f"the limit of {max_tokens}", max_tokens)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self._tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        return self._tokenizer.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        return self._tokenizer.id_to_token(token_id)

    def is_special(self, token_id: int) -> bool:
        return token_id in self.special_token_ids

    def detokenizer(
        self, skip_special_tokens: bool = True, prompt_ids: Sequence[int] = ()
    ) -> IncrementalDetokenizer:
        return IncrementalDetokenizer(self, skip_special_tokens, prompt_ids)


# How many prompt tokens the first decode window reaches back: enough context for decoders
# whose output depends on the previous token (e.g. SentencePiece's leading-space rule).
_PROMPT_CONTEXT_TOKENS = 5


class IncrementalDetokenizer:
    """Turns a stream of token ids into a stream of text deltas.

    Decoding token by token would break characters whose UTF-8 bytes span several byte-level
    BPE tokens (emoji, CJK), and would lose spacing that depends on the previous token. So, as
    in vLLM and TGI, it decodes the window ids[prefix_offset:] and compares it with the already
    emitted ids[prefix_offset:read_offset]; the difference is emitted only when it does not end
    in U+FFFD, the replacement char an incomplete UTF-8 sequence decodes to. The concatenated
    deltas plus flush() equal decode(all ids).
    """

    def __init__(
        self, tokenizer: Tokenizer, skip_special_tokens: bool = True, prompt_ids: Sequence[int] = ()
    ):
        self._tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.ids: list[int] = list(prompt_ids)[-_PROMPT_CONTEXT_TOKENS:]
        self._prefix_offset = 0  # start of the decode window
        self._read_offset = len(self.ids)  # ids before it are already emitted

    def add(self, token_ids: int | Iterable[int]) -> str:
        """Appends one or several ids and returns the text that became stable ("" if none)."""
        if isinstance(token_ids, int):
            self.ids.append(token_ids)
        else:
            self.ids.extend(token_ids)
        prefix_text = self._decode(self._prefix_offset, self._read_offset)
        new_text = self._decode(self._prefix_offset, len(self.ids))
        if len(new_text) <= len(prefix_text) or new_text.endswith("\ufffd"):
            # Nothing new (a skipped special token) or a character still incomplete.
            return ""
        self._prefix_offset = self._read_offset
        self._read_offset = len(self.ids)
        return new_text[len(prefix_text) :]

    def flush(self) -> str:
        """At the end of the stream: whatever was held back, U+FFFD included (a model can emit
        bytes that never form a character)."""
        prefix_text = self._decode(self._prefix_offset, self._read_offset)
        new_text = self._decode(self._prefix_offset, len(self.ids))
        self._prefix_offset = self._read_offset = len(self.ids)
        return new_text[len(prefix_text) :]

    def _decode(self, start: int, end: int) -> str:
        return self._tokenizer.decode(
            self.ids[start:end], skip_special_tokens=self.skip_special_tokens
        )
