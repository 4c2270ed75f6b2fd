"""Grammar-constrained generation (structured outputs) with llguidance.

A request's grammar (a JSON schema, any JSON object, a regex or a Lark grammar) becomes an
llguidance matcher; `TokenConstraint` turns it into one allowed-token bitmask per generated
token. The native engine samples such a request only once its mask for that token is set
(pe_engine_set_token_mask): pyengine's dispatcher thread computes the mask of token i + 1 as soon
as it reads token i, while the engine runs the next forward (engine/token_masks.h), so the
masks cost little wall time and requests without a grammar are untouched.

Reasoning is never constrained: when the prompt leaves the output inside a think block, the
masks start after the model's "</think>".
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass

import numpy as np

from .reasoning import THINK_END

log = logging.getLogger("pyengine")

# Compact JSON (no optional whitespace): small models otherwise tend to loop on blank space.
# A schema's own "x-guidance" options override it.
JSON_DEFAULTS = {"whitespace_flexible": False}


@dataclass
class StructuredOutputsParams:
    """Exactly one of: json (a JSON schema, dict or string), json_object (any JSON object),
    regex, grammar (Lark, llguidance's dialect). Names as in vLLM."""

    json: dict | str | None = None
    json_object: bool = False
    regex: str | None = None
    grammar: str | None = None

    def __post_init__(self) -> None:
        given = [name for name in ("json", "regex", "grammar") if getattr(self, name) is not None]
        if self.json_object:
            given.append("json_object")
        if len(given) != 1:
            raise ValueError(
                "structured_outputs needs exactly one of json, json_object, regex, grammar; "
                f"got {', '.join(given) or 'none'}"
            )
        if self.json is not None and not isinstance(self.json, (dict, str)):
            raise ValueError(f"structured_outputs.json must be a JSON schema object, got {self.json!r}")
        for name in ("regex", "grammar"):
            if getattr(self, name) is not None and not isinstance(getattr(self, name), str):
                raise ValueError(f"structured_outputs.{name} must be a string")

    def llguidance_grammar(self) -> str:
        """The grammar in llguidance's serialized form (raises ValueError for a bad schema)."""
        import llguidance

        if self.json_object:
            return llguidance.LLMatcher.grammar_from_json_schema({"type": "object"}, JSON_DEFAULTS)
        if self.json is not None:
            schema = self.json
            if isinstance(schema, str):
                try:
                    schema = json.loads(schema)
                except ValueError as e:
                    raise ValueError(f"the JSON schema is not valid JSON: {e}") from None
            if not isinstance(schema, dict):
                raise ValueError("the JSON schema must be a JSON object")
            return llguidance.LLMatcher.grammar_from_json_schema(schema, JSON_DEFAULTS)
        if self.regex is not None:
            return llguidance.LLMatcher.grammar_from_regex(self.regex)
        return llguidance.LLMatcher.grammar_from_lark(self.grammar)


class GrammarCompiler:
    """One per model: llguidance's view of the tokenizer (built on first use) and the matchers."""

    def __init__(self, model_dir: str, vocab_size: int, eos_token_ids, decode_token):
        self._model_dir = model_dir
        self.vocab_size = vocab_size
        self.n_words = (vocab_size + 31) // 32
        self.eos_token_ids = list(eos_token_ids)
        self._decode_token = decode_token  # id -> text, for spotting the end of the reasoning
        self._lltok = None

    def _tokenizer(self):
        if self._lltok is None:
            import llguidance

            import tokenizers

            with open(os.path.join(self._model_dir, "tokenizer.json"), encoding="utf-8") as f:
                text = f.read()
            # llguidance knows only the tokenizer's ids as eos (a config's eos may lie beyond them,
            # e.g. a dummy-weight shape with a small tokenizer); the masks still span vocab_size.
            n_tok = tokenizers.Tokenizer.from_str(text).get_vocab_size(with_added_tokens=True)
            eos = [t for t in self.eos_token_ids if 0 <= t < n_tok]
            try:
                self._lltok = llguidance.LLTokenizer(text, n_vocab=self.vocab_size, eos_token=eos or None)
            except TypeError:  # llguidance before 1.7 takes one eos id
                self._lltok = llguidance.LLTokenizer(text, n_vocab=self.vocab_size,
                                                     eos_token=eos[0] if eos else None)
        return self._lltok

    def tag(self, text: str) -> str:
        """`text` in a Lark grammar: the special-token form when the tokenizer has it as one
        token that llguidance treats as special (such a token never matches a string literal),
        else a string literal."""
        tok = self._tokenizer()
        ids = tok.tokenize_str(text, parse_special=True)
        if len(ids) == 1 and tok.is_special_token(ids[0]):
            return f"<[{ids[0]}]>"
        return json.dumps(text)

    def matcher(self, params: StructuredOutputsParams):
        """A fresh matcher for params; ValueError naming the problem for a bad grammar."""
        import llguidance

        grammar = params.llguidance_grammar()
        m = llguidance.LLMatcher(self._tokenizer(), grammar, log_level=0)
        if m.is_error():
            raise ValueError(_short_error(m.get_error()))
        return m

    def constraint(self, matcher, starts_in_reasoning: bool) -> TokenConstraint:
        return TokenConstraint(matcher, self, starts_in_reasoning)


def _short_error(message: str) -> str:
    # llguidance appends its parser state and the whole grammar after the first line.
    return message.split("\n<state>")[0].split("\n<grammar>")[0].strip()


class TokenConstraint:
    """The masks of one request. next_mask() is the mask of token `index` (None: unconstrained);
    advance(token) moves to the next token. Used by one thread (the dispatcher)."""

    def __init__(self, matcher, compiler: GrammarCompiler, starts_in_reasoning: bool):
        self.matcher = matcher
        self.index = 0
        self.error: str | None = None
        self._compiler = compiler
        self._in_reasoning = starts_in_reasoning
        self._tail = ""  # the reasoning's last characters, to find "</think>" across tokens
        self._mask = np.zeros(compiler.n_words, dtype=np.uint32)

    def next_mask(self) -> np.ndarray | None:
        if self._in_reasoning:
            return None
        if self.error is None and self.matcher.is_error():
            self._fail(self.matcher.get_error())
        if self.error is not None:
            return self._eos_only()
        self.matcher.unsafe_compute_mask_ptr(self._mask.ctypes.data, self._mask.nbytes)
        return self._mask

    def advance(self, token: int) -> None:
        self.index += 1
        if self._in_reasoning:
            self._tail = (self._tail + self._compiler._decode_token(token))[-4 * len(THINK_END):]
            self._in_reasoning = THINK_END not in self._tail
            return
        if self.error is None and not self.matcher.consume_token(token):
            self._fail(self.matcher.get_error() or f"token {token} is not allowed here")

    def _fail(self, message: str) -> None:
        self.error = _short_error(message)
        log.warning("grammar failed, ending the output: %s", self.error)

    def _eos_only(self) -> np.ndarray:
        self._mask[:] = 0
        for t in self._compiler.eos_token_ids:
            if 0 <= t < self._compiler.vocab_size:
                self._mask[t >> 5] |= np.uint32(1 << (t & 31))
        return self._mask
