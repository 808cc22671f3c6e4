#!/usr/bin/env python3
"""Trains the SentencePiece tokenizer on generated conversations (training split only).

    python3 tools/train/train_tokenizer.py --conversations 20000 --vocab 2048 --out-dir tok/

Writes OUT_DIR/tokenizer.model (and tokenizer.vocab). Needs the sentencepiece package
(Debian: python3-sentencepiece). Choices, all so that Recall's SentencePiece path
(worker/tokenizer/tokenizer_sentencepiece.cc through libsentencepiece) and tools/train/tok.py
tokenize the same way:
  * BPE model (on this templated corpus the unigram trainer keeps odd pieces such as
    "▁"+"are", "▁Whe"+"re": 2.9 chars/token at 2048 pieces against 3.5 for BPE), ids: <unk>=0, <s>=1 (BOS), </s>=2 (EOS), no pad; matches config.json;
  * identity normalization, no dummy prefix, no whitespace collapsing: the text round-trips
    exactly, and lines tokenize independently (so answers and lines can be encoded apart);
  * "\\n" as a user-defined symbol: one token per line break (the default normalizer would
    turn it into a space);
  * byte fallback (256 <0xHH> pieces): any UTF-8 text encodes without <unk>;
  * split_digits: numbers are spelled digit by digit, which helps copying them.
"""

import argparse
import os
import random
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen_conversations as gen  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--conversations", type=int, default=20000)
    ap.add_argument("--vocab", type=int, default=2048)
    ap.add_argument("--out-dir", required=True)
    ap.add_argument("--start", type=int, default=900_000_000,
                    help="first training seed used (kept apart from the seeds train.py draws)")
    ap.add_argument("--min-tokens", type=int, default=1024)
    ap.add_argument("--max-tokens", type=int, default=3968)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-sentences", type=int, default=2_000_000)
    args = ap.parse_args()

    import sentencepiece as spm

    os.makedirs(args.out_dir, exist_ok=True)
    lo, hi = gen.seed_range("train")
    assert lo + args.start + args.conversations <= hi
    n_lines = 0
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        corpus = f.name
        for i in range(args.conversations):
            conv = gen.generate(lo + args.start + i, min_tokens=args.min_tokens,
                                max_tokens=args.max_tokens)
            for line in gen.training_text(conv).splitlines():
                f.write(line + "\n")
                n_lines += 1
    # Every value of every pool once, so rare entities still get reasonable pieces.
    with open(corpus, "a") as f:
        pools = [gen.FIRST_NAMES, gen.PET_NAMES, gen.CITIES, gen.JOBS, gen.COMPANIES,
                 gen.INSTRUMENTS, gen.COLOURS, gen.CAR_BRANDS, gen.MONTHS]
        words = [w for pool in pools for w in pool]
        random.Random(0).shuffle(words)
        for k in range(0, len(words), 12):
            f.write(" ".join(words[k:k + 12]) + "\n")
    prefix = os.path.join(args.out_dir, "tokenizer")
    spm.SentencePieceTrainer.train(
        input=corpus, model_prefix=prefix, vocab_size=args.vocab, model_type="bpe",
        character_coverage=1.0, byte_fallback=True, split_digits=True,
        normalization_rule_name="identity", remove_extra_whitespaces=False,
        add_dummy_prefix=False, user_defined_symbols=["\n"],
        unk_id=0, bos_id=1, eos_id=2, pad_id=-1,
        input_sentence_size=args.max_sentences, shuffle_input_sentence=True,
        num_threads=args.threads, minloglevel=2)
    os.unlink(corpus)

    sp = spm.SentencePieceProcessor(model_file=prefix + ".model")
    sample = gen.training_text(gen.generate(lo + args.start, min_tokens=args.min_tokens,
                                            max_tokens=args.max_tokens))
    ids = sp.encode(sample)
    assert sp.decode(ids) == sample, "tokenizer does not round-trip the corpus"
    nl = sp.piece_to_id("\n")
    assert nl != sp.unk_id() and sp.encode("a\nb").count(nl) == 1, "newline is not a token"
    print(f"wrote {prefix}.model: {sp.get_piece_size()} pieces from {n_lines} lines; "
          f"sample {len(sample)} chars -> {len(ids)} tokens "
          f"({len(sample) / len(ids):.2f} chars/token)")


if __name__ == "__main__":
    main()
