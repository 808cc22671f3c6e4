#!/usr/bin/env python3
"""Baseline GPU decode benchmark: PyTorch + Hugging Face transformers (eager, sdpa).

Random bf16 weights of real model shapes, one CUDA GPU, nothing downloaded.
Per (shape, batch, context): a DynamicCache is pre-filled with random K/V of
`context` tokens (no prefill), then greedy one-token decode steps are timed.

  python3 bench/gpu/hf_decode.py --out-json /tmp/hf.json
  python3 bench/gpu/hf_decode.py --check          # tiny sanity run

Note on SDPA backends: with torch's defaults on Hopper (torch 2.11), SDPA may pick
the cuDNN backend, which builds a new cuDNN graph for every new KV length, i.e.
every decode step (~1.3 ms/layer of CPU time the first time a shape is seen).
That is what a real HF eager decode loop pays, but it dominates small models.
`--no-cudnn-sdpa` disables that backend (flash / mem-efficient are used instead).
"""
import argparse, gc, inspect, json, statistics, sys, time

import torch
import transformers
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

# name -> (config class, model class, config kwargs, rope_theta)
SHAPES = {
    "smollm2-135m": (LlamaConfig, LlamaForCausalLM, dict(
        hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
        num_key_value_heads=3, head_dim=64, vocab_size=49152, rms_norm_eps=1e-5,
        tie_word_embeddings=True, max_position_embeddings=16384), 100000.0),
    "qwen2.5-0.5b": (Qwen2Config, Qwen2ForCausalLM, dict(  # qkv bias is built into Qwen2
        hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
        num_key_value_heads=2, vocab_size=151936, rms_norm_eps=1e-6,
        tie_word_embeddings=True, max_position_embeddings=32768), 1000000.0),
    "llama-3-8b": (LlamaConfig, LlamaForCausalLM, dict(
        hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=8, head_dim=128, vocab_size=128256, rms_norm_eps=1e-5,
        tie_word_embeddings=False, max_position_embeddings=16384), 500000.0),
}


def make_config(name):
    cfg_cls, _, kw, theta = SHAPES[name]
    kw = dict(kw, attn_implementation="sdpa", use_cache=True)
    # transformers 5.x moved rope_theta into `rope_parameters`; 4.x takes `rope_theta`.
    if "rope_parameters" in inspect.signature(cfg_cls.__init__).parameters:
        kw["rope_parameters"] = {"rope_type": "default", "rope_theta": theta}
    else:
        kw["rope_theta"] = theta
    return cfg_cls(**kw)


def build_model(name, cfg):
    # Init directly on the GPU in bf16 (fast even for 8B; no CPU init, no checkpoint).
    prev = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device("cuda"):
            model = SHAPES[name][1](cfg)
    finally:
        torch.set_default_dtype(prev)
    if any(p.dtype != torch.bfloat16 for p in model.parameters()):
        model.to(torch.bfloat16)
    return model.eval()


def is_oom(e):
    return isinstance(e, torch.cuda.OutOfMemoryError) or (
        isinstance(e, RuntimeError) and "out of memory" in str(e).lower())


def free_gpu():
    gc.collect()
    torch.cuda.empty_cache()


def make_cache(cfg, batch, context):
    """DynamicCache holding `context` random tokens of K/V in every layer."""
    try:
        cache = DynamicCache(config=cfg)  # transformers >= 4.56 / 5.x
    except TypeError:
        cache = DynamicCache()  # older API: layers are appended lazily by update()
    kv = cfg.num_key_value_heads
    hd = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    for layer in range(cfg.num_hidden_layers):
        k = torch.randn(batch, kv, context, hd, dtype=torch.bfloat16, device="cuda")
        v = torch.randn(batch, kv, context, hd, dtype=torch.bfloat16, device="cuda")
        cache.update(k, v, layer)  # Cache.update(key_states, value_states, layer_idx)
        del k, v
    return cache


def run_config(model, cfg, batch, context, steps, warmup):
    """Returns (median step ms, cache length after the run)."""
    torch.cuda.reset_peak_memory_stats()
    cache = make_cache(cfg, batch, context)
    ids = torch.randint(0, cfg.vocab_size, (batch, 1), device="cuda")
    times = []
    for i in range(warmup + steps):
        # Position continues after the `context` cached tokens; cache_position is
        # derived by the model from cache.get_seq_length(), which equals `pos` here.
        pos = torch.full((batch, 1), context + i, dtype=torch.long, device="cuda")
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        out = model(input_ids=ids, position_ids=pos, past_key_values=cache, use_cache=True)
        ids = out.logits[:, -1, :].argmax(dim=-1, keepdim=True)  # greedy, stays on GPU
        end.record()
        del out
        if i >= warmup:
            times.append((start, end))
    torch.cuda.synchronize()
    ms = statistics.median(s.elapsed_time(e) for s, e in times)
    seq = cache.get_seq_length()
    del cache, ids
    return ms, seq


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--batches", default="1,16,64")
    ap.add_argument("--contexts", default="1024,8192")
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--warmup", type=int, default=4)
    ap.add_argument("--out-json")
    ap.add_argument("--max-seconds", type=float, default=240.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-cudnn-sdpa", action="store_true", help="disable the cuDNN SDPA backend")
    ap.add_argument("--check", action="store_true", help="smollm2-135m, batch 2, ctx 16, 3 steps")
    a = ap.parse_args()
    if a.check:
        a.shapes, a.batches, a.contexts, a.steps, a.warmup = "smollm2-135m", "2", "16", 3, 1
    shapes = [s.strip() for s in a.shapes.split(",") if s.strip()]
    batches = [int(x) for x in a.batches.split(",") if x.strip()]
    contexts = [int(x) for x in a.contexts.split(",") if x.strip()]
    for s in shapes:
        if s not in SHAPES:
            sys.exit(f"unknown shape {s!r}; known: {', '.join(SHAPES)}")
    if not torch.cuda.is_available():
        sys.exit("CUDA is not available")

    torch.manual_seed(a.seed)
    if a.no_cudnn_sdpa:
        torch.backends.cuda.enable_cudnn_sdp(False)
    sdpa = {k: getattr(torch.backends.cuda, k + "_sdp_enabled", lambda: None)()
            for k in ("cudnn", "flash", "mem_efficient", "math")}
    t0 = time.monotonic()
    dev = torch.cuda.get_device_name(0)
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, {dev}, sdpa {sdpa}",
          flush=True)
    results, attn_impl, ok = [], None, True

    def record(shape, b, c, status, ms=None, peak=None):
        r = {"shape": shape, "batch": b, "context": c, "status": status, "step_ms": ms,
             "tokens_per_s": (b / (ms / 1000.0)) if ms else None, "peak_gib": peak}
        results.append(r)
        if status == "ok":
            print(f"hf {shape} batch {b} ctx {c}: {ms:.2f} ms/step, {r['tokens_per_s']:.0f} tok/s, "
                  f"peak {peak:.1f} GiB", flush=True)
        else:
            print(f"hf {shape} batch {b} ctx {c}: {status}", flush=True)

    with torch.inference_mode():
        for shape in shapes:
            grid = [(b, c) for b in batches for c in contexts]
            if time.monotonic() - t0 > a.max_seconds:
                for b, c in grid:
                    record(shape, b, c, "skipped")
                continue
            cfg, model = make_config(shape), None
            try:
                tb = time.monotonic()
                model = build_model(shape, cfg)
                attn_impl = getattr(model.config, "_attn_implementation", None)
                print(f"built {shape} in {time.monotonic() - tb:.1f}s (attn {attn_impl})", flush=True)
            except Exception as e:  # OOM while building: every config of this shape is oom
                if not is_oom(e):
                    raise
            if model is None:
                free_gpu()
                for b, c in grid:
                    record(shape, b, c, "oom")
                continue
            for b, c in grid:
                if time.monotonic() - t0 > a.max_seconds:
                    record(shape, b, c, "skipped")
                    continue
                res = None
                try:
                    res = run_config(model, cfg, b, c, a.steps, a.warmup)
                except Exception as e:
                    if not is_oom(e):
                        raise
                # Free outside the except block so the traceback (and its frames'
                # tensors) is gone before empty_cache().
                peak = torch.cuda.max_memory_allocated() / 2**30
                free_gpu()
                if res is None:
                    record(shape, b, c, "oom")
                    continue
                ms, seq = res
                record(shape, b, c, "ok", ms, peak)
                if seq != c + a.warmup + a.steps:  # each step must append exactly one token
                    print(f"WARNING: cache length {seq}, expected {c + a.warmup + a.steps}", flush=True)
                    ok = False
            del model
            free_gpu()

    out = {"torch": torch.__version__, "transformers": transformers.__version__, "device": dev,
           "attn_implementation": attn_impl, "sdpa_backends": sdpa, "steps": a.steps, "warmup": a.warmup, "results": results}
    if a.out_json:
        with open(a.out_json, "w") as f:
            json.dump(out, f, indent=2)
        print(f"wrote {a.out_json}", flush=True)
    if a.check and not (ok and results and all(r["status"] == "ok" for r in results)):
        sys.exit("check FAILED")
    print(f"done in {time.monotonic() - t0:.1f}s", flush=True)


if __name__ == "__main__":
    main()
