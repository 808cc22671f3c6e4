#!/usr/bin/env python3
"""Converts a llama2.c checkpoint (run.c format) to a Hugging Face Llama directory.

    python3 tools/convert_llama2c_to_hf.py CHECKPOINT.bin OUT_DIR [--dtype f32|bf16|f16|fp8]
                                           [--fp8-block N] [--shards N]

Writes OUT_DIR/config.json (LlamaForCausalLM) and OUT_DIR/model.safetensors, or with
--shards N > 1, model-0000i-of-0000N.safetensors plus model.safetensors.index.json.
Python standard library only.

--dtype fp8 writes an FP8 checkpoint the way published ones are laid out (Hugging Face's
fine-grained FP8, quant_method "fp8"): every linear layer's weight as F8_E4M3 (E4M3FN: max
448, no infinities) with a float32 `weight_scale_inv` of one scale per --fp8-block x
--fp8-block block (default 128; weight = e4m3 value * scale), the embeddings, LM head and
norms in bf16, and config.json's quantization_config naming the block size.

RoPE layouts: llama2.c rotates interleaved pairs (2i, 2i+1) within each head; Hugging Face
rotates (i, i + head_dim/2). So the rows of every q/k head are reordered (the permute() of
transformers' convert_llama_weights_to_hf.py): new_row[j] = old_row[2j] and
new_row[j + head_dim/2] = old_row[2j + 1] for j < head_dim/2. Attention scores are unchanged
because q and k get the same permutation.
"""

import argparse
import json
import math
import os
import struct
import sys
from array import array

DTYPES = {
    "f32": ("F32", "float32", 4),
    "bf16": ("BF16", "bfloat16", 2),
    "f16": ("F16", "float16", 2),
    "fp8": ("F8_E4M3", "bfloat16", 1),
}

E4M3_MAX = 448.0


def e4m3_code(x):
    """The E4M3FN byte nearest to x (round to nearest even; |x| > 448 saturates)."""
    sign = 0x80 if math.copysign(1.0, x) < 0 else 0
    a = abs(x)
    if a == 0:
        return sign
    if a >= E4M3_MAX:
        return sign | 0x7E
    f, e = math.frexp(a)  # a = f * 2**e, 0.5 <= f < 1
    u = e - 1             # a = (2f) * 2**u
    if u < -6:            # subnormal: m * 2**-9, m <= 8 (8 is the smallest normal's code)
        return sign | round(a * 512.0)
    m = round((2.0 * f - 1.0) * 8.0)
    if m == 8:
        m, u = 0, u + 1
    if u > 8 or (u == 8 and m == 7):
        return sign | 0x7E
    return sign | ((u + 7) << 3) | m


def e4m3_blocks(values, rows, cols, block):
    """(codes, scales): values [rows, cols] in E4M3 with one float32 scale per block x block
    block (scale = max |w| / 448 over the block; weight = e4m3 * scale)."""
    brs, bcs = -(-rows // block), -(-cols // block)
    scales = array("f", [0.0] * (brs * bcs))
    for br in range(brs):
        for bc in range(bcs):
            most = 0.0
            for r in range(br * block, min(rows, (br + 1) * block)):
                row = values[r * cols + bc * block:r * cols + min(cols, (bc + 1) * block)]
                most = max(most, max(abs(v) for v in row))
            scales[br * bcs + bc] = most / E4M3_MAX if most > 0 else 1.0
    codes = bytearray(rows * cols)
    for r in range(rows):
        for c in range(cols):
            codes[r * cols + c] = e4m3_code(values[r * cols + c] / scales[(r // block) * bcs +
                                                                           c // block])
    return bytes(codes), scales


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


def as_stored(tensors, dtype, block):
    """[(name, shape, values, dtype)]: with fp8, linear weights in E4M3 plus their scales
    (float32) and everything else in bf16; otherwise every tensor in `dtype`."""
    if dtype != "fp8":
        return [(n, shape, v, dtype) for n, shape, v in tensors]
    out = []
    for name, shape, values in tensors:
        if name.endswith("_proj.weight"):
            codes, scales = e4m3_blocks(values, shape[0], shape[1], block)
            out.append((name, shape, codes, "fp8"))
            out.append((name + "_scale_inv", [-(-shape[0] // block), -(-shape[1] // block)],
                        scales, "f32"))
        else:
            out.append((name, shape, values, "bf16"))
    return out


def write_safetensors(path, tensors):
    header = {"__metadata__": {"format": "pt"}}
    blobs = []
    offset = 0
    for name, shape, values, dtype in tensors:
        blob = values if dtype == "fp8" else encode(values, dtype)
        header[name] = {"dtype": DTYPES[dtype][0], "shape": shape,
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
    ap.add_argument("--fp8-block", type=int, default=None)
    ap.add_argument("--shards", type=int, default=1)
    args = ap.parse_args()
    if args.shards < 1:
        raise SystemExit("--shards must be >= 1")
    if args.fp8_block is not None and args.dtype != "fp8":
        raise SystemExit("--fp8-block: only with --dtype fp8 (its block scales)")
    if args.fp8_block is None:
        args.fp8_block = 128
    # The loader's limit (quantization_config.weight_block_size, worker/model/hf_config.cc).
    if not 1 <= args.fp8_block <= 1 << 20:
        raise SystemExit(f"--fp8-block must be in [1, {1 << 20}], got {args.fp8_block}")

    cfg, weights = read_checkpoint(args.checkpoint)
    tensors = as_stored(hf_tensors(cfg, split_weights(cfg, weights)), args.dtype, args.fp8_block)
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
    if args.dtype == "fp8":
        config["quantization_config"] = {
            "quant_method": "fp8",
            "fmt": "e4m3",
            "activation_scheme": "dynamic",
            "weight_block_size": [args.fp8_block, args.fp8_block],
        }
    with open(os.path.join(args.out_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
        f.write("\n")

    n = min(args.shards, len(tensors))
    if n == 1:
        write_safetensors(os.path.join(args.out_dir, "model.safetensors"), tensors)
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
            total_size += write_safetensors(os.path.join(args.out_dir, name), group)
            for t in group:
                weight_map[t[0]] = name
        index = {"metadata": {"total_size": total_size}, "weight_map": weight_map}
        with open(os.path.join(args.out_dir, "model.safetensors.index.json"), "w") as f:
            json.dump(index, f, indent=2)
            f.write("\n")
    print(f"wrote {args.out_dir}: {len(tensors)} tensors, {args.dtype}, {n} file(s)")


if __name__ == "__main__":
    main()
