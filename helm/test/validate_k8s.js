// Validates rendered manifests (a JSON array of objects) against the Kubernetes JSON schemas
// of the npm packages kubernetes-models and @kubernetes-models/prometheus-operator:
//   node validate_k8s.js SCENARIO manifests.json
// Each object is checked twice: by the package's schema validator (types, required fields,
// enums, formats) and for unknown fields, which that validator lets through but the API
// server rejects (kubectl's strict field validation): the allowed fields come from the
// package's TypeScript declarations. Prints PASS/FAIL per object; exits 1 on any failure.
"use strict";
const fs = require("fs");
const path = require("path");

const [scenario, file] = process.argv.slice(2);
const docs = JSON.parse(fs.readFileSync(file, "utf8"));

// apiVersion + kind -> module of the model class.
function modulePath(apiVersion, kind) {
  if (apiVersion.startsWith("monitoring.coreos.com/")) {
    return `@kubernetes-models/prometheus-operator/${apiVersion}/${kind}`;
  }
  return `kubernetes-models/${apiVersion}/${kind}`; // core group: kubernetes-models/v1/Service
}

// The .d.ts beside a module (the packages' export maps hide the .d.ts paths themselves).
function declarationFile(spec) {
  return require.resolve(spec, { paths: [__dirname] }).replace(/\.m?js$/, ".d.ts");
}

// ---- The field structure from the .d.ts files ------------------------------------------
// A type is {kind: "object", fields: {name: type}, index: type|null} | {kind: "array", of}
// | {kind: "leaf"} | {kind: "union", of: [types]} | {kind: "ref", file, name}.
const declCache = new Map();

function tokenize(src) {
  const re = /\s+|\/\*[\s\S]*?\*\/|\/\/[^\n]*|"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|[A-Za-z_$][\w$]*|-?\d+(?:\.\d+)?|./g;
  const out = [];
  for (const m of src.matchAll(re)) {
    const t = m[0];
    if (/^\s/.test(t) || t.startsWith("/*") || t.startsWith("//")) continue;
    out.push(t);
  }
  return out;
}

// Parses a type starting at toks[i]; returns [type, next index].
function parseType(toks, i, ctx) {
  const alts = [];
  if (toks[i] === "|") i++;
  for (;;) {
    let t;
    [t, i] = parsePrimary(toks, i, ctx);
    while (toks[i] === "[" && toks[i + 1] === "]") {
      t = { kind: "array", of: t };
      i += 2;
    }
    alts.push(t);
    if (toks[i] !== "|") break;
    i++;
  }
  return [alts.length === 1 ? alts[0] : { kind: "union", of: alts }, i];
}

function parsePrimary(toks, i, ctx) {
  const tok = toks[i];
  if (tok === "{") return parseObject(toks, i, ctx);
  if (tok === "(") {
    const [t, j] = parseType(toks, i + 1, ctx);
    return [t, j + 1];
  }
  if (tok === "Array" && toks[i + 1] === "<") {
    const [t, j] = parseType(toks, i + 2, ctx);
    if (toks[j] !== ">") throw new Error(`expected > at ${toks.slice(j, j + 5).join(" ")}`);
    return [{ kind: "array", of: t }, j + 1];
  }
  if (/^["'\d-]/.test(tok) || ["string", "number", "boolean", "any", "unknown", "object", "null",
    "undefined", "true", "false", "never"].includes(tok)) {
    return [{ kind: "leaf" }, i + 1];
  }
  if (/^[A-Za-z_$]/.test(tok)) {
    // A named type: imported from another declaration file, or declared in this one.
    let j = i + 1;
    if (toks[j] === "<") { // generic arguments (not used by the models' field types)
      let depth = 1;
      for (j++; depth > 0; j++) depth += toks[j] === "<" ? 1 : toks[j] === ">" ? -1 : 0;
    }
    const file = ctx.imports.get(tok) || ctx.file;
    return [{ kind: "ref", file, name: tok }, j];
  }
  throw new Error(`unexpected token ${tok} in ${ctx.file}`);
}

function parseObject(toks, i, ctx) {
  const obj = { kind: "object", fields: {}, index: null };
  i++; // {
  while (toks[i] !== "}") {
    if (toks[i] === "[") { // [key: string]: T;
      while (toks[i] !== "]") i++;
      i += 2; // ] :
      let t;
      [t, i] = parseType(toks, i, ctx);
      obj.index = t;
    } else {
      const name = toks[i].replace(/^["']|["']$/g, "");
      i++;
      if (toks[i] === "?") i++;
      if (toks[i] !== ":") throw new Error(`expected : after ${name} in ${ctx.file}`);
      let t;
      [t, i] = parseType(toks, i + 1, ctx);
      obj.fields[name] = t;
    }
    if (toks[i] === ";" || toks[i] === ",") i++;
  }
  return [obj, i + 1];
}

// Loads the declarations of one .d.ts file: {imports, types: name -> type}.
function loadDecls(file) {
  if (declCache.has(file)) return declCache.get(file);
  const src = fs.readFileSync(file, "utf8");
  const imports = new Map();
  for (const m of src.matchAll(/import\s*\{([^}]*)\}\s*from\s*"([^"]+)"/g)) {
    const spec = m[2];
    const target = spec.startsWith(".")
      ? path.resolve(path.dirname(file), spec) + ".d.ts"
      : declarationFile(spec);
    for (const name of m[1].split(",").map((s) => s.trim()).filter(Boolean)) {
      const [orig, alias] = name.split(/\s+as\s+/);
      imports.set((alias || orig).trim(), { file: target, name: orig.trim() });
    }
  }
  const ctx = { file, imports: new Map() };
  for (const [k, v] of imports) ctx.imports.set(k, v.file);
  const decls = { imports, types: new Map(), aliases: new Map() };
  declCache.set(file, decls);
  const toks = tokenize(src);
  for (let i = 0; i < toks.length; i++) {
    if (toks[i] === "interface") {
      const name = toks[i + 1];
      let j = i + 2;
      const bases = [];
      if (toks[j] === "extends") {
        for (j++; toks[j] !== "{"; j++) if (/^[A-Za-z_$]/.test(toks[j])) bases.push(toks[j]);
      }
      const [t] = parseObject(toks, j, ctx);
      if (bases.includes("TypeMeta")) {
        t.fields.apiVersion = t.fields.apiVersion || { kind: "leaf" };
        t.fields.kind = t.fields.kind || { kind: "leaf" };
      }
      decls.types.set(name, t);
    } else if (toks[i] === "type" && toks[i - 1] === "declare" && toks[i + 2] === "=") {
      const [t] = parseType(toks, i + 3, ctx);
      decls.types.set(toks[i + 1], t);
    } else if (toks[i] === "export" && toks[i + 1] === "{") { // export { IFoo as IIoK8sFoo }
      for (let j = i + 2; toks[j] !== "}"; j++) {
        if (toks[j + 1] === "as") {
          decls.aliases.set(toks[j + 2], toks[j]);
          j += 2;
        }
      }
    }
  }
  return decls;
}

function resolve(t) {
  for (let guard = 0; t.kind === "ref" && guard < 20; guard++) {
    const decls = loadDecls(t.file);
    const local = decls.aliases.get(t.name) || t.name;
    if (decls.types.has(local)) {
      t = decls.types.get(local);
      continue;
    }
    const imp = decls.imports.get(t.name);
    if (imp) {
      t = { kind: "ref", file: imp.file, name: imp.name };
      continue;
    }
    if (["ModelData", "TypeMeta", "Model"].includes(t.name)) return { kind: "leaf" };
    throw new Error(`type ${t.name} not found in ${t.file}`);
  }
  return t;
}

// Unknown fields of `value` under type `t`, as JSON paths.
function unknownFields(value, t, where, out) {
  t = resolve(t);
  if (t.kind === "union") {
    const objects = t.of.map(resolve).filter((x) => x.kind === "object" || x.kind === "array");
    if (objects.length === 0) return;
    let best = null;
    for (const alt of objects) {
      const found = [];
      unknownFields(value, alt, where, found);
      if (best === null || found.length < best.length) best = found;
    }
    out.push(...best);
    return;
  }
  if (t.kind === "array" && Array.isArray(value)) {
    value.forEach((v, i) => unknownFields(v, t.of, `${where}[${i}]`, out));
  } else if (t.kind === "object" && value && typeof value === "object" && !Array.isArray(value)) {
    for (const [k, v] of Object.entries(value)) {
      if (k in t.fields) unknownFields(v, t.fields[k], `${where}.${k}`, out);
      else if (t.index) unknownFields(v, t.index, `${where}.${k}`, out);
      else out.push(`${where}.${k}`);
    }
  }
}

// ---- Main -------------------------------------------------------------------------------
let failures = 0;
for (const doc of docs) {
  const what = `${doc.kind}/${doc.metadata && doc.metadata.name} (${doc.apiVersion})`;
  let mod;
  const rel = modulePath(doc.apiVersion || "", doc.kind || "");
  try {
    mod = require(rel);
  } catch (e) {
    console.log(`FAIL ${scenario}: schema ${what}: no schema for this apiVersion and kind (${rel})`);
    failures++;
    continue;
  }
  const Model = mod[doc.kind];
  const problems = [];
  try {
    new Model(doc).validate();
  } catch (e) {
    problems.push(e.message);
  }
  try {
    const declFile = declarationFile(rel);
    const decls = loadDecls(declFile);
    const root = [...decls.types.values()][0];
    const unknown = [];
    unknownFields(doc, root, "", unknown);
    if (unknown.length) problems.push(`unknown fields: ${unknown.join(", ")}`);
  } catch (e) {
    problems.push(`cannot read the field declarations: ${e.message}`);
  }
  if (problems.length) {
    console.log(`FAIL ${scenario}: schema ${what}: ${problems.join("; ")}`);
    failures++;
  } else {
    console.log(`PASS ${scenario}: schema ${what}`);
  }
}
process.exit(failures ? 1 : 0);
