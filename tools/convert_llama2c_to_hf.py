#!/usr/bin/env python3
"""Converts a llama2.c checkpoint (run.c format) to a Hugging Face Llama directory.

    python3 tools/convert_llama2c_to_hf.py CHECKPOINT.bin OUT_DIR [--dtype f32|bf16|f16]
                                           [--shards N]

Writes OUT_DIR/config.json (LlamaForCausalLM) and OUT_DIR/model.safetensors, or with
--shards N > 1, model-0000i-of-0000N.safetensors plus model.safetensors.index.json.
Python standard library only.

RoPE layouts: llama2.c rotates interleaved pairs (2i, 2i+1) within each head; Hugging Face
rotates (i, i + head_dim/2). So the rows of every q/k head are reordered (the permute() of
transformers' convert_llama_weights_to_hf.py): new_row[j] = old_row[2j] and
new_row[j + head_dim/2] = old_row[2j + 1] for j < head_dim/2. Attention scores are unchanged
because q and k get the same permutation.
"""

import argparse
import json
import os
import struct
import sys
from array import array

DTYPES = {
    "f32": ("F32", "float32", 4),
    "bf16": ("BF16", "bfloat16", 2),
    "f16": ("F16", "float16", 2),
}


def read_checkpoint(path):
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 28:
        raise SystemExit(f"{path}: too short for a llama2.c header ({len(data)} bytes)")
    dim, hidden, layers, heads, kv_heads, vocab, seq_len = struct.unpack("<7i", data[:28])
    tied = vocab > 0
    vocab = abs(vocab)
    if dim <= 0 or heads <= 0 or dim % heads or kv_heads <= 0 or heads % kv_heads:
        raise SystemExit(f"{path}: implausible header {dim, hidden, layers, heads, kv_heads}")
    weights = array("f")
    weights.frombytes(data[28:28 + (len(data) - 28) // 4 * 4])
    if sys.byteorder != "little":
        weights.byteswap()
    cfg = dict(dim=dim, hidden=hidden, layers=layers, heads=heads, kv_heads=kv_heads,
               vocab=vocab, seq_len=seq_len, tied=tied, head_dim=dim // heads)
    return cfg, weights


def split_weights(cfg, w):
    """Returns {llama2.c name: list of flat per-layer arrays or one array} in file order."""
    d, h, n_l, v = cfg["dim"], cfg["hidden"], cfg["layers"], cfg["vocab"]
    kv = cfg["kv_heads"] * cfg["head_dim"]
    pos = 0
    out = {}

    def take(count):
        nonlocal pos
        if pos + count > len(w):
            raise SystemExit("checkpoint is truncated")
        a = w[pos:pos + count]
        pos += count
        return a

    out["tok"] = take(v * d)
    for name, size in [("rms_att", d), ("wq", d * d), ("wk", kv * d), ("wv", kv * d),
                       ("wo", d * d), ("rms_ffn", d), ("w1", h * d), ("w2", d * h),
                       ("w3", h * d)]:
        out[name] = [take(size) for _ in range(n_l)]
    out["rms_final"] = take(d)
    take(cfg["seq_len"] * cfg["head_dim"] // 2)  # freq_cis_real
    take(cfg["seq_len"] * cfg["head_dim"] // 2)  # freq_cis_imag
    out["wcls"] = None if cfg["tied"] else take(v * d)
    return out


def permute_rows(mat, n_heads, head_dim, cols):
    """Interleaved-pair (llama2.c) row order -> half-split (Hugging Face) row order."""
    out = array("f")
    half = head_dim // 2
    for head in range(n_heads):
        base = head * head_dim
        order = [2 * j for j in range(half)] + [2 * j + 1 for j in range(half)]
        for r in order:
            start = (base + r) * cols
            out.extend(mat[start:start + cols])
    return out


def hf_tensors(cfg, t):
    """[(name, shape, float array)] in Hugging Face naming and layout."""
    d, h, v, hd = cfg["dim"], cfg["hidden"], cfg["vocab"], cfg["head_dim"]
    kv = cfg["kv_heads"] * hd
    res = [("model.embed_tokens.weight", [v, d], t["tok"])]
    for i in range(cfg["layers"]):
        p = f"model.layers.{i}."
        res += [
            (p + "input_layernorm.weight", [d], t["rms_att"][i]),
            (p + "self_attn.q_proj.weight", [d, d], permute_rows(t["wq"][i], cfg["heads"], hd, d)),
            (p + "self_attn.k_proj.weight", [kv, d],
             permute_rows(t["wk"][i], cfg["kv_heads"], hd, d)),
            (p + "self_attn.v_proj.weight", [kv, d], t["wv"][i]),
            (p + "self_attn.o_proj.weight", [d, d], t["wo"][i]),
            (p + "post_attention_layernorm.weight", [d], t["rms_ffn"][i]),
            (p + "mlp.gate_proj.weight", [h, d], t["w1"][i]),
            (p + "mlp.down_proj.weight", [d, h], t["w2"][i]),
            (p + "mlp.up_proj.weight", [h, d], t["w3"][i]),
        ]
    res.append(("model.norm.weight", [d], t["rms_final"]))
    if t["wcls"] is not None:
        res.append(("lm_head.weight", [v, d], t["wcls"]))
    return res


def encode(values, dtype):
    """Little-endian bytes of a float array in `dtype` (round to nearest even)."""
    if dtype == "f32":
        a = array("f", values)
        if sys.byteorder != "little":
            a.byteswap()
        return a.tobytes()
    if dtype == "f16":
        return struct.pack(f"<{len(values)}e", *values)
    bits = array("I")
    bits.frombytes(array("f", values).tobytes())
    out = array("H", [((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF for u in bits])
    if sys.byteorder != "little":
        out.byteswap()
    return out.tobytes()


def write_safetensors(path, tensors, dtype):
    st_dtype = DTYPES[dtype][0]
    header = {"__metadata__": {"format": "pt"}}
    blobs = []
    offset = 0
    for name, shape, values in tensors:
        blob = encode(values, dtype)
        header[name] = {"dtype": st_dtype, "shape": shape,
                        "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * ((8 - len(text) % 8) % 8)  # keep the data 8-byte aligned
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for blob in blobs:
            f.write(blob)
    return offset


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("checkpoint")
    ap.add_argument("out_dir")
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="f32")
    ap.add_argument("--shards", type=int, default=1)
    args = ap.parse_args()
    if args.shards < 1:
        raise SystemExit("--shards must be >= 1")

    cfg, weights = read_checkpoint(args.checkpoint)
    tensors = hf_tensors(cfg, split_weights(cfg, weights))
    os.makedirs(args.out_dir, exist_ok=True)
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": cfg["dim"],
        "intermediate_size": cfg["hidden"],
        "num_hidden_layers": cfg["layers"],
        "num_attention_heads": cfg["heads"],
        "num_key_value_heads": cfg["kv_heads"],
        "vocab_size": cfg["vocab"],
        "max_position_embeddings": cfg["seq_len"],
        "rope_theta": 10000.0,
        "rms_norm_eps": 1e-5,
        "hidden_act": "silu",
        "tie_word_embeddings": cfg["tied"],
        "bos_token_id": 1,
        "eos_token_id": 2,
        "torch_dtype": DTYPES[args.dtype][1],
    }
    with open(os.path.join(args.out_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
        f.write("\n")

    n = min(args.shards, len(tensors))
    if n == 1:
        write_safetensors(os.path.join(args.out_dir, "model.safetensors"), tensors, args.dtype)
    else:
        # Contiguous groups of about equal element counts.
        total = sum(len(t[2]) for t in tensors)
        groups = [[] for _ in range(n)]
        seen = 0
        for t in tensors:
            groups[min(n - 1, seen * n // total)].append(t)
            seen += len(t[2])
        groups = [g for g in groups if g]
        n = len(groups)
        weight_map = {}
        total_size = 0
        for i, group in enumerate(groups):
            name = f"model-{i + 1:05d}-of-{n:05d}.safetensors"
            total_size += write_safetensors(os.path.join(args.out_dir, name), group, args.dtype)
            for t in group:
                weight_map[t[0]] = name
        index = {"metadata": {"total_size": total_size}, "weight_map": weight_map}
        with open(os.path.join(args.out_dir, "model.safetensors.index.json"), "w") as f:
            json.dump(index, f, indent=2)
            f.write("\n")
    print(f"wrote {args.out_dir}: {len(tensors)} tensors, {args.dtype}, {n} file(s)")


if __name__ == "__main__":
    main()
