"""Tokenization with the `tokenizers` library and incremental (streaming) detokenization.

The checkpoint's tokenizer.json does the work; tokenizer_config.json only adds which tokens
are special (eos, bos, pad, added_tokens_decoder) and the chat template (chat_template.py).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence

import tokenizers

from .errors import CheckpointError

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
        self.pad_token_id = (
            None if self.pad_token is None else self._required_id(self.pad_token, "pad_token")
        )

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
        return self._tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

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
