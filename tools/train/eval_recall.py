#!/usr/bin/env python3
"""Held-out question accuracy of an exported model, through Recall's runtime and PyTorch.

    python3 tools/train/eval_recall.py --model OUT_DIR --convs 50 --questions 4 \
        --modes full,window,streaming --budget 512 --out results.json

For each held-out conversation (gen_conversations.py held-out seeds, --min-tokens to
--max-tokens tokens) and each of its first --questions questions, the prompt
"<conversation>[Questions]\\nQ: <question>\\nA:" goes to

    recall generate --model OUT_DIR --prompt PROMPT --temperature 0 --max-tokens 8 \
        --stop '\\n' --threads 1 [policy flags]

and the answer is right when the generated text, stripped of spaces and a final period,
equals the answer entity (case-insensitive). Modes:
  full       --policy full: the whole conversation in the KV cache.
  window     the prompt cut to its last lines that fit --budget tokens with BOS (cut at a line
             start), --policy full: what a cache holding only the last N tokens can answer.
  streaming  (any other name: a Recall policy) --policy NAME --budget N on the whole prompt.
             NOTE: `recall generate` prefills the whole prompt with full attention and evicts
             only while decoding (worker/offline/generator.h GenerateOptions::eviction,
             worker/offline/sequence.cc LocalSequence::Prefill/Decode), so the first answer
             token still sees everything: streaming scores far above "window".
PyTorch side (--torch, default on): the exported safetensors loaded into model.py, greedy
decoding, modes full and window; the report gives its accuracy and its agreement with Recall.
"""

import argparse
import collections
import concurrent.futures
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen_conversations as gen  # noqa: E402
from tok import load_tokenizer  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def normalize(s):
    s = s.strip().rstrip(".").strip()
    return " ".join(s.split()).casefold()


def window_prompt(tk, prompt, budget):
    """The prompt's last lines that fit `budget` tokens together with BOS."""
    lines = prompt.split("\n")
    kept, used = [], 1
    for i in range(len(lines) - 1, -1, -1):
        n = len(tk.encode(lines[i])) + (1 if i < len(lines) - 1 else 0)
        if used + n > budget:
            break
        kept.append(lines[i])
        used += n
    return "\n".join(reversed(kept)), used


def run_recall(args, prompt, policy_args):
    cmd = [args.recall, "generate", "--model", args.model, "--prompt", prompt,
           "--temperature", "0", "--max-tokens", str(args.max_new_tokens), "--stop", "\n",
           "--threads", str(args.threads), "--seed", "1"] + policy_args
    t = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"recall generate failed ({p.returncode}): {p.stderr.strip()[-2000:]}")
    out = p.stdout[:-1] if p.stdout.endswith("\n") else p.stdout  # std::endl after the text
    return out, time.time() - t


def load_torch_model(model_dir):
    import torch
    from export_hf import read_safetensors
    from model import Config, LlamaForCausalLM
    with open(os.path.join(model_dir, "config.json")) as f:
        c = json.load(f)
    cfg = Config(vocab_size=c["vocab_size"], dim=c["hidden_size"],
                 n_layers=c["num_hidden_layers"], n_heads=c["num_attention_heads"],
                 n_kv_heads=c["num_key_value_heads"], hidden_dim=c["intermediate_size"],
                 max_seq_len=c["max_position_embeddings"], rope_theta=c["rope_theta"],
                 norm_eps=c["rms_norm_eps"], tie_embeddings=c["tie_word_embeddings"])
    model = LlamaForCausalLM(cfg)
    state = {k: v.float() for k, v in read_safetensors(
        os.path.join(model_dir, "model.safetensors")).items()}
    if cfg.tie_embeddings:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    model.load_state_dict(state)
    model.eval()
    return model, cfg, torch


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="exported Hugging Face directory")
    ap.add_argument("--recall", default=os.path.join(REPO, "build/cli/recall"))
    ap.add_argument("--data", help="held-out JSONL from gen_conversations.py (default: "
                                   "generate --convs conversations here)")
    ap.add_argument("--convs", type=int, default=50)
    ap.add_argument("--start", type=int, default=0, help="first held-out seed offset")
    ap.add_argument("--min-tokens", type=int, default=2048)
    ap.add_argument("--max-tokens", type=int, default=0,
                    help="conversation tokens at most (default: context - 192, the "
                         "longest train.py trains on)")
    ap.add_argument("--questions", type=int, default=4, help="per conversation")
    ap.add_argument("--modes", default="full,window,streaming")
    ap.add_argument("--budget", type=int, default=512)
    ap.add_argument("--max-new-tokens", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1, help="per recall process")
    ap.add_argument("--jobs", type=int, default=1, help="recall processes at once")
    ap.add_argument("--no-torch", dest="torch", action="store_false")
    ap.add_argument("--out", help="write the summary and every answer as JSON")
    args = ap.parse_args()

    tk = load_tokenizer(os.path.join(args.model, "tokenizer.model"))
    with open(os.path.join(args.model, "config.json")) as f:
        context = json.load(f)["max_position_embeddings"]
    if args.data:
        with open(args.data) as f:
            convs = [json.loads(line) for line in f][:args.convs]
    else:
        lo, _ = gen.seed_range("heldout")
        max_tokens = args.max_tokens or context - 192
        convs = [gen.generate(lo + args.start + i, min_tokens=min(args.min_tokens, max_tokens),
                              max_tokens=max_tokens, count_tokens=tk.line_tokens)
                 for i in range(args.convs)]
    items = []
    for conv in convs:
        for q in conv["questions"][:args.questions]:
            prompt = gen.prompt_for(conv["text"], q["q"])
            items.append(dict(seed=conv["seed"], q=q["q"], a=q["a"], kind=q["kind"],
                              distance=q["distance_tokens"], conv_tokens=conv["tokens"],
                              prompt=prompt))
    modes = [m for m in args.modes.split(",") if m]
    print(f"{len(convs)} conversations ({min(c['tokens'] for c in convs)}-"
          f"{max(c['tokens'] for c in convs)} tokens), {len(items)} questions, modes {modes}",
          flush=True)

    def job(item, mode):
        if mode == "full":
            return run_recall(args, item["prompt"], ["--policy", "full"])
        if mode == "window":
            return run_recall(args, window_prompt(tk, item["prompt"], args.budget)[0],
                              ["--policy", "full"])
        return run_recall(args, item["prompt"], ["--policy", mode, "--budget", str(args.budget)])

    t0 = time.time()
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        futures = {(i, m): pool.submit(job, it, m) for i, it in enumerate(items) for m in modes}
        for (i, m), fut in futures.items():
            out, secs = fut.result()
            items[i][f"recall_{m}"] = out
            items[i][f"recall_{m}_ok"] = normalize(out) == normalize(items[i]["a"])
            items[i][f"recall_{m}_s"] = round(secs, 2)
    recall_s = time.time() - t0

    torch_modes = [m for m in ("full", "window") if m in modes] if args.torch else []
    if torch_modes:
        model, cfg, torch = load_torch_model(args.model)
        torch.set_num_threads(max(1, args.threads))
        stops = {tk.nl_id, tk.eos_id, tk.bos_id}
        for it in items:
            for m in torch_modes:
                text = it["prompt"] if m == "full" else window_prompt(tk, it["prompt"],
                                                                      args.budget)[0]
                ids = [tk.bos_id] + tk.encode(text)
                out = tk.decode(model.generate(ids, args.max_new_tokens, stops))
                it[f"torch_{m}"] = out
                it[f"torch_{m}_ok"] = normalize(out) == normalize(it["a"])
                if f"recall_{m}" in it:
                    it[f"agree_{m}"] = out == it[f"recall_{m}"]

    summary = {"model": args.model, "questions": len(items), "conversations": len(convs),
               "conv_tokens": [min(c["tokens"] for c in convs), max(c["tokens"] for c in convs)],
               "budget": args.budget, "recall_seconds": round(recall_s, 1)}
    cols = [f"recall_{m}" for m in modes] + [f"torch_{m}" for m in torch_modes]
    for c in cols:
        summary[c + "_acc"] = round(sum(it[c + "_ok"] for it in items) / len(items), 4)
    for m in torch_modes:
        if f"agree_{m}" in items[0]:
            summary[f"agree_{m}"] = round(sum(it[f"agree_{m}"] for it in items) / len(items), 4)
    far = [it for it in items if it["distance"] >= args.budget]
    summary["far_questions"] = len(far)
    for c in cols:
        if far:
            summary[c + "_acc_far"] = round(sum(it[c + "_ok"] for it in far) / len(far), 4)
    by_kind = collections.defaultdict(list)
    for it in items:
        by_kind[it["kind"]].append(it)
    summary["by_kind"] = {k: {c: round(sum(it[c + "_ok"] for it in v) / len(v), 3)
                              for c in cols} | {"n": len(v)} for k, v in sorted(by_kind.items())}
    print(json.dumps({k: v for k, v in summary.items() if k != "by_kind"}, indent=1))
    for it in items[:min(8, len(items))]:
        print(f"  Q: {it['q']}  A: {it['a']!r}  " + "  ".join(
            f"{c}={it[c]!r}" for c in cols))
    if args.out:
        for it in items:
            it.pop("prompt")
        with open(args.out, "w") as f:
            json.dump({"summary": summary, "items": items}, f, indent=1)


if __name__ == "__main__":
    main()
