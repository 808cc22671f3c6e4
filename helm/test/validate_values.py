#!/usr/bin/env python3
"""Checks values against the chart's values.schema.json, as `helm install` does (Debian's
python3-jsonschema, draft 7), and that values.yaml documents every knob.

  validate_values.py --schema values.schema.json --good NAME=MERGED.json ...
                     --bad NAME=MERGED.json ... --documented values.yaml

--good: merged values (chart defaults + the scenario's files, as the renderer wrote them)
that must pass; --bad: NAME=MERGED.json=SOURCE.yaml, merged values that must be rejected
where SOURCE's "# rejected at: PATH" line says. Prints PASS/FAIL per file.
"""
import argparse
import json
import re
import sys

import jsonschema


def documented(path):
    """Keys of values.yaml with neither a comment right above them nor a documented
    enclosing map (a map whose key has a comment documents everything inside it)."""
    missing = []
    stack = []  # (indent, documented) of enclosing keys
    prev_comment = False
    for n, line in enumerate(open(path, encoding="utf-8"), 1):
        stripped = line.strip()
        if not stripped:
            prev_comment = False
            continue
        if stripped.startswith("#"):
            prev_comment = True
            continue
        m = re.match(r"^( *)([A-Za-z0-9_.\-/\"]+):", line)
        if not m:  # a list item or a continued value
            prev_comment = False
            continue
        indent = len(m.group(1))
        while stack and stack[-1][0] >= indent:
            stack.pop()
        doc = prev_comment or (stack and stack[-1][1])
        if not doc:
            missing.append(f"line {n}: {m.group(2)}")
        opens_map = stripped.endswith(":")
        if opens_map:
            stack.append((indent, bool(doc)))
        prev_comment = False
    return missing


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--schema", required=True)
    ap.add_argument("--good", nargs="*", default=[])
    ap.add_argument("--bad", nargs="*", default=[])
    ap.add_argument("--documented")
    o = ap.parse_args()
    failed = 0

    def report(ok, text):
        nonlocal failed
        print(("PASS " if ok else "FAIL ") + text)
        failed += 0 if ok else 1

    schema = json.load(open(o.schema, encoding="utf-8"))
    cls = jsonschema.validators.validator_for(schema)
    try:
        cls.check_schema(schema)
        report(True, f"values: {o.schema} is a valid {cls.__name__[:-9]} schema")
    except jsonschema.SchemaError as e:
        report(False, f"values: {o.schema} is not a valid schema: {e.message}")
        return 1
    validator = cls(schema)

    def errors(file):
        vals = json.load(open(file, encoding="utf-8"))
        return sorted(validator.iter_errors(vals), key=lambda e: list(e.absolute_path))

    def where(e):
        return "/".join(str(p) for p in e.absolute_path) or "(top)"

    for item in o.good:
        name, file = item.split("=", 1)
        errs = errors(file)
        report(not errs, f"values {name}: accepted by values.schema.json" +
               "".join(f"\n     {where(e)}: {e.message}" for e in errs))
    for item in o.bad:
        # NAME=MERGED.json=SOURCE.yaml; SOURCE's "# rejected at: PATH" names where the error
        # must be, so that a file is not rejected for some other reason.
        name, file, source = (item.split("=") + [""])[:3]
        errs = errors(file)
        m = re.search(r"^# rejected at: (\S+)", open(source, encoding="utf-8").read(), re.M) if source else None
        at = [e for e in errs if m is None or where(e) == m.group(1)]
        report(bool(at), f"values {name}: rejected by values.schema.json" +
               (f" at {where(at[0])}: {at[0].message[:120]}" if at else
                f" -- but {'it was accepted' if not errs else 'not at ' + m.group(1) + ': ' + '; '.join(where(e) for e in errs)}"))
    if o.documented:
        missing = documented(o.documented)
        report(not missing, f"values: every knob in {o.documented} is documented" +
               "".join(f"\n     {m}" for m in missing))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
