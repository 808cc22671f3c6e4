#!/usr/bin/env python3
"""Trains the Llama model of model.py on generated conversations.

    python3 tools/train/train.py --tokenizer tok/tokenizer.model --out-dir run/ \
        --device cuda --dtype bf16 --batch 32 --steps 4000 --lr 1e-3 --workers 12

Data: by default conversations are generated on the fly in DataLoader workers from random
training seeds (gen_conversations.TRAIN range, below the seeds train_tokenizer.py used), so
no data set is stored and none is seen twice; --data FILE.jsonl trains on a fixed file from
gen_conversations.py instead. Each example is one conversation in the training format
(gen_conversations.training_text): BOS, the conversation, "[Questions]" and its Q/A lines,
at most --context tokens (one conversation per row, right-padded, rows of similar length
batched together).

Loss: next-token cross-entropy on every token of the text (the conversation teaches the
model to track and copy facts), with the answer tokens (" <answer>" and the newline that
ends it) weighted --answer-weight times (default 4); the loss is the weighted mean. Padding
has weight 0. Logged: loss, the answer tokens' own loss, and the training answer accuracy
(all answer tokens argmax-correct, teacher-forced: the same as greedy decoding producing the
answer and its newline).

Held-out check every --eval-every steps: --eval-convs conversations from the held-out seeds
(2K-4K tokens), each question asked alone ("...[Questions]\\nQ: <q>\\nA:"), teacher-forced
exact match, with the full context and with only the last --window tokens (BOS + the
prompt's last window-1 tokens). eval_recall.py measures the same through Recall.

Checkpoints: OUT_DIR/ckpt.pt (model, optimizer, step, config) every --save-every steps, at
the end, and when --time-limit minutes have passed (so a run fits a limited session);
--resume continues from OUT_DIR/ckpt.pt with the same schedule. Logs: OUT_DIR/log.jsonl.
"""

import argparse
import dataclasses
import json
import math
import os
import random
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen_conversations as gen  # noqa: E402
from model import Config, LlamaForCausalLM, add_config_args, config_from_args  # noqa: E402
from tok import load_tokenizer  # noqa: E402

ONLINE_SEED_END = 900_000_000  # train_tokenizer.py uses seeds from here on


# ----------------------------------------------------------------------------- examples

def encode_example(tk, conv, context, answer_weight, questions=None):
    """(ids, weights, answer mask): ids start with BOS; weights[i] weighs predicting ids[i]
    (weights[0] = 0); mask[i] marks answer tokens (" <answer>" and its newline)."""
    ids, w, m = [tk.bos_id], [0.0], [False]

    def put(text, weight, newline=True, answer=False):
        t = tk.encode(text) + ([tk.nl_id] if newline else [])
        ids.extend(t)
        w.extend([weight] * len(t))
        m.extend([answer] * len(t))

    for line in conv["text"].splitlines():
        put(line, 1.0)
    put(gen.QUESTIONS_HEADER, 1.0)
    for q in (conv["questions"] if questions is None else questions):
        before = len(ids)
        put("Q: " + q["q"], 1.0)
        put("A:", 1.0, newline=False)
        put(" " + q["a"], answer_weight, answer=True)
        if len(ids) > context:  # drop questions that do not fit
            del ids[before:], w[before:], m[before:]
            break
    return ids[:context], w[:context], m[:context]


def prompt_ids(tk, text, question, window=None):
    """The evaluation prompt (BOS + conversation + question + "A:"), optionally only BOS and
    the last window-1 tokens (what a 'last N tokens' cache keeps)."""
    ids = [tk.bos_id]
    for line in gen.prompt_for(text, question).split("\n"):
        ids.extend(tk.encode(line) + [tk.nl_id])
    ids.pop()  # the prompt ends in "A:", not a newline
    if window is not None and len(ids) > window:
        ids = [tk.bos_id] + ids[len(ids) - (window - 1):]
    return ids


class OnlineConversations(torch.utils.data.IterableDataset):
    """Batches of (ids, weights) lists from freshly generated training conversations."""

    def __init__(self, args, tokenizer_path, base_seed):
        self.args, self.tokenizer_path, self.base_seed = args, tokenizer_path, base_seed

    def examples(self, rng, tk):
        a = self.args
        if a.data:
            with open(a.data) as f:
                convs = [json.loads(line) for line in f]
            while True:
                rng.shuffle(convs)
                for conv in convs:
                    yield encode_example(tk, conv, a.context, a.answer_weight)
        while True:
            seed = rng.randrange(gen.TRAIN_SEED_START, ONLINE_SEED_END)
            conv = gen.generate(seed, min_tokens=a.min_tokens,
                                max_tokens=min(a.max_tokens, a.context - a.qa_reserve),
                                count_tokens=tk.line_tokens, n_questions=a.questions,
                                far_tokens=a.far_tokens, far_share=a.far_share)
            yield encode_example(tk, conv, a.context, a.answer_weight)

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        wid = info.id if info is not None else 0
        rng = random.Random(f"{self.base_seed}/{wid}")
        tk = load_tokenizer(self.tokenizer_path)
        it = self.examples(rng, tk)
        b = self.args.batch
        while True:  # bucket: sort a pool by length, cut into batches, shuffle batches
            pool = sorted((next(it) for _ in range(b * self.args.bucket)), key=lambda e: len(e[0]))
            batches = [pool[i:i + b] for i in range(0, len(pool), b)]
            rng.shuffle(batches)
            for batch in batches:
                yield collate(batch)


def collate(batch):
    T = max(len(ids) for ids, _, _ in batch)
    x = torch.zeros(len(batch), T, dtype=torch.long)
    w = torch.zeros(len(batch), T, dtype=torch.float32)
    m = torch.zeros(len(batch), T, dtype=torch.bool)
    for i, (ids, ws, ms) in enumerate(batch):
        x[i, :len(ids)] = torch.tensor(ids)
        w[i, :len(ws)] = torch.tensor(ws)
        m[i, :len(ms)] = torch.tensor(ms)
    return x, w, m


def batch_loss(model, x, w, m):
    """Weighted mean cross-entropy; also the answer tokens' loss and exact-match rate
    (teacher-forced)."""
    logits = model(x[:, :-1])
    tgt, wt, ans = x[:, 1:], w[:, 1:], m[:, 1:]
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1),
                         reduction="none").view_as(tgt)
    loss = (ce * wt).sum() / wt.sum().clamp(min=1e-6)
    with torch.no_grad():
        ans_loss = ce[ans].mean().item() if ans.any() else float("nan")
        # an answer = a maximal run of answer tokens; exact when all its tokens are argmax
        starts = ans & ~F.pad(ans[:, :-1], (1, 0), value=False)
        run = torch.cumsum(starts.long(), dim=1)
        n_runs = int(starts.sum())
        if n_runs:
            wrong = (logits.argmax(-1) != tgt) & ans
            row_off = torch.cumsum(starts.sum(1), 0) - starts.sum(1)
            gid = (run - 1 + row_off[:, None])[wrong]
            n_wrong = int(torch.unique(gid).numel())
            ans_acc = (n_runs - n_wrong) / n_runs
        else:
            ans_acc = float("nan")
    return loss, ans_loss, ans_acc


# ----------------------------------------------------------------------------- evaluation

def heldout_set(tk, n_convs, context, min_tokens=2048, max_tokens=None, start=0):
    """Held-out conversations of min_tokens..max_tokens (default: up to context - 192, as
    in training, and from half of that when the context is short)."""
    lo, _ = gen.seed_range("heldout")
    max_tokens = max_tokens or context - 192
    min_tokens = min(min_tokens, max_tokens // 2)
    return [gen.generate(lo + start + i, min_tokens=min_tokens, max_tokens=max_tokens,
                         count_tokens=tk.line_tokens) for i in range(n_convs)]


@torch.no_grad()
def heldout_accuracy(model, tk, convs, device, window=None, max_questions=None, autocast=None):
    """Teacher-forced exact match, one question per prompt: all answer tokens and the
    closing newline must be the argmax (= greedy decoding gives exactly the answer)."""
    model.eval()
    right = total = 0
    for conv in convs:
        for q in conv["questions"][:max_questions]:
            p = prompt_ids(tk, conv["text"], q["q"], window)
            ans = tk.encode(" " + q["a"]) + [tk.nl_id]
            x = torch.tensor([p + ans[:-1]], device=device)
            with autocast():
                logits = model(x)
            pred = logits[0, len(p) - 1:].argmax(-1).tolist()
            right += int(pred == ans)
            total += 1
    model.train()
    return right / max(total, 1), total


# ----------------------------------------------------------------------------- main

def lr_at(step, args, trained_s=0.0, fresh_from=None):
    """Linear warmup over --warmup steps, then cosine to --min-lr: over the steps up to
    --steps, or with --train-minutes over the training time (so a run of unknown speed
    still ends its schedule within a fixed device budget). A run continued from an export
    (fresh_from: its step) has a fresh optimizer, whose first steps are as large as the
    learning rate whatever the gradient: it warms up again over --rewarmup steps."""
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    if args.train_minutes:
        progress = min(1.0, trained_s / (args.train_minutes * 60))
    else:
        progress = min(1.0, (step - args.warmup) / max(1, args.steps - args.warmup))
    lr = args.min_lr + 0.5 * (args.lr - args.min_lr) * (1 + math.cos(math.pi * progress))
    if fresh_from is not None and step - fresh_from < args.rewarmup:
        lr *= (step - fresh_from + 1) / args.rewarmup
    return lr


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--out-dir", required=True)
    add_config_args(ap)
    ap.add_argument("--data", help="train on this JSONL (gen_conversations.py) instead of "
                                   "generating conversations on the fly")
    ap.add_argument("--min-tokens", type=int, default=1024)
    ap.add_argument("--max-tokens", type=int, default=4096,
                    help="conversation tokens at most (also capped at context - qa-reserve)")
    ap.add_argument("--qa-reserve", type=int, default=192, help="tokens left for questions")
    ap.add_argument("--questions", type=int, default=8)
    ap.add_argument("--far-tokens", type=int, default=600)
    ap.add_argument("--far-share", type=float, default=0.75)
    ap.add_argument("--answer-weight", type=float, default=4.0)
    ap.add_argument("--batch", type=int, default=32, help="conversations per micro-batch")
    ap.add_argument("--grad-accum", type=int, default=1)
    ap.add_argument("--bucket", type=int, default=8, help="batches per length-sorted pool")
    ap.add_argument("--steps", type=int, default=4000)
    ap.add_argument("--train-minutes", type=float, default=0,
                    help="a training-time budget over all calls (resumes included) instead of "
                         "--steps: the cosine schedule follows the time spent, training ends "
                         "when it is used up (0: step-based)")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--min-lr", type=float, default=1e-4)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--rewarmup", type=int, default=50,
                    help="warmup steps after --init-from (a fresh optimizer)")
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--grad-clip", type=float, default=1.0)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", choices=["fp32", "bf16"], default=None,
                    help="autocast dtype (default: bf16 on cuda, fp32 on cpu)")
    ap.add_argument("--compile", action="store_true", help="torch.compile (PyTorch 2)")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: default)")
    ap.add_argument("--workers", type=int, default=2, help="DataLoader generator processes")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--log-every", type=int, default=10)
    ap.add_argument("--eval-every", type=int, default=500)
    ap.add_argument("--eval-convs", type=int, default=16)
    ap.add_argument("--eval-questions", type=int, default=4, help="per conversation")
    ap.add_argument("--window", type=int, default=512)
    ap.add_argument("--save-every", type=int, default=500)
    ap.add_argument("--time-limit", type=float, default=0, help="minutes; 0 = none")
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--init-from", metavar="EXPORT_DIR",
                    help="without OUT_DIR/ckpt.pt: start from an export_hf.py directory (its "
                         "weights, config and step; a fresh optimizer), e.g. after a device "
                         "machine holding the checkpoint was given back")
    args = ap.parse_args()

    t_start = time.time()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    os.makedirs(args.out_dir, exist_ok=True)
    tk = load_tokenizer(args.tokenizer)
    ckpt_path = os.path.join(args.out_dir, "ckpt.pt")
    step = 0
    trained_s = 0.0  # seconds spent training, over all calls
    state = None
    fresh_from = None  # the step an --init-from run started at (fresh optimizer)
    if args.resume and os.path.exists(ckpt_path):
        state = torch.load(ckpt_path, map_location="cpu", weights_only=False)  # ours; see export_hf
        cfg = Config(**state["config"])
        step = state["step"]
        trained_s = state.get("trained_s", 0.0)
    elif args.init_from:
        with open(os.path.join(args.init_from, "training.json")) as f:
            info = json.load(f)
        cfg = Config(**info["config"])
        step = fresh_from = info["step"]
        trained_s = info.get("trained_s", 0.0)
        from export_hf import read_safetensors  # noqa: E402
        weights = read_safetensors(os.path.join(args.init_from, "model.safetensors"))
        state = {"model": {k: v.float() for k, v in weights.items()}, "optim": None}
        print(f"starting from {args.init_from} (step {step}, fresh optimizer)", flush=True)
    else:
        cfg = config_from_args(args, vocab_size=tk.vocab_size)
    assert cfg.vocab_size >= tk.vocab_size
    args.context = cfg.max_seq_len
    model = LlamaForCausalLM(cfg)
    if state is not None:
        missing, unexpected = model.load_state_dict(state["model"], strict=False)
        # A tied export has no lm_head.weight; anything else missing is an error.
        assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    device = torch.device(args.device)
    model.to(device)
    dtype = args.dtype or ("bf16" if device.type == "cuda" else "fp32")

    def autocast():
        if dtype == "bf16":
            return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
        return torch.autocast(device_type=device.type, enabled=False)

    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": args.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    extra = {"fused": True} if device.type == "cuda" and torch.__version__ >= "2" else {}
    opt = torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, 0.95), eps=1e-8, **extra)
    if state is not None and state["optim"] is not None:
        opt.load_state_dict(state["optim"])
    fwd = torch.compile(model) if args.compile else model
    print(f"model: {model.num_params():,} parameters, {cfg}", flush=True)
    print(f"tokenizer: {args.tokenizer} ({tk.backend}, {tk.vocab_size} pieces); device "
          f"{device}, {dtype}; starting at step {step}", flush=True)

    data = OnlineConversations(args, args.tokenizer, f"{args.seed}/{step}")
    loader = torch.utils.data.DataLoader(
        data, batch_size=None, num_workers=args.workers,
        prefetch_factor=4 if args.workers else (None if torch.__version__ >= "2" else 2),
        persistent_workers=args.workers > 0)
    batches = iter(loader)
    evals = heldout_set(tk, args.eval_convs, cfg.max_seq_len) if args.eval_convs else []

    def save(tag=""):
        tmp = ckpt_path + ".tmp"
        torch.save({"model": model.state_dict(), "optim": opt.state_dict(), "step": step,
                    "trained_s": trained_s, "config": dataclasses.asdict(cfg), "args": vars(args),
                    "tokenizer": os.path.abspath(args.tokenizer)}, tmp)
        os.replace(tmp, ckpt_path)
        print(f"saved {ckpt_path} at step {step}{tag}", flush=True)

    log = open(os.path.join(args.out_dir, "log.jsonl"), "a")
    model.train()
    tokens_seen, t_log, stats = 0, time.time(), []

    def more():
        if args.train_minutes:
            return trained_s < args.train_minutes * 60
        return step < args.steps

    t_step = time.time()
    while more():
        lr = lr_at(step, args, trained_s, fresh_from)
        for g in opt.param_groups:
            g["lr"] = lr
        opt.zero_grad(set_to_none=True)
        for _ in range(args.grad_accum):
            x, w, m = (t.to(device, non_blocking=True) for t in next(batches))
            with autocast():
                loss, ans_loss, ans_acc = batch_loss(fwd, x, w, m)
            (loss / args.grad_accum).backward()
            tokens_seen += int((w > 0).sum())
            stats.append((loss.item(), ans_loss, ans_acc))
        gn = torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
        opt.step()
        step += 1
        now = time.time()
        trained_s += now - t_step  # includes the evaluations and saves of the last step
        t_step = now
        done = not more()
        if step % args.log_every == 0 or done:
            dt = time.time() - t_log
            mean = lambda k: sum(s[k] for s in stats if s[k] == s[k]) / max(
                1, sum(1 for s in stats if s[k] == s[k]))
            rec = {"step": step, "loss": round(mean(0), 4), "answer_loss": round(mean(1), 4),
                   "answer_acc": round(mean(2), 4), "lr": lr, "grad_norm": round(float(gn), 3),
                   "tok_s": round(tokens_seen / dt), "elapsed_min": round((time.time() - t_start) / 60, 2),
                   "trained_min": round(trained_s / 60, 2)}
            print(json.dumps(rec), flush=True)
            log.write(json.dumps(rec) + "\n")
            log.flush()
            tokens_seen, t_log, stats = 0, time.time(), []
        if evals and (step % args.eval_every == 0 or done):
            full, n = heldout_accuracy(model, tk, evals, device, None, args.eval_questions, autocast)
            win, _ = heldout_accuracy(model, tk, evals, device, args.window, args.eval_questions,
                                      autocast)
            rec = {"step": step, "heldout_acc_full": round(full, 4),
                   f"heldout_acc_last{args.window}": round(win, 4), "heldout_questions": n}
            print(json.dumps(rec), flush=True)
            log.write(json.dumps(rec) + "\n")
            log.flush()
        if step % args.save_every == 0 and not done:
            save()
        if args.time_limit and time.time() - t_start > args.time_limit * 60:
            save(" (time limit; continue with --resume)")
            return
    save(" (done)")


if __name__ == "__main__":
    main()
