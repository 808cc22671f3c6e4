#!/usr/bin/env python3
"""Checks the Dockerfile without a container engine (ctest: dockerfile):

- stages: multi-stage, FROM images pinned and set through ARGs (the CPU variant swaps them);
- COPY sources exist in the build context and are not excluded by .dockerignore; COPY
  --from names an earlier stage;
- every RUN line parses as a shell script (sh -n) and passes shellcheck (when installed);
- the files RUN refers to exist: scripts in the repository, build/... outputs that the CMake
  files really produce (add_executable in that folder, or a library put in build/lib), and
  -D options CMakeLists.txt declares;
- the image runs as the non-root uid the Helm chart's podSecurityContext expects, and puts
  the binaries the chart runs on PATH (installed by path, or by the install rules' component).

Prints PASS/FAIL per check; exits 1 if any failed.
"""
import fnmatch
import glob
import json
import os
import re
import shutil
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
failed = 0


def check(name, ok, detail=""):
    global failed
    print(("PASS " if ok else "FAIL ") + "dockerfile: " + name + ("" if ok or not detail else f": {detail}"))
    failed += 0 if ok else 1


def instructions(path):
    """(line, INSTRUCTION, arguments) with continuations joined and comments dropped."""
    out, buf, start = [], "", 0
    for n, line in enumerate(open(path, encoding="utf-8"), 1):
        s = line.rstrip("\n")
        if not buf and (not s.strip() or s.lstrip().startswith("#")):
            continue
        if buf and s.lstrip().startswith("#"):
            continue  # comment lines inside a continued instruction
        if not buf:
            start = n
        if s.endswith("\\"):
            buf += s[:-1]  # Docker drops the backslash and the newline
            continue
        buf += s
        word, _, rest = buf.strip().partition(" ")
        out.append((start, word.upper(), rest.strip()))
        buf = ""
    return out


def read(rel):
    with open(os.path.join(REPO, rel), encoding="utf-8") as f:
        return f.read()


def main():
    dockerfile = os.path.join(REPO, "Dockerfile")
    ins = instructions(dockerfile)
    args = {}
    stages = []
    for n, word, rest in ins:
        if word == "ARG" and not stages:
            name, _, default = rest.partition("=")
            args[name] = default
    froms = [(n, rest) for n, word, rest in ins if word == "FROM"]
    resolved = []
    for n, rest in froms:
        parts = rest.split()
        image = re.sub(r"\$\{?(\w+)\}?", lambda m: args.get(m.group(1), m.group(0)), parts[0])
        resolved.append(image)
        if len(parts) == 3 and parts[1].upper() == "AS":
            stages.append(parts[2])
    check("multi-stage: a build stage and a runtime stage", len(froms) >= 2 and len(stages) >= 1,
          f"{len(froms)} FROM lines")
    check("FROM images come from ARGs with pinned defaults (the CPU variant overrides them)",
          all("$" in r.split()[0] for _, r in froms[:2])
          and all(re.search(r":[\w.-]+$", i) and not i.endswith(":latest") for i in resolved),
          ", ".join(resolved))
    check("builds on a CUDA devel image and runs on the CUDA runtime image by default",
          len(resolved) >= 2 and "cuda" in resolved[0] and "devel" in resolved[0]
          and "cuda" in resolved[-1] and "runtime" in resolved[-1], ", ".join(resolved))

    ignore = [l.strip() for l in read(".dockerignore").splitlines()
              if l.strip() and not l.startswith("#")] if os.path.exists(os.path.join(REPO, ".dockerignore")) else []

    def ignored(rel):
        return any(fnmatch.fnmatch(rel, p) or fnmatch.fnmatch(rel, p.rstrip("/") + "/*")
                   or rel.startswith(p.rstrip("/") + "/") for p in ignore)

    seen_stages = []
    shellcheck = shutil.which("shellcheck")
    for n, word, rest in ins:
        if word == "FROM":
            parts = rest.split()
            if len(parts) == 3:
                seen_stages.append(parts[2])
        elif word == "COPY":
            toks = rest.split()
            opts = [t for t in toks if t.startswith("--")]
            paths = [t for t in toks if not t.startswith("--")]
            src = paths[:-1]
            frm = [o.split("=", 1)[1] for o in opts if o.startswith("--from=")]
            if frm:
                check(f"line {n}: COPY --from={frm[0]} names an earlier stage", frm[0] in seen_stages)
                continue
            bad = [s for s in src if s != "." and (not glob.glob(os.path.join(REPO, s)) or ignored(s))]
            check(f"line {n}: COPY sources exist in the context ({' '.join(src)})", not bad, str(bad))
        elif word == "RUN":
            if rest.startswith("["):
                try:
                    json.loads(rest)
                    check(f"line {n}: RUN (exec form) is a JSON array", True)
                except ValueError as e:
                    check(f"line {n}: RUN (exec form) is a JSON array", False, str(e))
                continue
            script = rest
            r = subprocess.run(["sh", "-n"], input=script, text=True, capture_output=True)
            check(f"line {n}: RUN parses (sh -n)", r.returncode == 0, r.stderr.strip())
            r = subprocess.run(["bash", "-n"], input=script, text=True, capture_output=True)
            check(f"line {n}: RUN parses (bash -n)", r.returncode == 0, r.stderr.strip())
            if shellcheck:
                r = subprocess.run([shellcheck, "-s", "sh", "-"], input=script, text=True,
                                   capture_output=True)
                check(f"line {n}: RUN passes shellcheck", r.returncode == 0, r.stdout.strip())
            for script_path in re.findall(r"\b(?:bash|sh)\s+((?:tools|scripts)/[\w./-]+)", script):
                check(f"line {n}: {script_path} exists", os.path.isfile(os.path.join(REPO, script_path)))
            for out in sorted(set(re.findall(r"\bbuild/([\w./-]+)", script))):
                check(f"line {n}: build/{out} is produced by the CMake files", produced(out), out)
            for t in re.findall(r"--target((?:\s+[\w-]+)+)", script):
                for target in t.split():
                    check(f"line {n}: CMake target {target} exists", target_exists(target))
            for opt in re.findall(r"-D(RECALL_\w+)=", script):
                check(f"line {n}: CMake option {opt} exists",
                      re.search(rf"option\({opt}\b", read("CMakeLists.txt")) is not None)

    # The chart runs the image as podSecurityContext.runAsUser and calls the binaries by name.
    user = [rest for _, word, rest in ins if word == "USER"]
    values = read("helm/recall/values.yaml")
    m = re.search(r"^podSecurityContext:\n(?:  .*\n)*?  runAsUser: (\d+)", values, re.M)
    chart_uid = m.group(1) if m else None
    check("the image's USER is the non-root uid of the chart's podSecurityContext",
          bool(user) and user[-1].split(":")[0] == chart_uid and chart_uid != "0",
          f"USER {user[-1] if user else None}, chart runAsUser {chart_uid}")
    runtime = ins[[i for i, (_, w, _) in enumerate(ins) if w == "FROM"][-1]:]
    text = "\n".join(rest for _, _, rest in runtime)
    check(f"the runtime stage creates uid {chart_uid}", f"--uid {chart_uid}" in text)
    path_ok = re.search(r"PATH=/opt/recall/bin:", text) is not None
    chart_cmds = set(re.findall(r'command: \["(recall-[a-z]+)"\]', "".join(
        read(f"helm/recall/templates/{f}") for f in os.listdir(os.path.join(REPO, "helm/recall/templates")))))
    runs = "\n".join(r for _, w, r in ins if w == "RUN")
    installed = set(re.findall(r"/opt/recall/bin/([\w-]+)", runs))
    # `cmake --install build --prefix /opt/recall --component C`: the executables the install
    # rules put in bin/ for component C.
    for component in re.findall(r"cmake --install build --prefix /opt/recall --component (\w+)", runs):
        rules = re.findall(r"install\(TARGETS ([^)]*?)\s+RUNTIME DESTINATION \$\{CMAKE_INSTALL_BINDIR\}"
                           r"\s+COMPONENT (\w+)\)", read("packaging/CMakeLists.txt"))
        for targets, c in rules:
            if c == component:
                installed |= set(targets.split())
        check(f"the install component {component} puts executables in bin/", any(c == component for _, c in rules))
    check(f"the binaries the chart runs ({', '.join(sorted(chart_cmds))}) are on the image's PATH",
          path_ok and chart_cmds and chart_cmds <= installed, f"installed {sorted(installed)}")
    print("dockerfile check: " + ("all passed" if not failed else f"{failed} FAILED"))
    return 1 if failed else 0


def cmake_files():
    for root, dirs, files in os.walk(REPO):
        dirs[:] = [d for d in dirs if not d.startswith(".") and not d.startswith("build")
                   and d != "node_modules"]
        if "CMakeLists.txt" in files:
            yield os.path.relpath(root, REPO), open(os.path.join(root, "CMakeLists.txt"), encoding="utf-8").read()


def target_exists(target):
    return any(re.search(rf"add_(?:executable|library)\(\s*{re.escape(target)}\b", text)
               for _, text in cmake_files())


def produced(out):
    """build/<dir>/<name>: an executable of <dir>/CMakeLists.txt, or build/lib/lib<t>.so of a
    library whose LIBRARY_OUTPUT_DIRECTORY is ${CMAKE_BINARY_DIR}/lib."""
    folder, _, name = out.rpartition("/")
    if folder == "lib":
        m = re.fullmatch(r"lib([\w-]+)\.so", name)
        return bool(m) and any(
            re.search(rf"add_library\(\s*{m.group(1)}\b", text)
            and re.search(rf"set_target_properties\(\s*{m.group(1)}\b[^)]*LIBRARY_OUTPUT_DIRECTORY\s+"
                          r"\$\{CMAKE_BINARY_DIR\}/lib", text) for _, text in cmake_files())
    path = os.path.join(REPO, folder, "CMakeLists.txt")
    return os.path.isfile(path) and re.search(
        rf"add_executable\(\s*{re.escape(name)}\b", open(path, encoding="utf-8").read()) is not None


if __name__ == "__main__":
    sys.exit(main())
