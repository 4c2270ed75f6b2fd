"""Builds a native model from a checkpoint directory: config, then every tensor, then finalize.

Errors name the file and the tensor: the native side names the tensor and the problem, this
side adds the file it came from.
"""

from __future__ import annotations

import os

from ._native import native
from .checkpoint import CheckpointReader
from .config import ModelConfig
from .errors import CheckpointError


# weight_quant names -> PE_DTYPE_* codes (on-load quantization of 16-bit weights).
WEIGHT_QUANTS = {"int8": 4, "fp8": 3, "fp8_e4m3": 3, "nvfp4": 6}
LOAD_FORMATS = ("auto", "dummy")
_FP8, _BF16 = 3, 2


def weight_quant_code(name: str | None) -> int | None:
    if name is None or name == "none":
        return None
    if name not in WEIGHT_QUANTS:
        raise ValueError(f"weight_quant must be one of none, {', '.join(WEIGHT_QUANTS)}; got {name!r}")
    return WEIGHT_QUANTS[name]


class NativeModel:
    """Owns a pe_model handle."""

    def __init__(self, model_dir: str, config: ModelConfig, device: str = "cpu", weight_quant: str | None = None,
                 load_format: str = "auto", tp=None, prefill_weight_copy: bool | None = None):  # fmt: skip
        """tp: (data, control) communicators (pyengine.tp.Comm) of this rank of a tensor-parallel
        group; the checkpoint's tensors are then cut to the rank's shard as they load.
        prefill_weight_copy: FP8 layer matrices keep a row-major copy for the sm_90 prefill GEMM
        (None: where the copies take at most a quarter of the GPU's memory; pyengine.h)."""
        n = native()
        self._n = n
        self.config = config
        self.device = device
        if load_format not in LOAD_FORMATS:
            raise ValueError(f"load_format must be one of {', '.join(LOAD_FORMATS)}; got {load_format!r}")
        quant = weight_quant_code(weight_quant)
        if prefill_weight_copy is not None and not isinstance(prefill_weight_copy, bool):
            raise ValueError(f"prefill_weight_copy must be True, False or None (auto); got {prefill_weight_copy!r}")
        self._layer_types = n.ffi.new("int32_t[]", config.layer_type_codes)
        c = n.ffi.new("pe_model_config*")
        for field in (
            "vocab_size", "hidden_size", "num_hidden_layers", "intermediate_size",
            "num_attention_heads", "num_key_value_heads", "head_dim", "linear_num_key_heads",
            "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim",
            "linear_conv_kernel_dim", "rms_norm_eps", "rope_theta", "partial_rotary_factor",
            "mtp_num_hidden_layers", "max_position_embeddings",
        ):  # fmt: skip
            setattr(c, field, getattr(config, field))
        c.tie_word_embeddings = int(config.tie_word_embeddings)
        c.layer_types = self._layer_types
        out = n.ffi.new("pe_model**")
        try:
            n.check(n.lib.pe_model_create(c, device.encode(), out), "model")
        except ValueError as e:
            raise CheckpointError(f"{os.path.join(model_dir, 'config.json')}: {e}") from None
        self.handle = n.ffi.gc(out[0], n.lib.pe_model_free)
        self._tp = tp  # the communicators must outlive the model
        if tp is not None:
            data, control = tp
            try:
                n.check(n.lib.pe_model_set_tp(self.handle, data.handle, control.handle), "tensor parallel")
            except ValueError as e:
                raise CheckpointError(f"{os.path.join(model_dir, 'config.json')}: {e}") from None
        copy_mode = -1 if prefill_weight_copy is None else int(prefill_weight_copy)
        n.check(n.lib.pe_model_set_prefill_weight_copy(self.handle, copy_mode), "prefill_weight_copy")
        # Dummy FP8 weights are generated as FP8 directly; any other quantization applies at
        # finalize (after the checkpoint or the dummy bf16 weights are in).
        fp8_dummy = load_format == "dummy" and quant == _FP8
        if quant is not None and not fp8_dummy:
            n.check(n.lib.pe_model_set_weight_quant(self.handle, quant), "weight_quant")
        if load_format == "dummy":  # random weights of the config's shapes (on the GPU for cuda)
            n.check(n.lib.pe_model_load_dummy(self.handle, _FP8 if fp8_dummy else _BF16, 0x5EED), "dummy weights")
            return
        self._load(model_dir)

    def _load(self, model_dir: str) -> None:
        n = self._n
        with CheckpointReader(model_dir) as reader:
            for t in reader:
                shape = n.ffi.new("int64_t[]", list(t.shape))
                status = n.lib.pe_model_set_tensor(
                    self.handle, t.name.encode(), t.dtype, len(t.shape), shape,
                    n.ffi.from_buffer(t.data),
                )  # fmt: skip
                if status != 0:
                    raise CheckpointError(f"{os.path.join(model_dir, t.file_name)}: {n.last_error()}")
        if n.lib.pe_model_finalize(self.handle) != 0:
            raise CheckpointError(f"{model_dir}: {n.last_error()}")

    def close(self) -> None:
        """Frees the native model (weights, device memory) now instead of at garbage collection."""
        handle, self.handle = getattr(self, "handle", None), None
        if handle is not None:
            self._n.ffi.release(handle)

    def weight_bytes(self) -> int:
        """Bytes the weights take on the model's device."""
        return self._bytes(self._n.lib.pe_model_weight_bytes, "weight_bytes")

    def prefill_copy_bytes(self) -> int:
        """Of weight_bytes, the row-major copies kept for the prefill GEMM (prefill_weight_copy)."""
        return self._bytes(self._n.lib.pe_model_prefill_copy_bytes, "prefill_copy_bytes")

    def _bytes(self, fn, what: str) -> int:
        if self.handle is None:
            raise RuntimeError("the model is closed")
        out = self._n.ffi.new("int64_t*")
        self._n.check(fn(self.handle, out), what)
        return int(out[0])

    def _run(self, fn, token_ids, min_len: int, rows: int, *extra):
        """Calls a pe_model_*_logits function on token_ids; returns float32 [len + rows, vocab]."""
        import numpy as np

        n = self._n
        if self.handle is None:
            raise RuntimeError("the model is closed")
        ids = np.ascontiguousarray(token_ids, dtype=np.int32)
        if ids.ndim != 1 or ids.size < min_len:
            raise ValueError(f"token_ids must be a list of at least {min_len} int(s)")
        out = np.empty((ids.size + rows, self.config.vocab_size), dtype=np.float32)
        ids_p = n.ffi.cast("int32_t*", n.ffi.from_buffer(ids))
        n.check(fn(self.handle, ids_p, ids.size, *extra, n.ffi.cast("float*", n.ffi.from_buffer(out))), fn.__name__)
        return out

    def prompt_logits(self, token_ids, kv_cache_dtype: int = 0):
        return self._run(self._n.lib.pe_model_prompt_logits_kv, token_ids, 1, 0, kv_cache_dtype)

    def mtp_logits(self, token_ids):
        return self._run(self._n.lib.pe_model_mtp_logits, token_ids, 2, -1)
