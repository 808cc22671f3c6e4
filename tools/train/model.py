#!/usr/bin/env python3
"""A Llama-architecture decoder in PyTorch, laid out like Hugging Face's LlamaForCausalLM.

RMSNorm (pre-norm), rotary embeddings in the half-split layout (HF's rotate_half), SwiGLU MLP,
grouped-query attention (query head h uses KV head h // (n_heads / n_kv_heads), as HF's
repeat_kv), no biases, optionally tied embeddings. Parameter names equal HF's, so the
exported model.safetensors is this state_dict (see export_hf.py) and Recall's
worker/model/hf_loader.cc reads it unchanged.

Runs on PyTorch 1.13 (Debian's python3-torch: manual attention) and 2.x (fused
scaled_dot_product_attention).

    python3 tools/train/model.py --dim 256 --layers 8 --heads 8 --kv-heads 2 --hidden 1024
prints the parameter count of a configuration.
"""

import argparse
import dataclasses
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclasses.dataclass
class Config:
    vocab_size: int = 2048
    dim: int = 256
    n_layers: int = 8
    n_heads: int = 8
    n_kv_heads: int = 2
    hidden_dim: int = 1024
    max_seq_len: int = 4096
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    tie_embeddings: bool = True

    @property
    def head_dim(self):
        return self.dim // self.n_heads

    def validate(self):
        assert self.dim % self.n_heads == 0, "n_heads must divide dim"
        assert self.n_heads % self.n_kv_heads == 0, "n_kv_heads must divide n_heads"
        assert self.head_dim % 2 == 0, "head_dim must be even (RoPE)"

    def hf_config(self, torch_dtype="float32", bos=1, eos=2):
        """config.json for Recall's hf_config.cc (and transformers)."""
        return {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "hidden_size": self.dim,
            "intermediate_size": self.hidden_dim,
            "num_hidden_layers": self.n_layers,
            "num_attention_heads": self.n_heads,
            "num_key_value_heads": self.n_kv_heads,
            "head_dim": self.head_dim,
            "vocab_size": self.vocab_size,
            "max_position_embeddings": self.max_seq_len,
            "rope_theta": self.rope_theta,
            "rms_norm_eps": self.norm_eps,
            "hidden_act": "silu",
            "attention_bias": False,
            "mlp_bias": False,
            "tie_word_embeddings": self.tie_embeddings,
            "bos_token_id": bos,
            "eos_token_id": eos,
            "torch_dtype": torch_dtype,
        }


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rope_tables(cfg, positions, device):
    """cos, sin of shape [T, head_dim] for integer `positions` (HF's default RoPE)."""
    hd = cfg.head_dim
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, hd, 2, device=device, dtype=torch.float32) / hd))
    freqs = positions.float()[:, None] * inv[None, :]
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos(), emb.sin()


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat([-x[..., h:], x[..., :h]], dim=-1)


def apply_rope(x, cos, sin):  # x [B, H, T, hd]
    return (x.float() * cos + rotate_half(x.float()) * sin).to(x.dtype)


class Attention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        hd = cfg.head_dim
        self.q_proj = nn.Linear(cfg.dim, cfg.n_heads * hd, bias=False)
        self.k_proj = nn.Linear(cfg.dim, cfg.n_kv_heads * hd, bias=False)
        self.v_proj = nn.Linear(cfg.dim, cfg.n_kv_heads * hd, bias=False)
        self.o_proj = nn.Linear(cfg.n_heads * hd, cfg.dim, bias=False)

    def forward(self, x, cos, sin, cache=None):
        """x [B, T, D]; cache: None or dict with "k", "v" [B, Hkv, S, hd] (appended to)."""
        B, T, _ = x.shape
        c = self.cfg
        hd = c.head_dim
        q = self.q_proj(x).view(B, T, c.n_heads, hd).transpose(1, 2)
        k = self.k_proj(x).view(B, T, c.n_kv_heads, hd).transpose(1, 2)
        v = self.v_proj(x).view(B, T, c.n_kv_heads, hd).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        past = 0
        if cache is not None:
            if "k" in cache:
                past = cache["k"].shape[2]
                k = torch.cat([cache["k"], k], dim=2)
                v = torch.cat([cache["v"], v], dim=2)
            cache["k"], cache["v"] = k, v
        rep = c.n_heads // c.n_kv_heads
        if rep > 1:
            k = k.repeat_interleave(rep, dim=1)
            v = v.repeat_interleave(rep, dim=1)
        S = k.shape[2]
        if hasattr(F, "scaled_dot_product_attention"):
            if past == 0:
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                mask = torch.ones(T, S, dtype=torch.bool, device=x.device).tril(past)
                y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
            mask = torch.ones(T, S, dtype=torch.bool, device=x.device).tril(past)
            att = att.masked_fill(~mask, float("-inf"))
            y = torch.softmax(att.float(), dim=-1).to(q.dtype) @ v
        return self.o_proj(y.transpose(1, 2).reshape(B, T, c.n_heads * hd))


class MLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.dim, cfg.hidden_dim, bias=False)
        self.up_proj = nn.Linear(cfg.dim, cfg.hidden_dim, bias=False)
        self.down_proj = nn.Linear(cfg.hidden_dim, cfg.dim, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x, cos, sin, cache=None):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, cache)
        return x + self.mlp(self.post_attention_layernorm(x))


class Decoder(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)


class LlamaForCausalLM(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        cfg.validate()
        self.cfg = cfg
        self.model = Decoder(cfg)
        self.lm_head = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.apply(self._init)
        # Scaled init of the residual projections (GPT-2 / llama2.c style).
        for name, p in self.named_parameters():
            if name.endswith("o_proj.weight") or name.endswith("down_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layers))

    @staticmethod
    def _init(m):
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)

    def num_params(self):
        return sum(p.numel() for p in self.parameters())

    def forward(self, tokens, caches=None, start_pos=0):
        """tokens [B, T] -> logits [B, T, V] (fp32). caches: per-layer dicts for decoding."""
        T = tokens.shape[1]
        pos = torch.arange(start_pos, start_pos + T, device=tokens.device)
        cos, sin = rope_tables(self.cfg, pos, tokens.device)
        x = self.model.embed_tokens(tokens)
        for i, layer in enumerate(self.model.layers):
            x = layer(x, cos, sin, None if caches is None else caches[i])
        x = self.model.norm(x)
        return self.lm_head(x).float()

    @torch.no_grad()
    def generate(self, prompt, max_new_tokens, stop_ids=()):
        """Greedy decoding of one prompt (list of ids) with a KV cache; returns new ids."""
        self.eval()
        dev = next(self.parameters()).device
        caches = [dict() for _ in self.model.layers]
        logits = self.forward(torch.tensor([prompt], device=dev), caches, 0)
        out, pos = [], len(prompt)
        for _ in range(max_new_tokens):
            nxt = int(logits[0, -1].argmax())
            if nxt in stop_ids:
                break
            out.append(nxt)
            if pos >= self.cfg.max_seq_len:
                break
            logits = self.forward(torch.tensor([[nxt]], device=dev), caches, pos)
            pos += 1
        return out


def add_config_args(ap):
    d = Config()
    ap.add_argument("--vocab", type=int, default=d.vocab_size)
    ap.add_argument("--dim", type=int, default=d.dim)
    ap.add_argument("--layers", type=int, default=d.n_layers)
    ap.add_argument("--heads", type=int, default=d.n_heads)
    ap.add_argument("--kv-heads", type=int, default=d.n_kv_heads)
    ap.add_argument("--hidden", type=int, default=d.hidden_dim)
    ap.add_argument("--context", type=int, default=d.max_seq_len)
    ap.add_argument("--rope-theta", type=float, default=d.rope_theta)
    ap.add_argument("--untied", action="store_true", help="a separate lm_head")


def config_from_args(args, vocab_size=None):
    return Config(vocab_size=vocab_size or args.vocab, dim=args.dim, n_layers=args.layers,
                  n_heads=args.heads, n_kv_heads=args.kv_heads, hidden_dim=args.hidden,
                  max_seq_len=args.context, rope_theta=args.rope_theta,
                  tie_embeddings=not args.untied)


def main():
    ap = argparse.ArgumentParser(description="Parameter count of a configuration.")
    add_config_args(ap)
    cfg = config_from_args(ap.parse_args())
    m = LlamaForCausalLM(cfg)
    print(f"{cfg}\nparameters: {m.num_params():,}")


if __name__ == "__main__":
    main()
