"""The native engine handle and the dispatcher thread that routes its events to streams."""

from __future__ import annotations

import os
import queue
import threading
from dataclasses import dataclass

from ._native import native
from .model_loader import NativeModel
from .sampling_params import SamplingParams

_POLL_BATCH = 256
_POLL_TIMEOUT_MS = 50

FINISH_REASONS = {0: None, 1: "stop", 2: "length", 3: "cancelled", 4: "error"}


@dataclass
class EngineArgs:
    max_batch: int = 8
    max_model_len: int = 8192
    chunked_prefill_size: int = 512
    max_num_batched_tokens: int = 0
    cooperative_prefill: bool = True
    prefix_cache: bool = True
    kv_page_size: int = 16
    snapshot_interval_pages: int = 16
    kv_cache_bytes: int | None = None
    gpu_mem_ratio: float = 0.9
    num_threads: int = 0
    kv_cache_dtype: str = "auto"  # auto (fp32 on the CPU, fp16 on CUDA), fp32, fp16, bf16, fp8_e4m3, int8, fp4
    weight_quant: str | None = None  # on-load quantization of 16-bit weights: int8, fp8, nvfp4
    load_format: str = "auto"  # auto (the checkpoint's safetensors) or dummy (random weights, benchmarks)
    # FP8 layer matrices keep a row-major copy for the sm_90 prefill GEMM (None: auto, pyengine.h)
    prefill_weight_copy: bool | None = None
    cuda_graphs: bool = False  # CUDA: replay decode steps from captured graphs
    # Queue the next decode step before the current one's tokens are read (None: on for CUDA, off
    # at tensor_parallel_size > 1).
    overlap_schedule: bool | None = None
    # Time limit of a step that gives some request a token; its other prefill is cut to fit (the
    # step-cost model's prediction). 0: derived per step (its decode rows plus the least prefill
    # that keeps a long prefill at 80 % of its full-chunk rate); < 0: off.
    max_step_ms: float = 0.0
    tensor_parallel_size: int = 1  # ranks (processes, one GPU each on CUDA) the model is split over
    # Speculative decoding: none, mtp (the checkpoint's MTP head drafts) or dflash (a DFlash draft
    # model at speculative_draft_model_path; its weights quantized on load as draft_quant).
    speculative_algorithm: str = "none"
    speculative_draft_model_path: str | None = None
    # The most drafts per verify step (1 .. 8); None: 3 for mtp, the draft's block_size - 1 (at most
    # 8) for dflash.
    speculative_num_draft_tokens: int | None = None
    draft_quant: str | None = None  # none, fp8, int8, nvfp4


SPECULATIVE_ALGORITHMS = {"none": 0, "mtp": 1, "dflash": 2}  # PE_SPEC_*
DRAFT_QUANTS = ("none", "fp8", "int8", "nvfp4")


SPECULATION_FILE = "speculative.json"  # a model directory's own proposer for speculative_algorithm auto


def resolve_auto_speculation(model_path: str, engine_args: dict) -> None:
    """speculative_algorithm "auto" (the CLI's default) -> the proposer the model directory names in
    speculative.json ({"speculative_algorithm": "mtp"}, or "dflash" with a
    "speculative_draft_model_path" relative to the directory; the embedded model ships one), "none"
    without one. A DFlash draft runs at tensor_parallel_size 1 only: above it the file's
    "tensor_parallel_fallback" ("mtp" or "none", default "none") is taken. In place."""
    if engine_args.get("speculative_algorithm") != "auto":
        return
    from .config import read_json_object
    from .tp import group_of_one

    engine_args["speculative_algorithm"] = "none"
    path = os.path.join(model_path, SPECULATION_FILE)
    if not os.path.exists(path):
        return
    spec = read_json_object(path)
    algo = spec.get("speculative_algorithm")
    if algo not in ("mtp", "dflash"):
        raise ValueError(f"{path}: speculative_algorithm must be mtp or dflash, got {algo!r}")
    fallback = spec.get("tensor_parallel_fallback", "none")
    if fallback not in ("mtp", "none"):
        raise ValueError(f"{path}: tensor_parallel_fallback must be mtp or none, got {fallback!r}")
    if algo == "dflash" and (engine_args.get("tensor_parallel_size", 1) != 1 or group_of_one()):
        engine_args["speculative_algorithm"] = fallback
        return
    engine_args["speculative_algorithm"] = algo
    if algo == "dflash" and not engine_args.get("speculative_draft_model_path"):
        draft = spec.get("speculative_draft_model_path")
        if not isinstance(draft, str) or not draft:
            raise ValueError(f"{path}: speculative_algorithm dflash needs speculative_draft_model_path (a directory)")
        engine_args["speculative_draft_model_path"] = os.path.join(model_path, draft)


def check_speculative(args: EngineArgs) -> None:
    """ValueError naming the speculative option that is wrong."""
    if args.speculative_algorithm not in SPECULATIVE_ALGORITHMS:
        raise ValueError(f"speculative_algorithm must be one of {', '.join(SPECULATIVE_ALGORITHMS)}; "
                         f"got {args.speculative_algorithm!r}")  # fmt: skip
    k = args.speculative_num_draft_tokens
    if k is not None and (not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= 8):
        raise ValueError(f"speculative_num_draft_tokens must be an int in [1, 8] or None, got {k!r}")
    if args.draft_quant is not None and args.draft_quant not in DRAFT_QUANTS:
        raise ValueError(f"draft_quant must be one of {', '.join(DRAFT_QUANTS)}; got {args.draft_quant!r}")
    if args.speculative_algorithm == "dflash" and not args.speculative_draft_model_path:
        raise ValueError("speculative_algorithm dflash needs speculative_draft_model_path (the draft's directory)")


# kv_cache_dtype names -> PE_DTYPE_* codes.
KV_CACHE_DTYPES = {"fp32": 0, "fp16": 1, "bf16": 2, "fp8_e4m3": 3, "fp8": 3, "int8": 4, "fp4": 6}


def kv_dtype_code(name: str, device: str = "cpu") -> int:
    if name == "auto":
        return KV_CACHE_DTYPES["fp16" if device == "cuda" else "fp32"]
    if name not in KV_CACHE_DTYPES:
        raise ValueError(f"kv_cache_dtype must be one of auto, {', '.join(KV_CACHE_DTYPES)}; got {name!r}")
    return KV_CACHE_DTYPES[name]


@dataclass
class RawEvent:
    """One event of pe_event, in Python types."""

    token: int | None
    logprob: float | None
    top: list[tuple[int, float]] | None
    finish_reason: str | None
    finished: bool
    step: int
    time: float
    prompt_tokens: int = 0
    cached_tokens: int = 0
    error: str | None = None
    prompt_computed: int | None = None  # a progress event: prompt tokens in place so far
    # A finished event: the request's drafts and accepted drafts per draft position (speculative).
    spec_drafted: list[int] | None = None
    spec_accepted: list[int] | None = None


@dataclass
class RequestExtras:
    """What a request asks of the dispatcher beyond its tokens: grammar masks, progress events."""

    constraint: object | None = None  # a structured_outputs.TokenConstraint
    progress: bool = False


class NativeEngine:
    """Owns a pe_engine; one dispatcher thread polls it and feeds per-request queues."""

    def __init__(self, model: NativeModel, args: EngineArgs, eos_token_ids: list[int], draft=None):
        """draft: the DFlashDraft of speculative_algorithm dflash (it must outlive the engine)."""
        n = native()
        self._n = n
        self._model = model  # the engine must not outlive its model
        self._draft = draft
        p = n.lib.pe_engine_default_params()
        for field in (
            "max_batch", "max_model_len", "chunked_prefill_size", "max_num_batched_tokens",
            "kv_page_size", "snapshot_interval_pages", "num_threads",
        ):  # fmt: skip
            setattr(p, field, int(getattr(args, field)))
        p.cooperative_prefill = int(bool(args.cooperative_prefill))
        p.prefix_cache = int(bool(args.prefix_cache))
        p.kv_cache_bytes = int(args.kv_cache_bytes or 0)
        p.gpu_mem_ratio = float(args.gpu_mem_ratio)
        p.kv_cache_dtype = kv_dtype_code(args.kv_cache_dtype, model.device)
        p.cuda_graphs = int(bool(args.cuda_graphs))
        p.overlap_schedule = -1 if args.overlap_schedule is None else int(bool(args.overlap_schedule))
        p.max_step_ms = float(args.max_step_ms)
        check_speculative(args)
        p.speculative_algorithm = SPECULATIVE_ALGORITHMS[args.speculative_algorithm]
        k = args.speculative_num_draft_tokens
        if k is None:
            k = min(8, draft.block_size - 1) if draft is not None else 3
        p.speculative_num_draft_tokens = int(k)
        if args.speculative_algorithm == "dflash":
            if draft is None:
                raise ValueError("speculative_algorithm dflash needs the draft model loaded (speculative_draft_model_path)")
            p.speculative_draft = draft.handle
        for i in range(8):
            p.eos_token_ids[i] = eos_token_ids[i] if i < len(eos_token_ids) else -1
        out = n.ffi.new("pe_engine**")
        n.check(n.lib.pe_engine_create(model.handle, n.ffi.new("pe_engine_params*", p), out), "engine")
        self.handle = out[0]
        self._queues: dict[int, queue.SimpleQueue] = {}
        self._extras: dict[int, RequestExtras] = {}  # requests with masks or progress events
        self._queues_lock = threading.Lock()
        self._closed = threading.Event()
        self._events = n.ffi.new("pe_event[]", _POLL_BATCH)
        self._count = n.ffi.new("int32_t*")
        self._thread = threading.Thread(target=self._dispatch, name="pyengine-dispatch", daemon=True)
        self._thread.start()

    def add_request(self, token_ids: list[int], sp: SamplingParams, seed: int,
                    extras: RequestExtras | None = None) -> tuple[int, queue.SimpleQueue]:  # fmt: skip
        return self.add_requests([(token_ids, sp, seed)], [extras])[0]

    def add_requests(self, items: list[tuple[list[int], SamplingParams, int]],
                     extras: list[RequestExtras | None] | None = None) -> list[tuple[int, queue.SimpleQueue]]:  # fmt: skip
        """Queues the (token_ids, params, seed) items in one push to the engine's inbox: its thread
        takes them all at one step boundary (and admits them in order, as far as max_batch and
        memory allow); if one is refused (ValueError naming its index), none is queued."""
        n = self._n
        if self._closed.is_set():
            raise RuntimeError("the engine is closed")
        if not items:
            return []
        extras = extras or [None] * len(items)
        params = n.ffi.new("pe_sampling_params[]", len(items))
        prompts = n.ffi.new("int32_t*[]", len(items))
        n_tokens = n.ffi.new("int64_t[]", [len(token_ids) for token_ids, _, _ in items])
        rids = n.ffi.new("uint64_t[]", len(items))
        keep = []  # the arrays the pointers above point into: alive until the add returns
        for i, (token_ids, sp, seed) in enumerate(items):
            keep.append(self._fill_sampling(params + i, sp, seed))
            params[i].token_mask = int(extras[i] is not None and extras[i].constraint is not None)
            keep.append(n.ffi.new("int32_t[]", token_ids))
            prompts[i] = keep[-1]
        queues = [queue.SimpleQueue() for _ in items]
        # Hold the lock across the add so the dispatcher cannot see an event before the queue.
        with self._queues_lock:
            status = n.lib.pe_engine_add_requests(self.handle, len(items), prompts, n_tokens, params, rids)
            n.check(status, "add_requests")
            for i, q in enumerate(queues):
                self._queues[rids[i]] = q
                if extras[i] is not None:
                    self._extras[rids[i]] = extras[i]
        for i, ex in enumerate(extras):  # the first token of each waits for its first mask
            if ex is not None and ex.constraint is not None:
                self._set_mask(rids[i], ex.constraint)
        return [(rids[i], q) for i, q in enumerate(queues)]

    def _set_mask(self, rid: int, constraint) -> None:
        """Hands the engine the mask of the constraint's next token; never raises (the engine
        thread waits for this call, so a failure here must still deliver a decision)."""
        n = self._n
        try:
            mask = constraint.next_mask()
        except Exception as e:  # noqa: BLE001
            constraint.error = f"{type(e).__name__}: {e}"
            mask = None
        if mask is None:
            status = n.lib.pe_engine_set_token_mask(self.handle, rid, constraint.index, n.ffi.NULL, 0)
        else:
            ptr = n.ffi.cast("uint32_t*", mask.ctypes.data)
            status = n.lib.pe_engine_set_token_mask(self.handle, rid, constraint.index, ptr, mask.size)
        if status != 0:
            n.lib.pe_engine_set_token_mask(self.handle, rid, constraint.index, n.ffi.NULL, 0)

    def _fill_sampling(self, c, sp: SamplingParams, seed: int):
        """Fills the pe_sampling_params `c` points to; returns the stop-id array it points into
        (or NULL), which the caller keeps alive until the add call returns."""
        n = self._n
        c.temperature = sp.temperature
        c.top_p = sp.top_p
        c.min_p = sp.min_p
        c.top_k = sp.top_k
        c.seed = seed
        c.presence_penalty = sp.presence_penalty
        c.frequency_penalty = sp.frequency_penalty
        c.repetition_penalty = sp.repetition_penalty
        c.max_tokens = sp.max_tokens
        c.ignore_eos = int(sp.ignore_eos)
        stop_ids = n.ffi.new("int32_t[]", list(sp.stop_token_ids)) if sp.stop_token_ids else n.ffi.NULL
        c.stop_token_ids = stop_ids
        c.n_stop_token_ids = len(sp.stop_token_ids or [])
        c.logprobs = -1 if sp.logprobs is None else sp.logprobs
        c.speculative = int(bool(sp.speculative))
        return stop_ids

    def cancel(self, request_id: int) -> None:
        if not self._closed.is_set():
            self._n.check(self._n.lib.pe_engine_cancel(self.handle, request_id), "cancel")

    def stats(self) -> dict:
        n = self._n
        s = n.ffi.new("pe_engine_stats*")
        n.check(n.lib.pe_engine_get_stats(self.handle, s), "stats")
        out = {}
        for name in dir(s):
            value = getattr(s, name)
            if isinstance(value, (int, float)):
                out[name] = value
            elif n.ffi.typeof(value).kind == "array":
                out[name] = list(value)
            else:
                out[name] = self._histogram(value)
        out.update(speculative_summary(out.pop("spec_drafted"), out.pop("spec_accepted"),
                                       out["spec_verifies"], out["spec_emitted_tokens"]))  # fmt: skip
        out["plan"] = self.plan()
        return out

    @staticmethod
    def _histogram(h) -> dict:
        """A pe_histogram: upper_bounds, counts per bucket (one more than bounds: the last is above
        the last bound; not cumulative), count, sum."""
        k = h.n_bounds
        return {"upper_bounds": list(h.upper_bounds)[:k], "counts": list(h.counts)[: k + 1],
                "count": int(h.count), "sum": float(h.sum)}  # fmt: skip

    def plan(self) -> dict:
        n = self._n
        p = n.ffi.new("pe_memory_plan*")
        n.check(n.lib.pe_engine_get_plan(self.handle, p), "plan")
        return {name: int(getattr(p, name)) for name in dir(p)}

    def _dispatch(self) -> None:
        n = self._n
        while not self._closed.is_set():
            status = n.lib.pe_engine_poll(self.handle, self._events, _POLL_BATCH, _POLL_TIMEOUT_MS, self._count)
            if status != 0:
                continue
            for i in range(self._count[0]):
                self._route(self._events[i])

    def _route(self, ev) -> None:
        n = self._n
        finished = ev.kind == 2
        with self._queues_lock:
            q = self._queues.get(ev.request_id)
            extras = self._extras.get(ev.request_id)
            if finished:
                self._queues.pop(ev.request_id, None)
                self._extras.pop(ev.request_id, None)
        if q is None:
            return
        if ev.kind == 3:  # progress: only to requests that asked
            if extras is None or not extras.progress:
                return
            raw = RawEvent(
                token=None, logprob=None, top=None, finish_reason=None, finished=False, step=ev.step,
                time=ev.time, prompt_tokens=ev.prompt_tokens, cached_tokens=ev.cached_tokens,
                prompt_computed=ev.prompt_computed,
            )  # fmt: skip
        elif finished:
            raw = RawEvent(
                token=None, logprob=None, top=None, finish_reason=FINISH_REASONS.get(ev.finish_reason, "error"),
                finished=True, step=ev.step, time=ev.time, prompt_tokens=ev.prompt_tokens,
                cached_tokens=ev.cached_tokens,
                error=n.ffi.string(ev.error_message).decode("utf-8", "replace") or None,
                spec_drafted=list(ev.spec_drafted), spec_accepted=list(ev.spec_accepted),
            )  # fmt: skip
        else:
            if extras is not None and extras.constraint is not None:
                # The next token's mask, computed while the engine runs the next forward.
                try:
                    extras.constraint.advance(ev.token)
                except Exception as e:  # noqa: BLE001 (the mask below must still be sent)
                    extras.constraint.error = f"{type(e).__name__}: {e}"
                self._set_mask(ev.request_id, extras.constraint)
            top = [(ev.top_ids[j], ev.top_logprobs[j]) for j in range(ev.n_top)]
            raw = RawEvent(
                token=ev.token, logprob=ev.logprob, top=top, finish_reason=None, finished=False,
                step=ev.step, time=ev.time,
            )  # fmt: skip
        q.put(raw)

    def close(self) -> None:
        if self._closed.is_set():
            return
        # Freeing the engine ends every request as cancelled; deliver those events first.
        n = self._n
        with self._queues_lock:
            pending = list(self._queues)
        for rid in pending:
            n.lib.pe_engine_cancel(self.handle, rid)
        self._closed.set()
        self._thread.join()
        n.lib.pe_engine_free(self.handle)
        with self._queues_lock:
            queues, self._queues = self._queues, {}
        for q in queues.values():
            q.put(RawEvent(None, None, None, "cancelled", True, -1, 0.0))
        self.handle = n.ffi.NULL


def speculative_summary(drafted: list[int], accepted: list[int], verifies: int | None = None,
                        emitted: int | None = None) -> dict:  # fmt: skip
    """Acceptance per draft position (positions that were drafted), as counts and rates, with the
    names the bench tools read (pyengine/tools/metrics.py); the mean accepted length (tokens per
    verify: accepted drafts + 1); per request the counts give the verifies (each drafts position 1)."""
    if verifies is None:
        verifies = drafted[0] if drafted else 0
        emitted = sum(accepted) + verifies
    k = max((i + 1 for i, d in enumerate(drafted) if d), default=0)
    out = {
        "spec_drafted_per_position": list(drafted[:k]),
        "spec_accepted_per_position": list(accepted[:k]),
        "spec_accept_per_position": [a / d if d else 0.0 for a, d in zip(accepted[:k], drafted[:k])],
    }
    out["spec_verifies"] = verifies
    out["spec_mean_accepted_length"] = emitted / verifies if verifies else 0.0
    return out


def default_seed() -> int:
    return int.from_bytes(os.urandom(8), "little")
