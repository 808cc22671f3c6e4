#!/usr/bin/env python3
"""The tokenizer as the training scripts use it: SentencePiece when importable, else a
pure-Python reader of the same tokenizer.model (so training machines without the
sentencepiece package, e.g. a GPU box with only PyTorch, tokenize identically).

The lite reader implements exactly what train_tokenizer.py produces: a BPE (or unigram) model
with identity normalization, no dummy prefix, no whitespace collapsing, user-defined symbols
(the newline) and byte fallback. It refuses any other normalization. BPE follows
bpe_model.cc: start from characters (a user-defined symbol is one symbol), repeatedly merge
the adjacent pair whose concatenation is a piece with the highest score (leftmost on ties),
then map symbols that are no piece to their UTF-8 bytes. Check it against the real
library with:

    python3 tools/train/tok.py --check TOKENIZER.model CORPUS.jsonl
"""

import argparse
import json
import struct
import sys

SPACE = "\u2581"

# SentencePiece piece types (sentencepiece_model.proto)
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
UNK_PENALTY = 10.0  # unigram_model.cc: kUnkPenalty


def _varint(buf, i):
    shift = result = 0
    while True:
        b = buf[i]
        i += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, i
        shift += 7


def _fields(buf):
    """Yields (field number, wire type, value) of one protobuf message."""
    i = 0
    while i < len(buf):
        key, i = _varint(buf, i)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _varint(buf, i)
        elif wire == 1:
            value, i = buf[i:i + 8], i + 8
        elif wire == 2:
            n, i = _varint(buf, i)
            value, i = buf[i:i + n], i + n
        elif wire == 5:
            value, i = buf[i:i + 4], i + 4
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")
        yield field, wire, value


class LiteSentencePiece:
    """Unigram Viterbi over a tokenizer.model, for the options train_tokenizer.py uses."""

    def __init__(self, path):
        with open(path, "rb") as f:
            data = f.read()
        self.pieces, self.scores, self.types = [], [], []
        trainer, normalizer = {}, {}
        for field, _, value in _fields(data):
            if field == 1:
                piece, score, typ = "", 0.0, NORMAL
                for f2, _, v2 in _fields(value):
                    if f2 == 1:
                        piece = v2.decode("utf-8")
                    elif f2 == 2:
                        score = struct.unpack("<f", v2)[0]
                    elif f2 == 3:
                        typ = v2
                self.pieces.append(piece)
                self.scores.append(score)
                self.types.append(typ)
            elif field == 2:
                trainer = {f2: v2 for f2, _, v2 in _fields(value)}
            elif field == 3:
                normalizer = {f2: v2 for f2, _, v2 in _fields(value)}
        self.model_type = trainer.get(3, 1)
        if self.model_type not in (1, 2):
            raise ValueError(f"{path}: model_type {self.model_type} is neither unigram nor BPE")
        self.byte_fallback = bool(trainer.get(35, 0))
        self.unk_id = trainer.get(40, 0)
        self.bos_id = trainer.get(41, 1)
        self.eos_id = trainer.get(42, 2)
        if self.bos_id >= 2 ** 63:
            self.bos_id -= 2 ** 64
        if self.eos_id >= 2 ** 63:
            self.eos_id -= 2 ** 64
        name = normalizer.get(1, b"").decode()
        if name != "identity" or normalizer.get(3, 1) or normalizer.get(4, 1) \
                or not normalizer.get(5, 1):
            raise ValueError(f"{path}: the lite reader needs identity normalization, "
                             "add_dummy_prefix=false, remove_extra_whitespaces=false")
        self.vocab = {}
        self.user = {}
        self.bytes = {}
        for i, (p, t) in enumerate(zip(self.pieces, self.types)):
            if t == NORMAL:
                if SPACE in p[1:]:
                    raise ValueError(f"{path}: piece {p!r} has an inner space; not supported")
                self.vocab[p] = i
            elif t == USER_DEFINED:
                self.user[p] = i
            elif t == BYTE:
                self.bytes[int(p[3:5], 16)] = i
        self.max_len = max(len(p) for p in self.vocab)
        self.min_score = min(s for s, t in zip(self.scores, self.types) if t == NORMAL)
        self.cache = {}

    def get_piece_size(self):
        return len(self.pieces)

    def id_to_piece(self, i):
        return self.pieces[i]

    def piece_to_id(self, p):
        return self.vocab.get(p, self.user.get(p, self.unk_id))

    def _bpe(self, s):
        cached = self.cache.get(s)
        if cached is not None:
            return cached
        syms = list(s)
        while len(syms) > 1:
            best, best_i = None, -1
            for i in range(len(syms) - 1):
                pid = self.vocab.get(syms[i] + syms[i + 1])
                if pid is not None and (best is None or self.scores[pid] > best):
                    best, best_i = self.scores[pid], i
            if best_i < 0:
                break
            syms[best_i:best_i + 2] = [syms[best_i] + syms[best_i + 1]]
        ids = []
        for sym in syms:
            pid = self.vocab.get(sym)
            if pid is not None:
                ids.append(pid)
            elif self.byte_fallback:
                ids.extend(self.bytes[b] for b in sym.encode("utf-8"))
            else:
                ids.append(self.unk_id)
        if len(self.cache) > 200000:
            self.cache.clear()
        self.cache[s] = ids
        return ids

    def _viterbi(self, s):
        cached = self.cache.get(s)
        if cached is not None:
            return cached
        n = len(s)
        best = [0.0] + [None] * n
        back = [None] * (n + 1)
        for i in range(n):
            if best[i] is None:
                continue
            matched_single = False
            for j in range(i + 1, min(n, i + self.max_len) + 1):
                pid = self.vocab.get(s[i:j])
                if pid is None:
                    continue
                if j == i + 1:
                    matched_single = True
                sc = best[i] + self.scores[pid]
                if best[j] is None or sc > best[j]:
                    best[j], back[j] = sc, (i, pid)
            if not matched_single:
                sc = best[i] + self.min_score - UNK_PENALTY
                if best[i + 1] is None or sc > best[i + 1]:
                    best[i + 1], back[i + 1] = sc, (i, -1)
        ids, j = [], n
        while j > 0:
            i, pid = back[j]
            if pid >= 0:
                ids.append(pid)
            elif self.byte_fallback:
                ids.extend(self.bytes[b] for b in reversed(s[i:j].encode("utf-8")))
            else:
                ids.append(self.unk_id)
            j = i
        ids.reverse()
        if len(self.cache) > 200000:
            self.cache.clear()
        self.cache[s] = ids
        return ids

    def encode(self, text):
        s = text.replace(" ", SPACE)
        out = []
        users = sorted(self.user, key=len, reverse=True)
        start = i = 0
        while i < len(s):
            u = next((u for u in users if s.startswith(u, i)), None)
            if u is None:
                i += 1
                continue
            self._encode_plain(s[start:i], out)
            out.append(self.user[u])
            i += len(u)
            start = i
        self._encode_plain(s[start:], out)
        return out

    def _encode_plain(self, s, out):
        # No piece spans an inner "▁", so words (split before each "▁") are independent.
        start = 0
        for k in range(1, len(s) + 1):
            if k == len(s) or s[k] == SPACE:
                if k > start:
                    word = s[start:k]
                    out.extend(self._bpe(word) if self.model_type == 2 else self._viterbi(word))
                start = k

    def decode(self, ids):
        out, pending = [], bytearray()
        for i in ids:
            t = self.types[i]
            if t == BYTE:
                pending.append(int(self.pieces[i][3:5], 16))
                continue
            if pending:
                out.append(pending.decode("utf-8", "replace"))
                pending = bytearray()
            if t in (CONTROL, UNUSED):
                continue
            out.append(" \u2047 " if t == UNKNOWN else self.pieces[i].replace(SPACE, " "))
        if pending:
            out.append(pending.decode("utf-8", "replace"))
        return "".join(out)


class Tokenizer:
    """encode(text) -> ids without BOS; bos_id, eos_id, nl_id, vocab_size."""

    def __init__(self, path, force_lite=False):
        self.path = path
        self.backend = "lite"
        sp = None
        if not force_lite:
            try:
                import sentencepiece as spm
                sp = spm.SentencePieceProcessor(model_file=path)
                self.backend = "sentencepiece"
            except ImportError:
                sp = None
        if sp is None:
            sp = LiteSentencePiece(path)
            self._encode = sp.encode
            self._decode = sp.decode
            self.vocab_size = sp.get_piece_size()
            self.bos_id, self.eos_id = sp.bos_id, sp.eos_id
            self._piece_to_id = sp.piece_to_id
        else:
            self._encode = lambda t: sp.encode(t)
            self._decode = lambda ids: sp.decode(ids)
            self.vocab_size = sp.get_piece_size()
            self.bos_id, self.eos_id = sp.bos_id(), sp.eos_id()
            self._piece_to_id = sp.piece_to_id
        self.nl_id = self._piece_to_id("\n")

    def encode(self, text):
        return list(self._encode(text))

    def decode(self, ids):
        return self._decode(list(ids))

    def line_tokens(self, line):
        """Tokens of `line` plus its newline (lines tokenize independently)."""
        return len(self._encode(line)) + 1


def load_tokenizer(path, force_lite=False):
    return Tokenizer(path, force_lite=force_lite)


def main():
    ap = argparse.ArgumentParser(description="Compare the lite reader with SentencePiece.")
    ap.add_argument("--check", nargs=2, metavar=("MODEL", "JSONL"), required=True)
    ap.add_argument("--limit", type=int, default=200)
    args = ap.parse_args()
    model, corpus = args.check
    real, lite = Tokenizer(model), Tokenizer(model, force_lite=True)
    if real.backend != "sentencepiece":
        raise SystemExit("sentencepiece is not importable here; nothing to compare against")
    n = mismatches = tokens = 0
    sys.path.insert(0, __file__.rsplit("/", 1)[0] if "/" in __file__ else ".")
    from gen_conversations import training_text
    with open(corpus) as f:
        for line in f:
            if n >= args.limit:
                break
            conv = json.loads(line)
            text = training_text(conv)
            a, b = real.encode(text), lite.encode(text)
            tokens += len(a)
            if a != b:
                mismatches += 1
                k = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
                print(f"seed {conv['seed']}: differ at token {k}: {a[k:k + 5]} vs {b[k:k + 5]}")
            if lite.decode(b) != text:
                print(f"seed {conv['seed']}: lite decode does not round-trip")
                mismatches += 1
            n += 1
    print(f"{n} conversations, {tokens} tokens, {mismatches} mismatches")
    sys.exit(1 if mismatches else 0)


if __name__ == "__main__":
    main()
