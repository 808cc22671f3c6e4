#!/usr/bin/env python3
"""Writes the model card (MODEL_DIR/README.md) of an exported model from what was measured:
the export's config and training state (training.json), the training log (log.jsonl), the
held-out accuracy through Recall (eval_recall.py --out) and, optionally, the policy
benchmark (recall_conversation_bench --out-json). Every figure in the card is copied from
those files; nothing is typed in by hand but the hardware's name.

    python3 tools/train/make_card.py --model MODEL_DIR --log RUN/log.jsonl \
        --eval eval.json [--bench conversation_bench.json] --hardware "1x NVIDIA H200"
"""

import argparse
import json
import os


def load_jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def pct(x):
    return "n/a" if x is None else f"{100 * x:.1f}%"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="export_hf.py directory")
    ap.add_argument("--log", required=True, help="train.py's log.jsonl")
    ap.add_argument("--eval", required=True, help="eval_recall.py --out JSON")
    ap.add_argument("--bench", help="recall_conversation_bench --out-json JSON")
    ap.add_argument("--hardware", required=True, help='e.g. "1x NVIDIA H200, bf16"')
    ap.add_argument("--out", help="default: MODEL/README.md")
    args = ap.parse_args()

    with open(os.path.join(args.model, "training.json")) as f:
        training = json.load(f)
    with open(os.path.join(args.model, "config.json")) as f:
        hf = json.load(f)
    cfg, targs, step = training["config"], training.get("args", {}), training["step"]
    log = load_jsonl(args.log)
    steps = [r for r in log if "loss" in r]
    evals = [r for r in log if "heldout_acc_full" in r]
    with open(args.eval) as f:
        ev = json.load(f)["summary"]
    size = os.path.getsize(os.path.join(args.model, "model.safetensors"))
    d, L, H, KV = cfg["dim"], cfg["n_layers"], cfg["n_heads"], cfg["n_kv_heads"]
    hd = d // H
    n_params = (cfg["vocab_size"] * d * (1 if cfg.get("tie_embeddings", True) else 2)
                + L * (2 * d + d * H * hd + 2 * d * KV * hd + H * hd * d + 3 * d * cfg["hidden_dim"])
                + d)
    # elapsed_min restarts at every call (--resume): add up each call's last reading.
    minutes, prev = 0.0, 0.0
    for r in steps:
        t = r.get("elapsed_min", 0.0)
        if t < prev:
            minutes += prev
    if steps and "trained_min" in steps[-1]:  # train.py's own count over every call
        minutes = steps[-1]["trained_min"]
        prev = t
    minutes += prev
    if steps and "trained_min" in steps[-1]:  # train.py's own count over every call
        minutes = steps[-1]["trained_min"]
    batch = targs.get("batch", "?")
    last = steps[-1] if steps else {}

    out = []
    w = out.append
    w(f"# {os.path.basename(os.path.normpath(args.model))}: a small conversation-recall model\n")
    w("A Llama-architecture model trained from scratch on synthetic multi-session "
      "conversations (tools/train/ in the Recall repository), so that Recall's KV-cache "
      "policies can be measured on a model whose answers depend on what was said long ago.\n")
    w("## Model\n")
    w(f"- Llama: RMSNorm, RoPE (theta {cfg['rope_theta']:g}, half-split), SwiGLU, GQA, "
      f"{'tied' if cfg.get('tie_embeddings', True) else 'untied'} embeddings, no biases")
    w(f"- dim {d}, {L} layers, {H} query heads of {hd}, {KV} KV heads, MLP {cfg['hidden_dim']}, "
      f"vocabulary {cfg['vocab_size']}, context {cfg['max_seq_len']}: **{n_params:,} parameters**")
    w(f"- `model.safetensors`: {hf.get('torch_dtype', '?')}, {size / 1e6:.1f} MB; tokenizer: "
      "SentencePiece BPE (`tokenizer.model`, tools/train/train_tokenizer.py)\n")
    w("## Data\n")
    w("Conversations from tools/train/gen_conversations.py: two speakers with personas over "
      "dated sessions; facts (pets, relatives, jobs, cities, numbers, plans, cars) introduced, "
      "repeated, updated and contradicted; questions at the end whose answers are one entity. "
      f"Training seeds [0, 9*10^8) generated on the fly ({targs.get('min_tokens', '?')}-"
      f"{targs.get('max_tokens', '?')} conversation tokens, {targs.get('questions', '?')} "
      "questions each); held-out seeds from 2*10^9, never trained on.\n")
    w("## Training\n")
    w(f"- {step} steps of {batch} conversations, AdamW (lr {targs.get('lr', '?')} to "
      f"{targs.get('min_lr', '?')}, cosine, warmup {targs.get('warmup', '?')}), answer tokens "
      f"weighted {targs.get('answer_weight', '?')}")
    w(f"- hardware: {args.hardware}; training time: {minutes:.1f} minutes (log.jsonl, "
      "summed over the calls that resumed one another)")
    if last:
        w(f"- final logged loss {last['loss']}, answer-token loss {last['answer_loss']}, "
          f"training answer exact match {pct(last['answer_acc'])}")
    if evals:
        e = evals[-1]
        win = next((k for k in e if k.startswith("heldout_acc_last")), None)
        w(f"- PyTorch held-out check at step {e['step']} ({e['heldout_questions']} questions, "
          f"teacher-forced): full {pct(e['heldout_acc_full'])}"
          + (f", last {win[16:]} tokens {pct(e[win])}" if win else ""))
    w("")
    w("## Held-out accuracy through Recall\n")
    w(f"`tools/train/eval_recall.py`: {ev['questions']} questions on {ev['conversations']} "
      f"held-out conversations of {ev['conv_tokens'][0]}-{ev['conv_tokens'][1]} tokens, greedy "
      "decoding with `recall generate`, exact match of the answer entity.\n")
    w("| mode | accuracy | answers stated >= %d tokens back (%d) |" % (ev["budget"], ev.get("far_questions", 0)))
    w("|---|---|---|")
    names = {"recall_full": "FullKV (the whole conversation)",
             "recall_window": f"last {ev['budget']} tokens only",
             "recall_streaming": f"`--policy streaming --budget {ev['budget']}` (prefill sees everything)",
             "torch_full": "PyTorch, full", "torch_window": f"PyTorch, last {ev['budget']} tokens"}
    for key, label in names.items():
        if key + "_acc" in ev:
            w(f"| {label} | {pct(ev[key + '_acc'])} | {pct(ev.get(key + '_acc_far'))} |")
    if "agree_full" in ev:
        w(f"\nRecall and PyTorch give the same answer text on {pct(ev['agree_full'])} of the "
          "questions (full).")
    w("")
    if args.bench:
        with open(args.bench) as f:
            bench = json.load(f)
        s = bench["settings"]
        w("## KV-cache policies (recall_conversation_bench)\n")
        w(f"{s['questions']} questions on {s['conversations']} held-out conversations of "
          f"{s['conversation_tokens_min']}-{s['conversation_tokens_max']} tokens; budgets per "
          "layer and KV head as a share of the conversation; teacher-forced exact match.\n")
        w("| method | budget | accuracy | far | agreement with FullKV | KV held |")
        w("|---|---|---|---|---|---|")
        for r in bench["results"]:
            w(f"| {r['method']} | {r['budget']} | {pct(r['accuracy'])} | {pct(r['far_accuracy'])} "
              f"| {pct(r['agreement_with_full'])} | {pct(r['kv_fraction_of_full'])} |")
        w("")
    w("## Use\n")
    w("```sh\nrecall generate --model THIS_DIR --temperature 0 --max-tokens 8 --stop '\\n' \\\n"
      "    --prompt \"$(cat conversation.txt)[Questions]\nQ: What is Anna's dog called?\nA:\"\n```\n")
    path = args.out or os.path.join(args.model, "README.md")
    with open(path, "w") as f:
        f.write("\n".join(out))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
