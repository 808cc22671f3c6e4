#!/usr/bin/env python3
"""Sets recall's GPU decode results (recall_gpu_decode_bench --out-json) beside transformers'
(hf_decode.py --out-json) measured on the same device: tokens/s of each, their ratio, and
recall's fraction of the HBM roofline, with the issue's targets marked.

  python3 bench/gpu/report.py RECALL_JSON HF_JSON
"""
import json
import sys


def main():
    recall = json.load(open(sys.argv[1]))
    hf = json.load(open(sys.argv[2])) if len(sys.argv) > 2 else {"results": []}
    base = {(r["shape"], r["batch"], r["context"]): r for r in hf.get("results", [])}
    print(f"device: {recall['device']}; copy bandwidth {recall['copy_gbs']:.0f} GB/s; "
          f"transformers {hf.get('transformers', '?')} (torch {hf.get('torch', '?')}, "
          f"sdpa backends {hf.get('sdpa_backends', '?')})")
    print(f"{'shape':14} {'batch':>5} {'ctx':>5} {'recall tok/s':>12} {'% roofline':>10} "
          f"{'hf tok/s':>10} {'recall/hf':>9}  target")
    for r in recall["results"]:
        key = (r["shape"], r["batch"], r["context"])
        h = base.get(key)
        if r["status"] != "ok":
            print(f"{r['shape']:14} {r['batch']:5} {r['context']:5} {r['status']}")
            continue
        hf_tps = h["tokens_per_s"] if h and h.get("status") == "ok" else None
        ratio = r["tokens_per_s"] / hf_tps if hf_tps else None
        target = ""
        if r["batch"] == 1:
            target = "roofline >= 70%: " + ("met" if r["roofline_fraction"] >= 0.7 else "MISSED")
        elif r["batch"] == 16 and ratio is not None:
            target = ">= 1.5x hf: " + ("met" if ratio >= 1.5 else "MISSED")
        print(f"{r['shape']:14} {r['batch']:5} {r['context']:5} {r['tokens_per_s']:12.0f} "
              f"{100 * r['roofline_fraction']:9.0f}% "
              f"{(f'{hf_tps:10.0f}' if hf_tps else '         -')} "
              f"{(f'{ratio:8.2f}x' if ratio else '        -')}  {target}")
    for shape in ("smollm2-135m", "llama-3-8b"):
        x = recall.get(shape)
        if x:
            over = x["lazy_ms"] / x["lazy_full_ms"] - 1
            print(f"{shape}: lazy step {x['lazy_ms']:.3f} ms vs FullKV {x['lazy_full_ms']:.3f} ms "
                  f"-> overhead {100 * over:.1f}% (target <= 5%: {'met' if over <= 0.05 else 'MISSED'}); "
                  f"8K sessions that fit: FullKV {x['sessions_full']}, lazy 30% {x['sessions_lazy30']}")


if __name__ == "__main__":
    main()
