"""The default model: transformers' Qwen3_5ForCausalLM plus an MTP head in the released layout.

MTP (MODEL_SPEC.md §2-3, vLLM qwen3_5_mtp.py): from the main model's hidden state at position t
AFTER the final norm (vLLM's Qwen3_5Model.forward returns norm(h), and the proposer feeds that
output to the MTP) and the embedding of token t+1, predict token t+2:
    e = pre_fc_norm_embedding(embed(x[t+1])), c = pre_fc_norm_hidden(h[t])
    u = fc(concat(e, c))            # embedding half first
    u = layers.0(u)                 # one gated full-attention decoder layer, RoPE at position t
    logits = lm_head(norm(u))       # shares embed_tokens / lm_head with the main model
"""

import copy

import torch
import torch.nn.functional as F
from torch import nn
from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig
from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5DecoderLayer, Qwen3_5RMSNorm

# Design decision: hidden 384, 8 layers (3:1 GDN/attention), vocab 8192 is the shape NOTES.md's
# probe measured (~117K tokens/s on the H200); with the MTP layer it is 19.3M parameters,
# 38.5 MB in bf16, under the 40 MB budget for the shipped checkpoint.
PRESETS = {
    "default": dict(hidden_size=384, num_hidden_layers=8, intermediate_size=1024,
                    linear_num_key_heads=3, linear_num_value_heads=6, linear_key_head_dim=64,
                    linear_value_head_dim=64, num_attention_heads=6, num_key_value_heads=2, head_dim=64),
    "tiny": dict(hidden_size=64, num_hidden_layers=4, intermediate_size=128,
                 linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
                 linear_value_head_dim=16, num_attention_heads=4, num_key_value_heads=2, head_dim=16),
}
SPECIAL_IDS = {"eos": 2, "pad": 0}  # <|im_end|>, <|endoftext|> (train_tokenizer.py fixes the order)


def make_config(vocab_size: int, preset: str = "default", **overrides) -> Qwen3_5TextConfig:
    shape = dict(PRESETS[preset], **overrides)
    n_layers = shape["num_hidden_layers"]
    layer_types = ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(n_layers)]
    return Qwen3_5TextConfig(
        vocab_size=vocab_size, layer_types=layer_types, linear_conv_kernel_dim=4, hidden_act="silu",
        max_position_embeddings=32768, rms_norm_eps=1e-6, tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
        partial_rotary_factor=0.25, attention_bias=False, attention_dropout=0.0, initializer_range=0.02,
        bos_token_id=None, eos_token_id=SPECIAL_IDS["eos"], pad_token_id=SPECIAL_IDS["pad"],
        mtp_num_hidden_layers=1, use_cache=True, **shape)


class MTP(nn.Module):
    def __init__(self, config: Qwen3_5TextConfig):
        super().__init__()
        hidden, eps = config.hidden_size, config.rms_norm_eps
        layer_config = copy.deepcopy(config)
        layer_config.num_hidden_layers = 1
        layer_config.layer_types = ["full_attention"]
        self.pre_fc_norm_embedding = Qwen3_5RMSNorm(hidden, eps=eps)
        self.pre_fc_norm_hidden = Qwen3_5RMSNorm(hidden, eps=eps)
        self.fc = nn.Linear(2 * hidden, hidden, bias=False)
        self.layers = nn.ModuleList([Qwen3_5DecoderLayer(layer_config, 0)])
        self.norm = Qwen3_5RMSNorm(hidden, eps=eps)
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, std=config.initializer_range)

    def forward(self, hidden: torch.Tensor, next_embeds: torch.Tensor, position_embeddings) -> torch.Tensor:
        """hidden: final-normed main hidden [B, T, H] at t; next_embeds: embed(x[t+1]). Returns normed output."""
        u = self.fc(torch.cat([self.pre_fc_norm_embedding(next_embeds), self.pre_fc_norm_hidden(hidden)], dim=-1))
        u = self.layers[0](u, position_embeddings=position_embeddings, attention_mask=None)
        return self.norm(u)


class DefaultModel(nn.Module):
    """Main LM + MTP; state_dict() names are the released checkpoint's (model.*, mtp.*)."""

    def __init__(self, config: Qwen3_5TextConfig):
        super().__init__()
        config._attn_implementation = "sdpa"
        self.lm = Qwen3_5ForCausalLM(config)
        self.mtp = MTP(config)
        self.config = config

    def named_checkpoint_tensors(self):
        for name, tensor in self.lm.state_dict().items():
            if not (name == "lm_head.weight" and self.config.tie_word_embeddings):
                yield name, tensor
        for name, tensor in self.mtp.state_dict().items():
            yield "mtp." + name, tensor

    def load_checkpoint_tensors(self, tensors: dict):
        lm = {k: v for k, v in tensors.items() if not k.startswith("mtp.")}
        mtp = {k[4:]: v for k, v in tensors.items() if k.startswith("mtp.")}
        missing, unexpected = self.lm.load_state_dict(lm, strict=False)
        missing = [m for m in missing if not (m == "lm_head.weight" and self.config.tie_word_embeddings)]
        assert not missing and not unexpected, (missing, unexpected)
        self.mtp.load_state_dict(mtp, strict=True)
        self.lm.tie_weights()

    def forward(self, tokens: torch.Tensor):
        """tokens [B, T+2] -> (lm_loss, mtp_loss, lm_logits [B,T,V], mtp_logits [B,T,V])."""
        inputs, n = tokens[:, :-2], tokens.shape[1] - 2
        hidden = self.lm.model(input_ids=inputs, use_cache=False).last_hidden_state  # final-normed
        lm_logits = self.lm.lm_head(hidden)
        lm_loss = F.cross_entropy(lm_logits.float().flatten(0, 1), tokens[:, 1:n + 1].flatten())
        positions = torch.arange(n, device=tokens.device).view(1, 1, n).expand(3, tokens.shape[0], n)
        position_embeddings = self.lm.model.rotary_emb(hidden, positions)
        next_embeds = self.lm.model.embed_tokens(tokens[:, 1:n + 1])
        mtp_logits = self.lm.lm_head(self.mtp(hidden, next_embeds, position_embeddings))
        mtp_loss = F.cross_entropy(mtp_logits.float().flatten(0, 1), tokens[:, 2:].flatten())
        return lm_loss, mtp_loss, lm_logits, mtp_logits


def n_params(model: DefaultModel) -> int:
    return sum(t.numel() for _, t in model.named_checkpoint_tensors())
