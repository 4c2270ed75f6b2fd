"""A DFlash draft model (MODEL_SPEC.md §6) loaded next to its target, for tests and tools.

    draft = DFlashDraft("/path/to/draft", llm)          # llm: an LLM or a NativeModel (the target)
    draft.propose_logits(token_ids)                     # [block_size - 1, vocab]: the prompt's last block
    draft.block_logits(token_ids, context_ends=[7, 40]) # blocks drafted with the context given in pieces
    draft.target_features(token_ids)                    # [n, len(target_layer_ids) * hidden]

The draft runs in the native library on the target's device (pe_draft_* in pyengine.h): the target
computes the features of the layers target_layer_ids, the draft appends their context vectors to
its own paged KV cache and drafts a block [last token, MASK x (block_size - 1)] in one forward
with the target's embedding and lm_head. The engine's speculative loop drives the same forward.
"""

from __future__ import annotations

import os

import numpy as np

from ._native import native
from .checkpoint import CheckpointReader
from .dflash_config import DraftConfig, read_draft_config
from .engine import kv_dtype_code
from .errors import CheckpointError
from .model_loader import weight_quant_code


class DFlashDraft:
    """Owns a pe_draft handle; the target must outlive it."""

    def __init__(self, path: str | os.PathLike, target, draft_quant: str | None = None):
        """target: the LLM (or its NativeModel) whose features, embedding and lm_head the draft
        uses. draft_quant: none, int8, fp8 or nvfp4 (on-load quantization of the draft's matrices)."""
        n = native()
        self._n = n
        self.path = os.path.abspath(os.fspath(path))
        self._target = getattr(target, "_model", target)  # keeps the target alive as long as the draft
        tokenizer = getattr(target, "tokenizer", None)
        lookup = tokenizer.token_to_id if tokenizer is not None else None
        self.config: DraftConfig = read_draft_config(self.path, self._target.config.num_hidden_layers, lookup)
        c = self.config
        self._layer_ids = n.ffi.new("int32_t[]", list(c.target_layer_ids))
        cfg = n.ffi.new("pe_draft_config*")
        for field in ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
                      "intermediate_size", "vocab_size", "rms_norm_eps", "rope_theta", "block_size",
                      "mask_token_id"):  # fmt: skip
            setattr(cfg, field, getattr(c, field))
        cfg.n_target_layers = len(c.target_layer_ids)
        cfg.target_layer_ids = self._layer_ids
        out = n.ffi.new("pe_draft**")
        config_path = os.path.join(self.path, "config.json")
        try:
            n.check(n.lib.pe_draft_create(self._target.handle, cfg, out), "draft")
        except ValueError as e:
            raise CheckpointError(f"{config_path}: {e}") from None
        self.handle = n.ffi.gc(out[0], n.lib.pe_draft_free)
        quant = weight_quant_code(draft_quant)
        if quant is not None:
            n.check(n.lib.pe_draft_set_weight_quant(self.handle, quant), "draft_quant")
        self._load()

    def _load(self) -> None:
        n = self._n
        with CheckpointReader(self.path) as reader:
            for t in reader:
                shape = n.ffi.new("int64_t[]", list(t.shape))
                status = n.lib.pe_draft_set_tensor(self.handle, t.name.encode(), t.dtype, len(t.shape), shape,
                                                   n.ffi.from_buffer(t.data))  # fmt: skip
                if status != 0:
                    raise CheckpointError(f"{os.path.join(self.path, t.file_name)}: {n.last_error()}")
        if n.lib.pe_draft_finalize(self.handle) != 0:
            raise CheckpointError(f"{self.path}: {n.last_error()}")

    @property
    def block_size(self) -> int:
        return self.config.block_size

    def _handle(self):
        if self.handle is None:
            raise RuntimeError("the draft is closed")
        return self.handle

    def weight_bytes(self) -> int:
        out = self._n.ffi.new("int64_t*")
        self._n.check(self._n.lib.pe_draft_weight_bytes(self._handle(), out), "weight_bytes")
        return int(out[0])

    def target_features(self, token_ids) -> np.ndarray:
        """The target's outputs of the layers target_layer_ids (before the final norm) at every
        position of token_ids: float32 [n, len(target_layer_ids) * hidden]."""
        n = self._n
        ids = _ids(token_ids, 1)
        k = len(self.config.target_layer_ids)
        out = np.empty((ids.size, k * self.config.hidden_size), dtype=np.float32)
        n.check(n.lib.pe_model_layer_features(self._target.handle, _ptr(n, "int32_t*", ids), ids.size,
                                              self._layer_ids, k, _ptr(n, "float*", out)), "target_features")  # fmt: skip
        return out

    def block_logits(self, token_ids, context_ends=None, features=None, kv_cache_dtype: str = "fp32") -> np.ndarray:
        """Blocks drafted over token_ids as one sequence whose context arrives in pieces: block b
        appends the context of positions context_ends[b-1] .. context_ends[b] - 1 to the draft's
        cache, then drafts at position context_ends[b] from token_ids[context_ends[b]].
        context_ends defaults to [len(token_ids) - 1] (one block after the whole prompt).
        features: [context_ends[-1], k * hidden] float32 (the target's, from target_features or
        elsewhere); None: the target computes them. -> float32 [n_blocks, block_size - 1, vocab]."""
        n = self._n
        ids = _ids(token_ids, 1)
        ends = np.ascontiguousarray([ids.size - 1] if context_ends is None else context_ends, dtype=np.int64)
        if ends.ndim != 1 or ends.size < 1:
            raise ValueError("context_ends must be a non-empty list of positions")
        feat_ptr = n.ffi.NULL
        if features is not None:
            features = np.ascontiguousarray(features, dtype=np.float32)
            want = (int(ends[-1]), len(self.config.target_layer_ids) * self.config.hidden_size)
            if features.shape != want:
                raise ValueError(f"features must have shape {want}, got {features.shape}")
            feat_ptr = _ptr(n, "float*", features)
        out = np.empty((ends.size, self.block_size - 1, self.config.vocab_size), dtype=np.float32)
        kv = kv_dtype_code(kv_cache_dtype, self._target.device)
        n.check(n.lib.pe_draft_block_logits(self._handle(), _ptr(n, "int32_t*", ids), ids.size, feat_ptr,
                                            _ptr(n, "int64_t*", ends), ends.size, kv, _ptr(n, "float*", out)),
                "block_logits")  # fmt: skip
        return out

    def propose_logits(self, token_ids) -> np.ndarray:
        """The block after a prompt, as the reference drafts it (dflash_reference.draft_block): the
        context is every position but the last, the block starts with the last token.
        -> float32 [block_size - 1, vocab]; row j proposes the token at len(token_ids) + j."""
        return self.block_logits(token_ids)[0]

    def propose(self, token_ids) -> list[int]:
        """The greedy proposals of propose_logits."""
        return [int(t) for t in self.propose_logits(token_ids).argmax(-1)]

    def close(self) -> None:
        handle, self.handle = getattr(self, "handle", None), None
        if handle is not None:
            self._n.ffi.release(handle)


def _ids(token_ids, min_len: int) -> np.ndarray:
    ids = np.ascontiguousarray(token_ids, dtype=np.int32)
    if ids.ndim != 1 or ids.size < min_len:
        raise ValueError(f"token_ids must be a list of at least {min_len} int(s)")
    return ids


def _ptr(n, kind: str, array: np.ndarray):
    return n.ffi.cast(kind, n.ffi.from_buffer(array))
