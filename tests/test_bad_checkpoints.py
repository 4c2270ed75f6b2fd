"""A malformed checkpoint fails at load with an error naming the file / tensor and the problem."""

import json
import os
import shutil
import struct

import numpy as np
import pytest

from pyengine import LLM
from pyengine.errors import CheckpointError

SRC = os.path.join(os.path.dirname(__file__), "data", "ckpt_text_bf16")


@pytest.fixture
def ckpt(tmp_path):
    dst = tmp_path / "ckpt"
    shutil.copytree(SRC, dst)
    return dst


def read_safetensors(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    return json.loads(raw[8 : 8 + n]), raw[8 + n :]


def write_safetensors(path, header, data):
    blob = json.dumps(header).encode()
    blob += b" " * (-len(blob) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)) + blob + data)


def edit_tensor(path, name, fn):
    """Rewrites the file with tensor `name`'s (header entry, bytes) replaced by fn(entry, bytes)."""
    header, data = read_safetensors(path)
    meta = header.pop("__metadata__", None)
    tensors = []
    for key, entry in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
        b, e = entry["data_offsets"]
        blob = data[b:e]
        if key == name:
            result = fn(dict(entry), blob)
            if result is None:
                continue
            entry, blob = result
        tensors.append((key, entry, blob))
    out, pos, body = {}, 0, b""
    for key, entry, blob in tensors:
        entry = {"dtype": entry["dtype"], "shape": entry["shape"], "data_offsets": [pos, pos + len(blob)]}
        out[key] = entry
        body += blob
        pos += len(blob)
    if meta is not None:
        out["__metadata__"] = meta
    write_safetensors(path, out, body)


def load(path):
    with LLM(str(path), max_model_len=64) as llm:
        return llm


def test_missing_tensor(ckpt):
    name = "model.layers.2.linear_attn.A_log"
    edit_tensor(ckpt / "model.safetensors", name, lambda e, b: None)
    with pytest.raises(CheckpointError, match=r"layers\.2\.linear_attn\.A_log.*missing"):
        load(ckpt)


def test_wrong_shape(ckpt):
    name = "model.layers.0.mlp.up_proj.weight"

    def cut(entry, blob):
        rows, cols = entry["shape"]
        entry["shape"] = [rows - 1, cols]
        return entry, blob[: (rows - 1) * cols * 2]

    edit_tensor(ckpt / "model.safetensors", name, cut)
    with pytest.raises(CheckpointError, match=r"model\.safetensors.*layers\.0\.mlp\.up_proj\.weight.*shape"):
        load(ckpt)


def test_wrong_dtype(ckpt):
    name = "model.norm.weight"

    def to_i32(entry, blob):
        entry["dtype"] = "I32"
        n = int(np.prod(entry["shape"]))
        return entry, np.zeros(n, np.int32).tobytes()

    edit_tensor(ckpt / "model.safetensors", name, to_i32)
    with pytest.raises(CheckpointError, match=r"norm\.weight.*dtype"):
        load(ckpt)


def test_truncated_file(ckpt):
    path = ckpt / "model.safetensors"
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.truncate(size - 1000)
    with pytest.raises(CheckpointError, match=r"model\.safetensors"):
        load(ckpt)


@pytest.mark.parametrize(
    "field, value, pattern",
    [("model_type", "llama", r"config\.json.*model_type.*llama"), ("hidden_act", "gelu", r"config\.json.*hidden_act")],
)
def test_bad_config_value(ckpt, field, value, pattern):
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg[field] = value
    (ckpt / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=pattern):
        load(ckpt)


def test_unexpected_tensor(ckpt):
    """A tensor the architecture does not have means the config and weights disagree."""
    name = "model.norm.weight"
    header, data = read_safetensors(ckpt / "model.safetensors")
    header["model.layers.99.mlp.up_proj.weight"] = dict(header[name])
    write_safetensors(ckpt / "model.safetensors", header, data)
    with pytest.raises(CheckpointError, match=r"layers\.99"):
        load(ckpt)
