#!/usr/bin/env node
// Writes tests/worker/tokenizer/testdata/smollm2_goldens.json: the token ids and decodes of
// the official Hugging Face `tokenizers` library (Node binding, version pinned in
// package.json) for every string of testdata/corpus.json, for the shared SmolLM2
// tokenizer.json and the variants of testdata/hf_variants.json.
//
//   cd tools/tokenizer_goldens && npm ci && node make_goldens.js [path/to/tokenizer.json]
//
// A variant is the tokenizer.json with `patch` applied: top-level keys replaced, except
// "model", whose keys are merged in; `added_tokens` entries merged into the added token of
// that content; `merges_as_pairs` rewrites "a b" merges as ["a", "b"]. The C++ test applies
// the same rules (tests/worker/tokenizer/hf_tokenizer_test.cc).
'use strict';

const crypto = require('crypto');
const fs = require('fs');
const path = require('path');
const { Tokenizer } = require('tokenizers');

const repo = path.resolve(__dirname, '..', '..');
const testdata = path.join(repo, 'tests', 'worker', 'tokenizer', 'testdata');
const sharedJson = process.argv[2] ||
    path.resolve(repo, '..', 'shared', 'tokenizers', 'smollm2', 'tokenizer.json');

function applyVariant(base, variant) {
  const json = JSON.parse(JSON.stringify(base));
  for (const [key, value] of Object.entries(variant.patch || {})) {
    if (key === 'model') {
      Object.assign(json.model, value);
    } else {
      json[key] = value;
    }
  }
  for (const [content, fields] of Object.entries(variant.added_tokens || {})) {
    const token = json.added_tokens.find((t) => t.content === content);
    if (!token) throw new Error(`variant ${variant.name}: no added token ${content}`);
    Object.assign(token, fields);
  }
  if (variant.merges_as_pairs) {
    json.model.merges = json.model.merges.map((m) => (typeof m === 'string' ? m.split(' ') : m));
  }
  return json;
}

async function run(tokenizer, corpus, addSpecialTokens) {
  const out = { ids: [], decoded: [], decoded_skip_special: [], decoded_drop_last: [] };
  for (const text of corpus) {
    const encoding = await tokenizer.encode(text, null, { addSpecialTokens });
    const ids = encoding.getIds();
    out.ids.push(ids);
    out.decoded.push(await tokenizer.decode(ids, false));
    out.decoded_skip_special.push(await tokenizer.decode(ids, true));
    out.decoded_drop_last.push(await tokenizer.decode(ids.slice(0, -1), false));
  }
  return out;
}

async function main() {
  const raw = fs.readFileSync(sharedJson);
  const base = JSON.parse(raw);
  const corpus = JSON.parse(fs.readFileSync(path.join(testdata, 'corpus.json'), 'utf8'));
  const variants = JSON.parse(fs.readFileSync(path.join(testdata, 'hf_variants.json'), 'utf8'));
  const version = require('tokenizers/package.json').version;
  const cases = [];
  for (const variant of variants) {
    const json = applyVariant(base, variant);
    const tokenizer = Tokenizer.fromString(JSON.stringify(json));
    const modes = [{ parse_special: true, add_special_tokens: false }];
    if (variant.add_special_tokens_too) modes.push({ parse_special: true, add_special_tokens: true });
    for (const mode of modes) {
      cases.push({ variant: variant.name, ...mode, ...(await run(tokenizer, corpus, mode.add_special_tokens)) });
    }
    if (variant.no_special_too) {
      // The Node binding cannot set split_special_tokens: drop the special added tokens
      // instead, which is the same thing when every added token is special (SmolLM2).
      json.added_tokens = json.added_tokens.filter((t) => !t.special);
      const plain = Tokenizer.fromString(JSON.stringify(json));
      cases.push({ variant: variant.name, parse_special: false, add_special_tokens: false,
                   ...(await run(plain, corpus, false)) });
    }
  }
  const golden = {
    generator: `tokenizers@${version} (Hugging Face, Node binding) via tools/tokenizer_goldens/make_goldens.js`,
    tokenizer: 'tokenizers/smollm2/tokenizer.json',
    tokenizer_sha256: crypto.createHash('sha256').update(raw).digest('hex'),
    corpus: 'corpus.json',
    cases,
  };
  // One id list or string per line keeps diffs readable.
  const field = (k, v) => (Array.isArray(v)
      ? `   ${JSON.stringify(k)}: [\n${v.map((x) => `    ${JSON.stringify(x)}`).join(',\n')}\n   ]`
      : `   ${JSON.stringify(k)}: ${JSON.stringify(v)}`);
  const formatCase = (c) => `  {\n${Object.entries(c).map(([k, v]) => field(k, v)).join(',\n')}\n  }`;
  const header = Object.entries(golden).filter(([k]) => k !== 'cases')
      .map(([k, v]) => ` ${JSON.stringify(k)}: ${JSON.stringify(v)}`);
  const lines = `{\n${header.join(',\n')},\n "cases": [\n${cases.map(formatCase).join(',\n')}\n ]\n}`;
  JSON.parse(lines);  // well-formed
  const outPath = path.join(testdata, 'smollm2_goldens.json');
  fs.writeFileSync(outPath, lines + '\n');
  console.log(`wrote ${outPath}: ${cases.length} cases x ${corpus.length} strings`);
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
