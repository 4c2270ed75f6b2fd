"""The safetensors reader, on files written byte by byte here (no safetensors/torch writer),
so that bf16, fp8 and every kind of damage can be produced exactly."""

import json
import struct

import numpy as np
import pytest

from pyengine.checkpoint import CheckpointReader, SafetensorsFile, engine_tensor_name
from pyengine.errors import CheckpointError


def bf16_bytes(values) -> bytes:
    # bf16 = the high half of the fp32 bit pattern (these values are exact in bf16).
    bits = np.asarray(values, dtype=np.float32).view(np.uint32) >> 16
    return bits.astype("<u2").tobytes()


def write_safetensors(path, tensors, header_override=None, trailing=b""):
    """tensors: {name: (dtype, shape, raw bytes)}. Returns the file's bytes."""
    header, data = {}, b""
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {
            "dtype": dtype,
            "shape": list(shape),
            "data_offsets": [len(data), len(data) + len(raw)],
        }
        data += raw
    header["__metadata__"] = {"format": "pt"}
    if header_override is not None:
        header = header_override(header)
    header_bytes = json.dumps(header).encode()
    header_bytes += b" " * (-len(header_bytes) % 8)  # the format pads the header to 8 bytes
    content = struct.pack("<Q", len(header_bytes)) + header_bytes + data + trailing
    path.write_bytes(content)
    return content


BF16_VALUES = [1.0, -2.0, 0.5, 3.0, 0.0, -0.25]
FP8_BYTES = bytes([0x38, 0xB8, 0x40, 0x7E])  # e4m3: 1.0, -1.0, 2.0, 448.0
TENSORS = {
    "model.language_model.embed_tokens.weight": ("BF16", (3, 2), bf16_bytes(BF16_VALUES)),
    "model.language_model.layers.0.mlp.up_proj.weight": ("F8_E4M3", (2, 2), FP8_BYTES),
    "model.language_model.layers.0.mlp.up_proj.weight_scale_inv": (
        "F32",
        (1, 1),
        np.float32([0.5]).tobytes(),
    ),
    "model.language_model.norm.weight": ("F16", (2,), np.float16([1.5, -1]).tobytes()),
    "lm_head.weight": ("BF16", (3, 2), bf16_bytes(BF16_VALUES[::-1])),
    "mtp.fc.weight": ("BF16", (2, 4), bf16_bytes(range(8))),
    "model.visual.blocks.0.attn.qkv.weight": ("F64", (1,), np.float64([7]).tobytes()),
    "model.language_model.layers.0.linear_attn.ids": ("I32", (2,), np.int32([7, -1]).tobytes()),
}


def test_engine_names():
    assert engine_tensor_name("model.language_model.layers.3.self_attn.q_proj.weight") == (
        "layers.3.self_attn.q_proj.weight"
    )
    assert engine_tensor_name("model.embed_tokens.weight") == "embed_tokens.weight"
    assert engine_tensor_name("lm_head.weight") == "lm_head.weight"
    assert (
        engine_tensor_name("mtp.layers.0.input_layernorm.weight")
        == "mtp.layers.0.input_layernorm.weight"
    )
    assert engine_tensor_name("model.visual.patch_embed.proj.weight") is None
    assert engine_tensor_name("visual.merger.fc.weight") is None


def test_single_file_dtypes_shapes_and_bytes(tmp_path):
    write_safetensors(tmp_path / "model.safetensors", TENSORS)
    with CheckpointReader(tmp_path) as reader:
        assert reader.file_names == ["model.safetensors"]
        assert "visual" not in " ".join(reader.names())
        assert len(reader) == len(TENSORS) - 1
        tensors = {t.name: t for t in reader}
        embed = tensors["embed_tokens.weight"]
        assert (embed.dtype, embed.dtype_name, embed.shape) == (2, "BF16", (3, 2))
        assert embed.checkpoint_name == "model.language_model.embed_tokens.weight"
        assert embed.file_name == "model.safetensors"
        # Zero-copy bytes of the file: bf16 -> fp32 by shifting back.
        as_f32 = (embed.data.view("<u2").astype(np.uint32) << 16).view(np.float32)
        np.testing.assert_array_equal(as_f32, BF16_VALUES)
        assert not embed.data.flags.writeable
        fp8 = tensors["layers.0.mlp.up_proj.weight"]
        assert fp8.dtype == 3 and bytes(fp8.data) == FP8_BYTES
        scale = tensors["layers.0.mlp.up_proj.weight_scale_inv"]
        assert scale.dtype == 0 and scale.data.view(np.float32)[0] == 0.5
        assert tensors["norm.weight"].dtype == 1
        np.testing.assert_array_equal(tensors["norm.weight"].data.view(np.float16), [1.5, -1])
        assert tensors["layers.0.linear_attn.ids"].dtype == 5
        np.testing.assert_array_equal(
            tensors["layers.0.linear_attn.ids"].data.view(np.int32), [7, -1]
        )
        assert tensors["lm_head.weight"].nbytes == 12
        assert tensors["mtp.fc.weight"].shape == (2, 4)
        assert reader.tensor("lm_head.weight").checkpoint_name == "lm_head.weight"


def test_text_layout_prefix_and_zero_sized_tensor(tmp_path):
    tensors = {
        "model.layers.0.input_layernorm.weight": ("F32", (2,), np.float32([1, 2]).tobytes()),
        "model.empty": ("F32", (0, 4), b""),
    }
    write_safetensors(tmp_path / "model.safetensors", tensors)
    with CheckpointReader(tmp_path) as reader:
        assert reader.names() == ["layers.0.input_layernorm.weight", "empty"]
        assert reader.tensor("empty").nbytes == 0


def test_sharded_checkpoint(tmp_path):
    names = list(TENSORS)
    shard_a = {n: TENSORS[n] for n in names[:3]}
    shard_b = {n: TENSORS[n] for n in names[3:]}
    write_safetensors(tmp_path / "model-00001-of-00002.safetensors", shard_a)
    write_safetensors(tmp_path / "model-00002-of-00002.safetensors", shard_b)
    weight_map = {n: "model-00001-of-00002.safetensors" for n in shard_a}
    weight_map |= {n: "model-00002-of-00002.safetensors" for n in shard_b}
    (tmp_path / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": weight_map})
    )
    with CheckpointReader(tmp_path) as reader:
        assert reader.file_names == [
            "model-00001-of-00002.safetensors",
            "model-00002-of-00002.safetensors",
        ]
        assert reader.tensor("norm.weight").file_name == "model-00002-of-00002.safetensors"
        assert reader.tensor("embed_tokens.weight").file_name == "model-00001-of-00002.safetensors"
        assert len(list(reader)) == len(TENSORS) - 1


def test_missing_shard_is_named(tmp_path):
    write_safetensors(
        tmp_path / "a.safetensors",
        {"model.norm.weight": TENSORS["model.language_model.norm.weight"]},
    )
    weight_map = {"model.norm.weight": "a.safetensors", "lm_head.weight": "b.safetensors"}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    with pytest.raises(
        CheckpointError, match="shard 'b.safetensors' listed in weight_map does not exist"
    ):
        CheckpointReader(tmp_path)


def test_index_pointing_at_the_wrong_shard(tmp_path):
    write_safetensors(
        tmp_path / "a.safetensors",
        {"model.norm.weight": TENSORS["model.language_model.norm.weight"]},
    )
    write_safetensors(tmp_path / "b.safetensors", {"lm_head.weight": TENSORS["lm_head.weight"]})
    weight_map = {"model.norm.weight": "b.safetensors", "lm_head.weight": "b.safetensors"}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    with pytest.raises(
        CheckpointError, match="weight_map puts 'model.norm.weight' in b.safetensors"
    ):
        CheckpointReader(tmp_path)


@pytest.mark.parametrize(
    "index, message",
    [
        ("{", "cannot read JSON"),
        ('{"weight_map": []}', "weight_map is missing, empty or not an object"),
        ('{"weight_map": {"x": "../model.safetensors"}}', "is not a file name"),
    ],
)
def test_malformed_index(tmp_path, index, message):
    (tmp_path / "model.safetensors.index.json").write_text(index)
    with pytest.raises(CheckpointError, match=message):
        CheckpointReader(tmp_path)


def test_duplicate_engine_name_across_prefixes(tmp_path):
    norm = TENSORS["model.language_model.norm.weight"]
    write_safetensors(
        tmp_path / "model.safetensors",
        {"model.norm.weight": norm, "model.language_model.norm.weight": norm},
    )
    with pytest.raises(CheckpointError, match="duplicates"):
        CheckpointReader(tmp_path)


def test_no_weights_in_directory(tmp_path):
    with pytest.raises(
        CheckpointError, match="neither model.safetensors nor model.safetensors.index.json"
    ):
        CheckpointReader(tmp_path)


def test_truncated_file_names_file_and_tensor(tmp_path):
    path = tmp_path / "model.safetensors"
    content = write_safetensors(path, TENSORS)
    path.write_bytes(content[:-3])  # cuts into the last tensor's data
    with pytest.raises(CheckpointError) as info:
        CheckpointReader(tmp_path)
    message = str(info.value)
    assert str(path) in message and "'model.language_model.layers.0.linear_attn.ids'" in message
    assert "truncated" in message


@pytest.mark.parametrize(
    "content, message",
    [
        (b"", "too short"),
        (b"\x01\x02", "too short"),
        (struct.pack("<Q", 10**12) + b"{}", "header length 1000000000000 is impossible"),
        (struct.pack("<Q", 4) + b"nope", "header is not valid JSON"),
        (struct.pack("<Q", 2) + b"[]", "header is not a JSON object"),
    ],
)
def test_bad_headers(tmp_path, content, message):
    path = tmp_path / "x.safetensors"
    path.write_bytes(content)
    with pytest.raises(CheckpointError, match=message):
        SafetensorsFile(path)


def one_tensor_with(field, value):
    def override(header):
        header["t"][field] = value
        return header

    return override


@pytest.mark.parametrize(
    "override, message",
    [
        (one_tensor_with("dtype", "Q4"), "tensor 't': unknown dtype 'Q4'"),
        (
            one_tensor_with("shape", [2, -1]),
            "shape \\[2, -1\\] is not a list of non-negative integers",
        ),
        (one_tensor_with("shape", [3]), "8 bytes of data for shape \\[3\\] F32 \\(expected 12\\)"),
        (one_tensor_with("data_offsets", [0]), "is not \\[begin, end\\]"),
        (one_tensor_with("data_offsets", [8, 0]), "end before they begin"),
        (one_tensor_with("data_offsets", [4, 12]), "data ends at byte"),
        (lambda h: {"t": "x"}, "header entry is not an object"),
    ],
)
def test_bad_entries_name_the_tensor(tmp_path, override, message):
    path = tmp_path / "x.safetensors"
    write_safetensors(
        path, {"t": ("F32", (2,), np.float32([1, 2]).tobytes())}, header_override=override
    )
    with pytest.raises(CheckpointError, match=message):
        SafetensorsFile(path)


def test_overlap_and_unaccounted_bytes(tmp_path):
    raw = np.float32([1, 2]).tobytes()
    path = tmp_path / "x.safetensors"

    def overlap(header):
        header["b"]["data_offsets"] = [4, 12]
        return header

    write_safetensors(
        path,
        {"a": ("F32", (2,), raw), "b": ("F32", (2,), raw)},
        header_override=overlap,
        trailing=b"\0" * 4,
    )
    with pytest.raises(CheckpointError, match="tensor 'b': data at byte .* overlaps"):
        SafetensorsFile(path)
    write_safetensors(path, {"a": ("F32", (2,), raw)}, trailing=b"junk")
    with pytest.raises(CheckpointError, match="4 bytes after the last tensor"):
        SafetensorsFile(path)


def test_dtype_the_engine_lacks_fails_only_when_read(tmp_path):
    write_safetensors(
        tmp_path / "model.safetensors",
        {"model.norm.weight": ("F64", (1,), np.float64([1]).tobytes())},
    )
    with CheckpointReader(tmp_path) as reader:
        with pytest.raises(
            CheckpointError, match="'model.norm.weight': dtype F64 is not supported"
        ):
            list(reader)


def test_close_with_views_alive_keeps_them_valid(tmp_path):
    write_safetensors(tmp_path / "model.safetensors", TENSORS)
    reader = CheckpointReader(tmp_path)
    norm = reader.tensor("norm.weight")
    reader.close()  # must not raise although `norm` still views the map
    np.testing.assert_array_equal(norm.data.view(np.float16), [1.5, -1])
    assert len(reader) == 0


def test_reads_what_the_safetensors_library_writes(tmp_path):
    from safetensors.numpy import save_file

    rng = np.random.default_rng(0)
    arrays = {
        "model.layers.0.self_attn.q_proj.weight": rng.standard_normal((5, 3)).astype(np.float32),
        "model.norm.weight": rng.standard_normal(7).astype(np.float16),
        "mtp.ids": np.arange(9, dtype=np.int32).reshape(3, 3),
    }
    save_file(arrays, str(tmp_path / "model.safetensors"))
    with CheckpointReader(tmp_path) as reader:
        for checkpoint_name, expected in arrays.items():
            tensor = reader.tensor(engine_tensor_name(checkpoint_name))
            assert tensor.shape == expected.shape
            np.testing.assert_array_equal(
                tensor.data.view(expected.dtype).reshape(tensor.shape), expected
            )
