"""Training state small enough to come back from the GPU machine and to be carried there again.

Design decision (limits: a call returns at most 8 files of <= 16 MB; the carried tree is <= 64 MiB
with the corpus, ~13 MB): the state is
  - the weights in bf16 (38.5 MB for 19.3M parameters), in shards of <= 15 MB;
  - AdamW's second moment, factored like Adafactor (row and column means of each matrix; full for
    vectors: ~0.1 MB), restored as outer(row, col) / mean;
  - no first moment: it restarts at zero, which, with the step count kept (bias correction ~1),
    makes the first ~10 steps after a resume small - a built-in warm restart;
  - meta.json: config, step, tokens seen, trained seconds, RNG states (the data position is the
    step: data.Sampler.batch is a function of (seed, step)).
The fp32 master weights are rounded to bf16 once per call (<= 0.4% relative, about the size of one
late-training AdamW step); the shipped model is bf16 anyway.
"""

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

MAX_FILE_BYTES = 15_000_000
META = "meta.json"


def _checkpoint_name(param_name: str) -> str:
    return param_name[3:] if param_name.startswith("lm.") else param_name


def _factored_second_moments(model, optimizer) -> dict[str, torch.Tensor]:
    out = {}
    for param_name, p in model.named_parameters():
        state = optimizer.state.get(p, {})
        if "exp_avg_sq" not in state:
            continue
        v, name = state["exp_avg_sq"].float(), _checkpoint_name(param_name)
        if v.ndim < 2:
            out[f"opt.v.{name}"] = v.cpu().contiguous()
        else:
            v2 = v.reshape(v.shape[0], -1)
            out[f"opt.v_row.{name}"] = v2.mean(1).cpu().contiguous()
            out[f"opt.v_col.{name}"] = v2.mean(0).cpu().contiguous()
    return out


def save(out_dir: Path, model, optimizer, meta: dict) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    tensors = {name: t.detach().to(torch.bfloat16).cpu().contiguous() for name, t in model.named_checkpoint_tensors()}
    tensors.update(_factored_second_moments(model, optimizer))
    shards, current, size = [], {}, 0
    for name, t in tensors.items():
        n_bytes = t.numel() * t.element_size()
        assert n_bytes <= MAX_FILE_BYTES, f"{name} alone exceeds one file"
        if size + n_bytes > MAX_FILE_BYTES:
            shards.append(current)
            current, size = {}, 0
        current[name], size = t, size + n_bytes
    shards.append(current)
    for old in out_dir.glob("state-*.safetensors"):
        old.unlink()
    paths = []
    for i, shard in enumerate(shards):
        paths.append(out_dir / f"state-{i:02d}-of-{len(shards):02d}.safetensors")
        save_file(shard, str(paths[-1]))
    (out_dir / META).write_text(json.dumps(meta, indent=1) + "\n")
    return paths + [out_dir / META]


def exists(ckpt_dir: Path | None) -> bool:
    return ckpt_dir is not None and (ckpt_dir / META).exists() and any(ckpt_dir.glob("state-*.safetensors"))


def load_meta(ckpt_dir: Path) -> dict:
    return json.loads((ckpt_dir / META).read_text())


def load_tensors(ckpt_dir: Path) -> dict[str, torch.Tensor]:
    files = sorted(ckpt_dir.glob("state-*.safetensors"))
    expected = int(files[0].stem.split("-of-")[1])
    assert len(files) == expected, f"{ckpt_dir}: {len(files)} shards, expected {expected}"
    tensors = {}
    for f in files:
        tensors.update(load_file(str(f)))
    return tensors


def model_tensors(tensors: dict) -> dict:
    return {k: v for k, v in tensors.items() if not k.startswith("opt.")}


def restore_optimizer(model, optimizer, tensors: dict, step: int):
    """Fills AdamW state: m = 0, v = the factored estimate, step count kept."""
    for param_name, p in model.named_parameters():
        name = _checkpoint_name(param_name)
        if f"opt.v.{name}" in tensors:
            v = tensors[f"opt.v.{name}"].reshape(p.shape)
        elif f"opt.v_row.{name}" in tensors:
            row, col = tensors[f"opt.v_row.{name}"], tensors[f"opt.v_col.{name}"]
            v = (torch.outer(row, col) / row.mean().clamp_min(1e-30)).reshape(p.shape)
        else:
            continue
        fused = optimizer.defaults.get("fused") or optimizer.defaults.get("capturable")
        optimizer.state[p] = {
            "step": torch.tensor(float(step), device=p.device if fused else "cpu"),
            "exp_avg": torch.zeros_like(p, memory_format=torch.preserve_format),
            "exp_avg_sq": v.to(device=p.device, dtype=p.dtype).contiguous(),
        }
