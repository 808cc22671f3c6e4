#!/usr/bin/env python3
"""Exports a train.py checkpoint to a Hugging Face Llama directory that Recall loads.

    python3 tools/train/export_hf.py RUN/ckpt.pt OUT_DIR [--dtype f32|bf16|f16]
    build/cli/recall generate --model OUT_DIR --prompt "..." --temperature 0

Writes (conventions of tools/convert_llama2c_to_hf.py and worker/model/hf_loader.cc):
  config.json              LlamaForCausalLM; hidden_size, intermediate_size, heads, KV heads,
                           head_dim, vocab_size, max_position_embeddings (the training
                           context), rope_theta, rms_norm_eps, tie_word_embeddings, BOS 1, EOS 2
  model.safetensors        HF tensor names (model.embed_tokens.weight, model.layers.N.
                           self_attn.{q,k,v,o}_proj.weight, ...mlp.{gate,up,down}_proj.weight,
                           ...{input,post_attention}_layernorm.weight, model.norm.weight;
                           lm_head.weight only when untied), half-split RoPE rows as trained
                           (model.py already uses HF's layout: no permutation)
  tokenizer.model          the SentencePiece model. No tokenizer.json on purpose: Recall then
                           uses libsentencepiece and adds BOS to prompts, as in training
                           (worker/tokenizer/tokenizer.cc LoadTokenizer; cli/
                           generate_command.cc adds BOS when there is no tokenizer.json)
  tokenizer_config.json, special_tokens_map.json, generation_config.json  for transformers

The safetensors file is written here (the safetensors package is not needed): an 8-byte
little-endian header length, a JSON header {name: {dtype, shape, data_offsets}} padded with
spaces to 8 bytes, then the raw little-endian tensors. --check reads it back and compares.
"""

import argparse
import json
import os
import shutil
import struct
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model import Config  # noqa: E402

DTYPES = {"f32": ("F32", torch.float32, "float32"), "bf16": ("BF16", torch.bfloat16, "bfloat16"),
          "f16": ("F16", torch.float16, "float16")}
ST_TO_TORCH = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}


def tensor_bytes(t):
    t = t.detach().contiguous().cpu()
    if t.dtype in (torch.bfloat16, torch.float16):
        raw = t.view(torch.int16).numpy()
    else:
        raw = t.numpy()
    if sys.byteorder != "little":
        raw = raw.byteswap()
    return raw.tobytes()


def write_safetensors(path, tensors, dtype):
    """tensors: [(name, torch tensor)] written in `dtype`."""
    st_dtype, torch_dtype, _ = DTYPES[dtype]
    header = {"__metadata__": {"format": "pt"}}
    blobs, offset = [], 0
    for name, t in tensors:
        blob = tensor_bytes(t.to(torch_dtype))
        header[name] = {"dtype": st_dtype, "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for blob in blobs:
            f.write(blob)
    return 8 + len(text) + offset


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    base = 8 + n
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        a, b = meta["data_offsets"]
        dt = ST_TO_TORCH[meta["dtype"]]
        buf = bytearray(data[base + a:base + b])
        if dt == torch.float32:
            t = torch.frombuffer(buf, dtype=torch.float32)
        else:
            t = torch.frombuffer(buf, dtype=torch.int16).view(dt)
        out[name] = t.reshape(meta["shape"]).clone()
    return out


def hf_tensors(state, cfg):
    names = ["model.embed_tokens.weight"]
    for i in range(cfg.n_layers):
        p = f"model.layers.{i}."
        names += [p + "input_layernorm.weight", p + "self_attn.q_proj.weight",
                  p + "self_attn.k_proj.weight", p + "self_attn.v_proj.weight",
                  p + "self_attn.o_proj.weight", p + "post_attention_layernorm.weight",
                  p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight", p + "mlp.down_proj.weight"]
    names.append("model.norm.weight")
    if not cfg.tie_embeddings:
        names.append("lm_head.weight")
    extra = set(state) - set(names) - {"lm_head.weight"}
    assert not extra, f"unexpected tensors in the checkpoint: {sorted(extra)}"
    return [(n, state[n].float()) for n in names]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("checkpoint")
    ap.add_argument("out_dir")
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="f32")
    ap.add_argument("--tokenizer", help="tokenizer.model (default: the one the run used)")
    ap.add_argument("--check", action="store_true", help="read the file back and compare")
    args = ap.parse_args()

    # weights_only=False: PyTorch >= 2.6 defaults to True; the checkpoint is our own.
    ckpt = torch.load(args.checkpoint, map_location="cpu", weights_only=False)
    cfg = Config(**ckpt["config"])
    tok_path = args.tokenizer or ckpt["tokenizer"]
    os.makedirs(args.out_dir, exist_ok=True)
    tensors = hf_tensors(ckpt["model"], cfg)
    size = write_safetensors(os.path.join(args.out_dir, "model.safetensors"), tensors, args.dtype)
    with open(os.path.join(args.out_dir, "config.json"), "w") as f:
        json.dump(cfg.hf_config(DTYPES[args.dtype][2]), f, indent=2)
        f.write("\n")
    shutil.copyfile(tok_path, os.path.join(args.out_dir, "tokenizer.model"))
    specials = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
    with open(os.path.join(args.out_dir, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "LlamaTokenizer", "add_bos_token": True,
                   "add_eos_token": False, "legacy": False, "add_prefix_space": False,
                   "model_max_length": cfg.max_seq_len, "clean_up_tokenization_spaces": False,
                   **specials}, f, indent=2)
        f.write("\n")
    with open(os.path.join(args.out_dir, "special_tokens_map.json"), "w") as f:
        json.dump(specials, f, indent=2)
        f.write("\n")
    with open(os.path.join(args.out_dir, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": 1, "eos_token_id": 2, "do_sample": False}, f, indent=2)
        f.write("\n")
    # What train.py --init-from needs to continue from this export (a device machine given
    # back loses the full checkpoint; the export is small enough to come back).
    with open(os.path.join(args.out_dir, "training.json"), "w") as f:
        json.dump({"config": ckpt["config"], "step": ckpt["step"],
                   "trained_s": ckpt.get("trained_s", 0.0),
                   "args": ckpt.get("args", {})}, f, indent=2)
        f.write("\n")
    n_params = sum(t.numel() for _, t in tensors)
    print(f"wrote {args.out_dir}: {len(tensors)} tensors, {n_params:,} parameters, "
          f"{args.dtype}, model.safetensors {size:,} bytes (step {ckpt['step']})")
    if args.check:
        back = read_safetensors(os.path.join(args.out_dir, "model.safetensors"))
        assert list(back) == [n for n, _ in tensors]
        tol = 0 if args.dtype == "f32" else 1e-2
        for n, t in tensors:
            assert back[n].shape == t.shape, n
            err = (back[n].float() - t).abs().max().item()
            assert err <= tol * max(1.0, t.abs().max().item()), (n, err)
        print("check: read back, names, shapes and values match")


if __name__ == "__main__":
    main()
