#!/usr/bin/env python3
"""Generate small random Qwen3.5 reference checkpoints and transformers goldens for pyengine's tests.

    python tools/make_test_checkpoints.py --out tests/data

Needs torch (CPU) and transformers 5.17 (the reference implementation). Everything it writes is plain
safetensors / json / npz, so the engine and its tests never import torch. Fully determined by SEED.
See tests/data/README.md for what is written.
"""
import argparse
import copy
import json
import math
import os
import shutil

import numpy as np
import torch
import transformers
from safetensors.torch import load_file, save_file
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import (AutoConfig, AutoTokenizer, Qwen3_5Config, Qwen3_5ForCausalLM,
                          Qwen3_5ForConditionalGeneration, Qwen3_5TextConfig)
from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5DecoderLayer, Qwen3_5RMSNorm

SEED = 1234
VOCAB = 512
N_GREEDY = 20
SPLIT_AT = 33  # split_70: prefill ids[:33], then ids[33:] on top of the cache
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]
REASONING_TAGS = ("<think>", "</think>")
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}"
    "{%- else %}{{- '<think>\\n' }}{%- endif %}{%- endif %}")
CHAT = [{"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Write a Python function that returns the sum of a list of numbers."}]
# Qwen2-style pre-tokenizer split pattern.
SPLIT_PAT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
             r"|\s*[\r\n]+|\s+(?!\S)|\s+")
ENGLISH = """The quick brown fox jumps over the lazy dog. A language model reads a prompt, one token at a
time, and predicts the next token. Hybrid models mix linear attention layers, which keep a small recurrent
state, with full attention layers, which keep every key and value in a cache. The engine should give the
same answer whether it reads the prompt all at once or token by token. When the weights are stored in eight
bit floating point, each block of one hundred and twenty eight rows and columns carries its own scale.
Please write clear code, test it well, and measure before you optimize. Speculative decoding drafts several
tokens cheaply and verifies them in one pass of the large model; rejected tokens must be rolled back.
You are a helpful assistant. The user asked a question about the weather, the news, and the best way to
learn programming. Think step by step, then answer briefly. What is the capital of France? It is Paris.
One, two, three, four, five, six, seven, eight, nine, ten. 0123456789 + - * / = < > ( ) [ ] { } # @ ! ?
"""
PYTHON = ("import os\n\n\ndef sum_list(numbers: list[float]) -> float:\n    \"\"\"Return the sum.\"\"\"\n"
          "    total = 0.0\n    for x in numbers:\n        total += x\n    return total\n\n\n"
          "class Cache:\n    def get(self, key: str) -> str | None:\n        return self.items.get(key, None)\n")
TOKENIZER_SAMPLES = ["Hello, world! The quick brown fox.", "def add(a, b):\n    return a + b\n",
                     "  leading spaces, tabs\tand unicode: café naïve 日本 🙂",
                     "<|im_start|>user\nhi<|im_end|>\n<think>\n\n</think>\n\n"]

LT = ["linear_attention"] * 3 + ["full_attention"]


def text_cfg(H, N, I, heads, D, rot, theta, gdn, rope_extra=None, **kw):  # noqa: E741
    """heads = (Hq, Hkv); gdn = (Hk, Hv, dk, dv)."""
    return dict(hidden_size=H, num_hidden_layers=N, intermediate_size=I, num_attention_heads=heads[0],
                num_key_value_heads=heads[1], head_dim=D, partial_rotary_factor=rot,
                rope_parameters=dict(rope_type="default", rope_theta=theta, partial_rotary_factor=rot,
                                     **(rope_extra or {})),
                linear_num_key_heads=gdn[0], linear_num_value_heads=gdn[1], linear_key_head_dim=gdn[2],
                linear_value_head_dim=gdn[3], **kw)


# name -> layout, dtype, tied lm_head, options, Qwen3_5TextConfig fields
VARIANTS = {
    "ckpt_text_bf16": dict(layout="text", dtype="bf16", tied=True, decode=True, split=True, cfg=text_cfg(
        64, 8, 128, (3, 1), 32, 0.25, 1e7, (2, 4, 16, 16), layer_types=LT * 2)),
    "ckpt_wrapper_bf16": dict(layout="wrapper", dtype="bf16", tied=False, mtp=True, decode=True, split=True,
                              template_file=True, cfg=text_cfg(
        64, 4, 160, (6, 2), 16, 0.5, 1e7, (2, 6, 16, 24), layer_types=LT, mtp_num_hidden_layers=1,
        rope_extra=dict(mrope_section=[2, 1, 1], mrope_interleaved=True))),
    "ckpt_interval_f32": dict(layout="text", dtype="f32", tied=False, interval=4, cfg=text_cfg(
        48, 6, 96, (6, 3), 24, 0.25, 10000.0, (3, 3, 20, 20))),
    "ckpt_text_fp8": dict(layout="text", dtype="fp8", tied=False, cfg=text_cfg(
        96, 4, 200, (3, 1), 32, 0.25, 1e7, (2, 6, 24, 32), layer_types=LT)),
}
TINY_VISION = dict(depth=1, hidden_size=16, num_heads=2, intermediate_size=32, patch_size=4,
                   temporal_patch_size=2, spatial_merge_size=2, num_position_embeddings=16)


def build_tokenizer():
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(SPLIT_PAT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB - len(SPECIALS), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([ENGLISH, PYTHON, CHAT_TEMPLATE] + [m["content"] for m in CHAT], trainer)
    assert tok.get_vocab_size() == VOCAB - len(SPECIALS), tok.get_vocab_size()
    # The reasoning tags are added tokens but not "special" (as in Qwen's tokenizer), so
    # decode(skip_special_tokens=True) keeps them and clients can split reasoning from content.
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in SPECIALS if s not in REASONING_TAGS])
    tok.add_tokens([AddedToken(s, special=False, normalized=False) for s in SPECIALS if s in REASONING_TAGS])
    assert tok.get_vocab_size() == VOCAB
    return tok


def write_tokenizer(tok, d, template_file):
    tok.save(os.path.join(d, "tokenizer.json"))
    ids = {s: tok.token_to_id(s) for s in SPECIALS}
    tc = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 4096, "bos_token": None,
          "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "add_bos_token": False,
          "clean_up_tokenization_spaces": False, "split_special_tokens": False,
          "added_tokens_decoder": {str(i): {"content": s, "special": s not in REASONING_TAGS, "normalized": False, "lstrip": False,
                                            "rstrip": False, "single_word": False} for s, i in ids.items()}}
    if template_file:  # the newer layout: template in its own file
        open(os.path.join(d, "chat_template.jinja"), "w").write(CHAT_TEMPLATE)
    else:
        tc["chat_template"] = CHAT_TEMPLATE
    dump_json(tc, os.path.join(d, "tokenizer_config.json"))
    return ids


def dump_json(obj, path):
    with open(path, "w") as f:
        json.dump(obj, f, indent=2, sort_keys=False)
        f.write("\n")


def randomize(module, gen, hidden):
    """Every parameter random; norms in the offset form get small values around 0 (weight 1+w)."""
    with torch.no_grad():
        for name, p in module.named_parameters():
            n = lambda std, mean=0.0: torch.randn(p.shape, generator=gen) * std + mean  # noqa: E731
            if name.endswith("A_log"):
                v = torch.empty(p.shape).uniform_(0.05, 2.0, generator=gen).log()
            elif name.endswith("dt_bias"):
                v = n(0.5)
            elif name.endswith("linear_attn.norm.weight"):  # GDN gated norm: plain multiplier
                v = n(0.1, 1.0)
            elif name.endswith("conv1d.weight"):
                v = n(0.5)
            elif p.ndim == 1:  # offset RMSNorms (also q_norm/k_norm, mtp norms); vision biases/LN
                v = n(0.1)
            elif "embed_tokens" in name or name.startswith("lm_head"):  # logits std ~4 (tied or not)
                v = n(4.0 / math.sqrt(hidden))
            else:  # linear weights (and vision conv/pos_embed)
                v = n(1.0 / math.sqrt(p[0].numel()))
            p.copy_(v)


def mtp_module(text_cfg):
    """The released checkpoints' mtp.* block (transformers has no MTP module, so we assemble it from its parts)."""
    H, cfg = text_cfg.hidden_size, copy.deepcopy(text_cfg)
    cfg.layer_types, cfg.num_hidden_layers, cfg._attn_implementation = ["full_attention"], 1, "eager"
    return torch.nn.ModuleDict({"fc": torch.nn.Linear(2 * H, H, bias=False),
                                "pre_fc_norm_embedding": Qwen3_5RMSNorm(H, text_cfg.rms_norm_eps),
                                "pre_fc_norm_hidden": Qwen3_5RMSNorm(H, text_cfg.rms_norm_eps),
                                "layers": torch.nn.ModuleList([Qwen3_5DecoderLayer(cfg, 0)]),
                                "norm": Qwen3_5RMSNorm(H, text_cfg.rms_norm_eps)})


def quantize_fp8(w, block=128):
    """w [out,in] fp32 -> (fp8 e4m3 weight, F32 scale_inv [ceil(out/128), ceil(in/128)]), W = fp8 * scale_inv."""
    o, i = w.shape
    bo, bi = -(-o // block), -(-i // block)
    wp = torch.zeros(bo * block, bi * block)
    wp[:o, :i] = w
    blocks = wp.view(bo, block, bi, block)
    amax = blocks.abs().amax(dim=(1, 3))
    scale = torch.where(amax > 0, amax / 448.0, torch.ones_like(amax))
    q = (blocks / scale[:, None, :, None]).clamp(-448, 448).view(bo * block, bi * block)[:o, :i]
    return q.to(torch.float8_e4m3fn).contiguous(), scale.float().contiguous()


def dequant(q, s, block=128):
    return q.float() * s.repeat_interleave(block, 0).repeat_interleave(block, 1)[:q.shape[0], :q.shape[1]]


def fp8_keep(name):
    return not name.endswith(".weight") or any(t in name for t in (
        "embed_tokens", "lm_head", "norm", "conv1d", "in_proj_a", "in_proj_b"))


def build_checkpoint(name, v, d, tok_ids, gen):
    im_end, eot = tok_ids["<|im_end|>"], tok_ids["<|endoftext|>"]
    tcfg = Qwen3_5TextConfig(vocab_size=VOCAB, hidden_act="silu", rms_norm_eps=1e-6, max_position_embeddings=4096,
                             linear_conv_kernel_dim=4, tie_word_embeddings=v["tied"], eos_token_id=im_end,
                             pad_token_id=eot, **v["cfg"])
    if v["layout"] == "wrapper":
        cfg = Qwen3_5Config(text_config=tcfg, vision_config=dict(TINY_VISION, out_hidden_size=tcfg.hidden_size),
                            tie_word_embeddings=v["tied"])
        model = Qwen3_5ForConditionalGeneration(cfg)
    else:
        model = Qwen3_5ForCausalLM(tcfg)
    randomize(model, gen, tcfg.hidden_size)
    model.eval()
    if v["dtype"] in ("bf16", "fp8"):
        model.to(torch.bfloat16)
    model.save_pretrained(d, safe_serialization=True)
    dump_json({"bos_token_id": eot, "eos_token_id": im_end, "pad_token_id": eot, "do_sample": False,
               "transformers_version": transformers.__version__}, os.path.join(d, "generation_config.json"))
    cfg_path = os.path.join(d, "config.json")
    cj = json.load(open(cfg_path))
    if v["layout"] == "wrapper":
        sd = load_file(os.path.join(d, "model.safetensors"))
        mtp = mtp_module(tcfg)
        randomize(mtp, gen, tcfg.hidden_size)
        sd.update({"mtp." + k: t.detach().to(torch.bfloat16) for k, t in mtp.state_dict().items()})
        os.remove(os.path.join(d, "model.safetensors"))
        keys = sorted(sd)
        half, wmap = len(keys) // 2, {}
        for s, part in enumerate([keys[:half], keys[half:]]):
            fn = f"model-0000{s + 1}-of-00002.safetensors"
            save_file({k: sd[k].contiguous() for k in part}, os.path.join(d, fn), metadata={"format": "pt"})
            wmap.update({k: fn for k in part})
        total = sum(t.numel() * t.element_size() for t in sd.values())
        dump_json({"metadata": {"total_size": total}, "weight_map": wmap},
                  os.path.join(d, "model.safetensors.index.json"))
    if v["dtype"] == "fp8":
        sd, out = load_file(os.path.join(d, "model.safetensors")), {}
        for k, t in sd.items():
            if fp8_keep(k):
                out[k] = t
            else:
                out[k], out[k + "_scale_inv"] = quantize_fp8(t.float())
        save_file(out, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
        keep = sorted({k[:-len(".weight")] for k in sd if k.endswith(".weight") and fp8_keep(k)
                       and any(t in k for t in ("lm_head", "in_proj_a", "in_proj_b"))})
        cj["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                     "weight_block_size": [128, 128], "modules_to_not_convert": keep}
    if "interval" in v:
        del cj["layer_types"]
        cj["full_attention_interval"] = v["interval"]
    dump_json(cj, cfg_path)
    return model


def load_reference(d, v):
    """The saved checkpoint re-loaded by transformers, in float32, eval, eager attention."""
    kw = dict(dtype=torch.float32, attn_implementation="eager", output_loading_info=True)
    if v["dtype"] == "fp8":  # reference = dequantized weights (fp8 * scale_inv, fp32) in the plain architecture
        cfg = AutoConfig.from_pretrained(d)
        del cfg.quantization_config
        cfg._attn_implementation = "eager"
        model = Qwen3_5ForCausalLM(cfg).float()
        sd = load_file(os.path.join(d, "model.safetensors"))
        sd = {k: (dequant(t, sd[k + "_scale_inv"]) if k + "_scale_inv" in sd else t.float())
              for k, t in sd.items() if not k.endswith("_scale_inv")}
        missing, unexpected = model.load_state_dict(sd, strict=False)
        assert not unexpected and set(missing) <= {"lm_head.weight"} and not cfg.tie_word_embeddings, missing
        return model.eval()
    cls = Qwen3_5ForConditionalGeneration if v["layout"] == "wrapper" else Qwen3_5ForCausalLM
    model, info = cls.from_pretrained(d, **kw)
    assert not info["missing_keys"] and not info["mismatched_keys"], info
    assert all(k.startswith("mtp.") for k in info["unexpected_keys"]), info["unexpected_keys"]
    return model.eval()


def logits_of(model, ids, cache=None):
    out = model(input_ids=torch.tensor([ids]), past_key_values=cache, use_cache=cache is not None)
    return out.logits[0].float(), out.past_key_values


@torch.no_grad()
def goldens(model, v, prompts, tcfg):
    g, checks = {}, {}
    for pn, ids in prompts.items():
        lg, _ = logits_of(model, ids)
        g[f"prompt_{pn}_ids"], g[f"prompt_{pn}_logits"] = np.array(ids, np.int32), lg.numpy()
        # greedy continuation: prefill with the cache, then one token at a time
        seq, steps = list(ids), []
        lg_c, cache = logits_of(model, ids, transformers.DynamicCache(config=tcfg))
        checks[f"prefill_with_cache_vs_no_cache_{pn}"] = float((lg_c - lg).abs().max())
        last = lg_c[-1]
        for _ in range(N_GREEDY):
            steps.append(last)
            seq.append(int(last.argmax()))
            last, cache = logits_of(model, seq[-1:], cache)
            last = last[-1]
        g[f"greedy_{pn}_ids"] = np.array(seq[len(ids):], np.int32)
        g[f"greedy_{pn}_logits"] = torch.stack(steps).numpy()
        top2 = torch.stack(steps).topk(2, -1).values
        checks[f"greedy_{pn}_min_top1_top2_margin"] = float((top2[:, 0] - top2[:, 1]).min())
        full, _ = logits_of(model, seq[:-1])  # the whole continuation re-read without cache
        checks[f"greedy_{pn}_decode_vs_full_forward"] = float((full[len(ids) - 1:] - torch.stack(steps)).abs().max())
        assert torch.equal(full[len(ids) - 1:].argmax(-1), torch.tensor(seq[len(ids):]))
    ids70 = prompts["70"]
    if v.get("decode"):  # feed the 70-token prompt one token at a time with the cache
        cache, rows = transformers.DynamicCache(config=tcfg), []
        for t in ids70:
            lg, cache = logits_of(model, [t], cache)
            rows.append(lg[-1])
        g["decode_70_logits"] = torch.stack(rows).numpy()
        checks["decode_70_vs_prefill"] = float(np.abs(g["decode_70_logits"] - g["prompt_70_logits"]).max())
    if v.get("split"):  # prefill in two pieces: the second one starts from a non-empty GDN state and KV cache
        a, cache = logits_of(model, ids70[:SPLIT_AT], transformers.DynamicCache(config=tcfg))
        b, _ = logits_of(model, ids70[SPLIT_AT:], cache)
        g["split_70_logits"] = torch.cat([a, b]).numpy()
        checks["split_70_vs_prefill"] = float(np.abs(g["split_70_logits"] - g["prompt_70_logits"]).max())
    return g, checks


@torch.no_grad()
def mtp_goldens(model, d, prompts):
    """MTP reference (vLLM qwen3_5_mtp.py semantics, built from transformers' modules): row p predicts the token
    at p+2 from the target's final-normed hidden h_p and the token x_{p+1}; MTP attention at positions 0..n-2."""
    sd = {}
    for fn in sorted(os.listdir(d)):
        if fn.endswith(".safetensors"):
            sd.update({k: t.float() for k, t in load_file(os.path.join(d, fn)).items() if k.startswith("mtp.")})
    lm = model.model.language_model
    mtp = mtp_module(lm.config).float().eval()
    mtp.load_state_dict({k[len("mtp."):]: t for k, t in sd.items()})
    out = {}
    for pn in ("7", "70"):
        ids = torch.tensor([prompts[pn]])
        h = lm(input_ids=ids).last_hidden_state  # final-normed hidden of the target
        e = lm.embed_tokens(ids[:, 1:])
        u = mtp.fc(torch.cat([mtp.pre_fc_norm_embedding(e), mtp.pre_fc_norm_hidden(h[:, :-1])], -1))
        T = u.shape[1]  # MTP positions 0..n-2 (the positions of h_p), causal
        pe, mask = lm.rotary_emb(u, torch.arange(T).view(1, 1, -1).expand(3, 1, -1)), torch.full((T, T), -1e30).triu(1)
        u = mtp.layers[0](u, position_embeddings=pe, attention_mask=mask[None, None])
        out[f"mtp_{pn}_logits"] = model.lm_head(mtp.norm(u))[0].numpy()
    return out


def chat_prompt(d, tok):
    """Render the chat through transformers' tokenizer loading + template; check against `tokenizers`."""
    hf_tok = AutoTokenizer.from_pretrained(d)
    text = hf_tok.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
    nothink = hf_tok.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True, enable_thinking=False)
    assert text.endswith("<|im_start|>assistant\n<think>\n") and nothink.endswith("<think>\n\n</think>\n\n")
    ids = hf_tok(text, add_special_tokens=False)["input_ids"]
    assert ids == tok.encode(text, add_special_tokens=False).ids and hf_tok.decode(ids) == text
    assert hf_tok.eos_token == "<|im_end|>"
    return text, nothink, ids


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="tests/data")
    args = ap.parse_args()
    torch.manual_seed(SEED)
    torch.use_deterministic_algorithms(True)
    out = args.out
    os.makedirs(out, exist_ok=True)
    for n in VARIANTS:
        shutil.rmtree(os.path.join(out, n), ignore_errors=True)
    tok = build_tokenizer()
    rng = np.random.default_rng(SEED)
    prompts = {str(n): rng.integers(0, VOCAB, n).tolist() for n in (1, 7, 70, 150)}
    cases = {"special_tokens": {s: tok.token_to_id(s) for s in SPECIALS}, "chat_messages": CHAT, "samples": [
        {"text": s, "ids": tok.encode(s, add_special_tokens=False).ids} for s in TOKENIZER_SAMPLES]}
    rows = []  # summary table
    for idx, (name, v) in enumerate(VARIANTS.items()):
        d = os.path.join(out, name)
        os.makedirs(d)
        gen = torch.Generator().manual_seed(SEED + idx)
        tok_ids = write_tokenizer(tok, d, v.get("template_file", False))
        built = build_checkpoint(name, v, d, tok_ids, gen).state_dict()
        text, text_nothink, ids_text = chat_prompt(d, tok)
        cases.update(chat_rendered=text, chat_rendered_no_thinking=text_nothink, chat_ids=ids_text)
        model = load_reference(d, v)
        for k, p in model.state_dict().items():  # the reloaded weights are exactly the ones written
            err = float((p - built[k].float()).abs().max() / built[k].float().abs().max())
            assert err < (0.07 if v["dtype"] == "fp8" else 1e-7), (name, k, err)  # fp8: < 1/16 of block max
        tcfg = model.config.get_text_config()
        g, checks = goldens(model, v, dict(prompts, text=ids_text), tcfg)
        if v.get("mtp"):
            g.update(mtp_goldens(model, d, prompts))
        np.savez_compressed(os.path.join(d, "goldens.npz"), **g)
        for k, x in checks.items():
            assert x < 1e-3 or "margin" in k, (name, k, x)
        meta = {"checkpoint": name, "layout": v["layout"], "dtype": v["dtype"], "tied": v["tied"],
                "seed": SEED, "torch": torch.__version__, "transformers": transformers.__version__,
                "command": "python tools/make_test_checkpoints.py --out tests/data",
                "reference": "transformers " + ("Qwen3_5ForConditionalGeneration" if v["layout"] == "wrapper" else
                                                "Qwen3_5ForCausalLM") + " float32, eager attention, torch fallbacks"
                + (" with DEQUANTIZED weights (fp8 * scale_inv in fp32)" if v["dtype"] == "fp8" else ""),
                "prompts": {k[7:-4]: len(g[k]) for k in g if k.startswith("prompt_") and k.endswith("_ids")},
                "prompt_text": text, "n_greedy": N_GREEDY, "split_at": SPLIT_AT if v.get("split") else None,
                "keys": sorted(g), "checks": checks, "layer_types": tcfg.layer_types}
        dump_json(meta, os.path.join(d, "meta.json"))
        files = sorted(os.listdir(d))
        size = sum(os.path.getsize(os.path.join(d, f)) for f in files)
        nparam = sum(p.numel() for p in model.parameters())
        rows.append((name, nparam, len(files), size, os.path.getsize(os.path.join(d, "goldens.npz"))))
    dump_json(cases, os.path.join(out, "tokenizer_cases.json"))
    for r in [("checkpoint", "params", "files", "bytes", "goldens")] + rows:
        print(f"{r[0]:20} {r[1]:>9} {r[2]:>5} {r[3]:>9} {r[4]:>9}")
    total = sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(out) for f in fs)
    print(f"total size of {out}: {total} bytes")


if __name__ == "__main__":
    main()
