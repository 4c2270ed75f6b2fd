"""The scripting API: LLM(model).generate / chat / submit / prompt_logits / stats."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence

from .chat_template import ChatTemplate, ChatTemplateError
from .config import ModelConfig
from ._native import cuda_available
from .dflash import DFlashDraft
from .engine import (EngineArgs, NativeEngine, RequestExtras, check_speculative, default_seed, kv_dtype_code,
                     resolve_auto_speculation)
from .errors import PromptTooLongError
from .model_loader import NativeModel
from .reasoning import prompt_opens_reasoning, split_reasoning
from .sampling_params import SamplingParams
from .stream import RequestOutput, RequestStream
from .structured_outputs import GrammarCompiler, StructuredOutputsParams
from .tokenizer import Tokenizer
from .tool_calls import messages_for_template, parse_tool_calls
from .tool_grammar import forced_tool_grammar
from .tp import TpGroup, group_of_one

_DEFAULT_MAX_MODEL_LEN = 8192


def default_model_path() -> str | None:
    """The model shipped inside the package, when this build has one."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "default_model")
    return path if os.path.exists(os.path.join(path, "config.json")) else None


class LLM:
    def __init__(self, model: str | os.PathLike | None = None, device: str = "cpu", **engine_args):
        if model is None:
            model = default_model_path()
            if model is None:
                raise ValueError("no model given and this pyengine build has no embedded default model")
        self.model_path = os.path.abspath(os.fspath(model))
        if not os.path.isdir(self.model_path):
            raise ValueError(f"model path {self.model_path} is not a directory")
        if device == "auto":
            device = "cuda" if cuda_available() else "cpu"
        if device not in ("cpu", "cuda"):
            raise ValueError(f"device must be cpu, cuda or auto; got {device!r}")
        self.device = device
        self.config = ModelConfig.from_dir(self.model_path)
        self.model_name = os.path.basename(self.model_path.rstrip(os.sep))
        self.tokenizer = Tokenizer(self.model_path, self.config.eos_token_ids)
        try:
            self._template: ChatTemplate | None = ChatTemplate.from_dir(self.model_path)
        except ChatTemplateError:
            self._template = None  # a base model: chat() explains, generate() still works
        unknown = set(engine_args) - set(EngineArgs.__dataclass_fields__)
        if unknown:
            raise TypeError(f"unknown engine option(s): {', '.join(sorted(unknown))}")
        resolve_auto_speculation(self.model_path, engine_args)
        if engine_args.get("max_model_len") is None:
            engine_args["max_model_len"] = min(_DEFAULT_MAX_MODEL_LEN, self.config.max_position_embeddings)
        self.engine_args = EngineArgs(**engine_args)
        self.max_model_len = self.engine_args.max_model_len
        self._tp: TpGroup | None = None
        tp_size = self.engine_args.tensor_parallel_size
        if not isinstance(tp_size, int) or isinstance(tp_size, bool) or tp_size < 1:
            raise ValueError(f"tensor_parallel_size must be an int >= 1, got {tp_size!r}")
        args = self.engine_args
        try:
            if tp_size > 1 or group_of_one():
                self._tp = TpGroup(self.model_path, tp_size, device, args.weight_quant, args.load_format,
                                   args.num_threads, args.prefill_weight_copy)  # fmt: skip
            self._model = NativeModel(self.model_path, self.config, device, weight_quant=args.weight_quant,
                                      load_format=args.load_format, prefill_weight_copy=args.prefill_weight_copy,
                                      tp=(self._tp.data, self._tp.control) if self._tp else None)  # fmt: skip
            self._draft = None
            if args.speculative_algorithm == "dflash":
                check_speculative(args)
                self._draft = DFlashDraft(args.speculative_draft_model_path, self, args.draft_quant)
            self._engine = NativeEngine(self._model, args, list(self.tokenizer.eos_token_ids), self._draft)
            self.grammars = GrammarCompiler(
                self.model_path, self.config.vocab_size, list(self.tokenizer.eos_token_ids),
                lambda t: self.tokenizer.decode([t], skip_special_tokens=False),
            )
        except BaseException:
            self.close()
            raise

    def health_error(self) -> str | None:
        """Why the engine cannot serve (a tensor-parallel rank died), or None."""
        return self._tp.error if self._tp is not None else None

    # ---- prompts ----
    def apply_chat_template(self, messages: Sequence[dict], add_generation_prompt: bool = True,
                            tools=None, **template_kwargs) -> str:  # fmt: skip
        if self._template is None:
            raise ChatTemplateError(f"{self.model_path} has no chat template")
        return self._template.render(messages_for_template(messages), add_generation_prompt=add_generation_prompt,
                                     tools=tools, **template_kwargs)  # fmt: skip

    @property
    def chat_template_variables(self) -> frozenset[str] | None:
        """The variables chat_template_kwargs may set (None: the model has no chat template)."""
        return None if self._template is None else self._template.variables

    def check_chat_template_kwargs(self, template_kwargs: dict) -> None:
        """ChatTemplateError (a ValueError) when this model's template cannot take these kwargs."""
        if self._template is None:
            raise ChatTemplateError(f"{self.model_path} has no chat template")
        self._template.check_kwargs(template_kwargs)

    def _prompt_ids(self, prompt: str | None, prompt_token_ids: Sequence[int] | None) -> list[int]:
        if (prompt is None) == (prompt_token_ids is None):
            raise ValueError("give exactly one of prompt and prompt_token_ids")
        if prompt is not None:
            if not isinstance(prompt, str):
                raise ValueError(f"prompt must be a string, got {type(prompt).__name__}")
            return self.tokenizer.encode_within(prompt, self.max_model_len - 1)
        ids = list(prompt_token_ids)
        if not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
            raise ValueError("prompt_token_ids must be a list of ints")
        return ids

    # ---- requests ----
    def _checked_ids(self, prompt: str | None, prompt_token_ids: Sequence[int] | None) -> list[int]:
        ids = self._prompt_ids(prompt, prompt_token_ids)
        if not ids:
            raise ValueError("the prompt is empty")
        if len(ids) >= self.max_model_len:
            raise PromptTooLongError(
                f"the prompt has {len(ids)} tokens; max_model_len {self.max_model_len} leaves room "
                f"for at most {self.max_model_len - 1}", self.max_model_len - 1, len(ids)
            )
        vocab = self.config.vocab_size
        if min(ids) < 0 or max(ids) >= vocab:  # in C; the loop below only finds the culprit
            bad = next(i for i, t in enumerate(ids) if not 0 <= t < vocab)
            raise ValueError(f"prompt token {bad} has id {ids[bad]} outside the vocabulary [0, {vocab})")
        return ids

    @staticmethod
    def _engine_item(ids: list[int], sampling_params: SamplingParams | None) -> tuple[list[int], SamplingParams, int]:
        """(token ids, params, seed) as NativeEngine's adds take them."""
        sp = sampling_params or SamplingParams()
        return ids, sp, default_seed() if sp.seed is None else sp.seed

    def _stream(self, prompt: str | None, item: tuple[list[int], SamplingParams, int], added) -> RequestStream:
        (ids, sp, _), (rid, events) = item, added
        return RequestStream(self._engine, self.tokenizer, rid, events, prompt, ids, sp)

    def _extras(self, prompt: str | None, ids: list[int], sp: SamplingParams,
                return_progress: bool) -> RequestExtras | None:  # fmt: skip
        """The request's grammar masks (structured_outputs) and progress events, if any."""
        constraint = None
        if sp.structured_outputs is not None:
            matcher = self.grammars.matcher(sp.structured_outputs)
            text = prompt if prompt is not None else self.tokenizer.decode(ids[-8:], skip_special_tokens=False)
            constraint = self.grammars.constraint(matcher, prompt_opens_reasoning(text))
        if constraint is None and not return_progress:
            return None
        return RequestExtras(constraint, return_progress)

    def _add(self, prompt: str | None, ids: list[int], sampling_params: SamplingParams | None,
             return_progress: bool = False) -> RequestStream:  # fmt: skip
        item = self._engine_item(ids, sampling_params)
        extras = self._extras(prompt, ids, item[1], return_progress)
        return self._stream(prompt, item, self._engine.add_request(*item, extras))

    def submit(self, prompt: str | None = None, prompt_token_ids: Sequence[int] | None = None,
               sampling_params: SamplingParams | None = None, return_progress: bool = False) -> RequestStream:  # fmt: skip
        """One request; with return_progress its stream also yields events with prompt_progress
        while the prompt prefills (one per computed chunk)."""
        return self._add(prompt, self._checked_ids(prompt, prompt_token_ids), sampling_params, return_progress)

    def check_structured_outputs(self, params: StructuredOutputsParams) -> None:
        """Compiles the grammar once: ValueError naming what is wrong with it."""
        self.grammars.matcher(params)

    def generate(self, prompts: str | Sequence[str] | None = None,
                 sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
                 prompt_token_ids: Sequence[Sequence[int]] | None = None) -> list[RequestOutput]:  # fmt: skip
        if isinstance(prompts, str):
            prompts = [prompts]
        items = [(p, None) for p in prompts] if prompts is not None else [(None, ids) for ids in prompt_token_ids or []]
        if prompts is not None and prompt_token_ids is not None:
            raise ValueError("give prompts or prompt_token_ids, not both")
        params = sampling_params if isinstance(sampling_params, (list, tuple)) else [sampling_params] * len(items)
        if len(params) != len(items):
            raise ValueError("sampling_params must be one SamplingParams or one per prompt")
        # Every prompt is checked (and tokenized) first, then the batch is queued by one add: the
        # engine admits it at one step boundary, so which prompts share a step never depends on
        # the engine thread's timing, and a refused add queues none of the batch.
        checked = [self._checked_ids(p, ids) for p, ids in items]
        if not checked:
            return []
        batch = [self._engine_item(ids, sp) for ids, sp in zip(checked, params)]
        extras = [self._extras(p, ids, sp, False) for (p, _), (ids, sp, _) in zip(items, batch)]
        added = self._engine.add_requests(batch, extras)
        streams = [self._stream(p, item, a) for (p, _), item, a in zip(items, batch, added)]
        return [s.result() for s in streams]

    def chat(self, messages: Sequence[dict], sampling_params: SamplingParams | None = None,
             chat_template_kwargs: dict | None = None, tools=None, tool_choice="auto",
             parallel_tool_calls: bool = True) -> list[RequestOutput]:  # fmt: skip
        """With tools, the output's reasoning, content and tool_calls (OpenAI's shape) are split
        out; tool_choice "required" or {"type": "function", "function": {"name": ...}} forces
        calls by a grammar, "none" leaves the tools out of the prompt."""
        sp = sampling_params or SamplingParams()
        prompt = self.apply_chat_template(messages, True, None if tool_choice == "none" else tools,
                                          **(chat_template_kwargs or {}))  # fmt: skip
        forced = self.tool_call_grammar(tools, tool_choice, parallel_tool_calls)
        if forced is not None:
            if sp.structured_outputs is not None:
                raise ValueError("tool_choice required / a named function and structured_outputs exclude each other")
            sp = dataclasses.replace(sp, structured_outputs=StructuredOutputsParams(grammar=forced))
        out = self.submit(prompt=prompt, sampling_params=sp).result()
        if tools and tool_choice != "none":
            out.reasoning, content = split_reasoning(out.text, prompt_opens_reasoning(prompt))
            out.content, out.tool_calls = parse_tool_calls(content, tools)
            if out.tool_calls and out.finish_reason == "stop":
                out.finish_reason = "tool_calls"
        return [out]

    def tool_call_grammar(self, tools, tool_choice, parallel_tool_calls: bool = True) -> str | None:
        """The grammar tool_choice "required" / a named function imposes (None otherwise)."""
        return forced_tool_grammar(tools, tool_choice, parallel_tool_calls, self.grammars.tag)

    def prompt_logits(self, token_ids: Sequence[int], kv_cache_dtype: str = "auto"):
        """float32 numpy [n_tokens, vocab]: the logits of every position of one fresh sequence
        (its KV cache stored as kv_cache_dtype, to measure what a quantized cache costs)."""
        return self._model.prompt_logits(list(token_ids), kv_dtype_code(kv_cache_dtype, self.device))

    def mtp_logits(self, token_ids: Sequence[int]):
        """float32 numpy [n_tokens - 1, vocab]: the MTP head's draft logits; row p drafts the token
        at p + 2 from the hidden state at p and the token at p + 1 (checkpoints with mtp.*)."""
        return self._model.mtp_logits(list(token_ids))

    def stats(self) -> dict:
        return self._engine.stats()

    def close(self) -> None:
        engine = getattr(self, "_engine", None)
        if engine is not None:
            engine.close()
        draft = getattr(self, "_draft", None)
        if draft is not None:
            draft.close()  # after the engine that drafts with it, before the target it reads
        model = getattr(self, "_model", None)
        if model is not None:
            model.close()  # the engine is gone: the weights can go now, not at garbage collection
        tp = getattr(self, "_tp", None)
        if tp is not None:
            self._tp = None
            tp.close()  # after the model: freeing it stopped the workers

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass
