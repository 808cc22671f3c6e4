#!/usr/bin/env python3
"""Asserts what matters in one rendering of the Recall chart (helm/test/check.sh runs it).

  assert_manifests.py --scenario NAME --manifests FILE --values MERGED.json --notes FILE
                      --namespace NS --repo ROOT [--api-versions LIST] [--json-out FILE]

Expectations come from the merged values, so every scenario runs the same assertions.
Prints one PASS or FAIL line per assertion; exits 1 if any failed. --json-out writes the
manifests as a JSON array for validate_k8s.js.
"""
import argparse
import os
import json
import re
import shutil
import subprocess
import sys

import yaml

DEPRECATED = {  # removed or deprecated group versions a chart must not use
    "extensions/v1beta1", "apps/v1beta1", "apps/v1beta2", "policy/v1beta1",
    "autoscaling/v2beta1", "autoscaling/v2beta2", "networking.k8s.io/v1beta1",
    "batch/v1beta1", "rbac.authorization.k8s.io/v1beta1", "storage.k8s.io/v1beta1",
    "monitoring.coreos.com/v1alpha1",
}
ALLOWED = {"v1", "apps/v1", "policy/v1", "autoscaling/v2", "networking.k8s.io/v1",
           "monitoring.coreos.com/v1"}
# Flags the chart passes before the binaries accept them, and why.
PENDING_FLAGS = {}
DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


class Checker:
    def __init__(self, scenario):
        self.scenario = scenario
        self.failed = 0

    def check(self, name, ok, detail=""):
        if ok:
            print(f"PASS {self.scenario}: {name}")
        else:
            self.failed += 1
            print(f"FAIL {self.scenario}: {name}" + (f": {detail}" if detail else ""))
        return ok

    def note(self, text):
        print(f"NOTE {self.scenario}: {text}")


def accepted_flags(binary, repo):
    """The flags a binary accepts, from its --help: lines "  --name VALUE" (a valued flag) or
    "  --name" (a switch), either after its short form ("  -m, --name VALUE"). The binary comes from $RECALL_<NAME>_BINARY (set by ctest), else
    the build folder."""
    env = "RECALL_" + binary.replace("recall-", "").upper() + "_BINARY"
    default = {"recall-worker": "build/worker/service/recall-worker",
               "recall-coordinator": "build/coordinator/recall-coordinator"}[binary]
    path = os.environ.get(env) or os.path.join(repo, default)
    out = subprocess.run([path, "--help"], capture_output=True, text=True, check=True).stdout
    valued, switches = set(), set()
    for m in re.finditer(r"^  (?:-[a-z], )?--([a-z0-9-]+)( [A-Z][A-Z:,.\[\]]*)?", out, re.M):
        (valued if m.group(2) else switches).add(m.group(1))
    if not valued:
        raise SystemExit(f"no flags in {path} --help")
    return valued, switches


def selects(selector, labels):
    """Whether a label selector (a plain map, or matchLabels/matchExpressions) matches."""
    if selector is None:
        return False
    if "matchLabels" in selector or "matchExpressions" in selector:
        match = selector.get("matchLabels") or {}
        exprs = selector.get("matchExpressions") or []
    else:
        match, exprs = selector, []
    if not match and not exprs:
        return True
    if any(labels.get(k) != v for k, v in match.items()):
        return False
    for e in exprs:
        key, op, vals = e["key"], e["operator"], e.get("values") or []
        if op == "In" and labels.get(key) not in vals:
            return False
        if op == "NotIn" and labels.get(key) in vals:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True


def expand(arg, env):
    """Kubernetes' $(VAR) expansion of container args ($$ escapes)."""
    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
                  lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)), arg)


def container_env(container, configmaps):
    env = {}
    for src in container.get("envFrom") or []:
        ref = src.get("configMapRef")
        if ref:
            env.update(configmaps.get(ref["name"], {}))
    for e in container.get("env") or []:
        if "value" in e:
            env[e["name"]] = e["value"]
    return env


def flags_of(args):
    """--name=value args as {name: value}; --switch as {name: None}."""
    out = {}
    for a in args:
        if a.startswith("--"):
            name, eq, value = a[2:].partition("=")
            out[name] = value if eq else None
    return out


def port_number(container, name_or_number):
    for p in container.get("ports") or []:
        if p.get("name") == name_or_number or p.get("containerPort") == name_or_number:
            return p["containerPort"]
    return None


def main():
    ap = argparse.ArgumentParser()
    for a in ("--scenario", "--manifests", "--values", "--notes", "--namespace", "--repo"):
        ap.add_argument(a, required=True)
    ap.add_argument("--api-versions", default="")
    ap.add_argument("--json-out")
    o = ap.parse_args()
    c = Checker(o.scenario)
    docs = [d for d in yaml.safe_load_all(open(o.manifests, encoding="utf-8")) if d]
    values = json.load(open(o.values, encoding="utf-8"))
    notes = open(o.notes, encoding="utf-8").read()
    if o.json_out:
        json.dump(docs, open(o.json_out, "w", encoding="utf-8"), indent=1)
    ns = o.namespace
    V, W, C, R = values, values["worker"], values["coordinator"], values["redis"]

    by_kind = {}
    for d in docs:
        by_kind.setdefault(d["kind"], []).append(d)

    def one(kind, component):
        found = [d for d in by_kind.get(kind, [])
                 if d["metadata"].get("labels", {}).get("app.kubernetes.io/component") == component]
        return found[0] if len(found) == 1 else None

    # ---- API versions and names ------------------------------------------------------
    used = sorted({d["apiVersion"] for d in docs})
    c.check("no deprecated API versions", not DEPRECATED & set(used),
            f"uses {sorted(DEPRECATED & set(used))}")
    c.check("only current API versions (" + ", ".join(used) + ")", set(used) <= ALLOWED,
            f"unexpected {sorted(set(used) - ALLOWED)}")
    seen, bad_names = set(), []
    for d in docs:
        key, name = (d["kind"], d["metadata"]["name"]), d["metadata"]["name"]
        if key in seen:
            bad_names.append(f"duplicate {key}")
        seen.add(key)
        limit = {"Service": 63, "StatefulSet": 52}.get(d["kind"], 253)
        pattern = DNS1123_LABEL if d["kind"] == "Service" else DNS1123_SUBDOMAIN
        if len(name) > limit or not pattern.match(name):
            bad_names.append(f"{d['kind']}/{name} (limit {limit})")
        if d["metadata"].get("namespace") not in (None, ns):
            bad_names.append(f"{d['kind']}/{name} in namespace {d['metadata']['namespace']}")
        for k, v in (d["metadata"].get("labels") or {}).items():
            if not isinstance(v, str) or len(v) > 63 or not LABEL_VALUE.match(v):
                bad_names.append(f"{d['kind']}/{name} label {k}={v!r}")
    c.check("names, namespaces and labels are valid and unique", not bad_names, "; ".join(bad_names))

    configmaps = {d["metadata"]["name"]: {k: str(v) for k, v in (d.get("data") or {}).items()}
                  for d in by_kind.get("ConfigMap", [])}
    secrets = {d["metadata"]["name"]: d for d in by_kind.get("Secret", [])}
    services = by_kind.get("Service", [])
    workloads = by_kind.get("Deployment", []) + by_kind.get("StatefulSet", [])

    def pod_labels(w):
        return w["spec"]["template"]["metadata"].get("labels") or {}

    # ---- Worker StatefulSet ----------------------------------------------------------
    sts = one("StatefulSet", "worker")
    if not c.check("one worker StatefulSet", sts is not None):
        return finish(c)
    wpod = sts["spec"]["template"]["spec"]
    worker = next((x for x in wpod["containers"] if x["name"] == "worker"), None)
    if not c.check("the worker StatefulSet runs a recall-worker container",
                   worker is not None and worker.get("command") == ["recall-worker"]):
        return finish(c)
    wenv = container_env(worker, configmaps)
    wargs = [expand(a, wenv) for a in worker.get("args") or []]
    wflags = flags_of(wargs)
    tp = W["tp"]
    gpu = W["gpu"]["resourceName"]
    res = worker.get("resources") or {}
    if W["gpu"]["enabled"]:
        lim, req = (res.get("limits") or {}).get(gpu), (res.get("requests") or {}).get(gpu)
        c.check(f"worker GPU limit {gpu} equals tp ({tp})", lim == tp and req in (None, tp),
                f"limits {lim!r}, requests {req!r}")
    else:
        c.check("worker without GPUs requests none",
                gpu not in (res.get("limits") or {}) and gpu not in (res.get("requests") or {}))
    # tp = 1 is the worker's default and passes no flag, so a single-GPU worker runs today;
    # tp > 1 passes --tp (recall-worker --tp arrives with issue 6).
    c.check(f"worker --tp equals tp ({tp})",
            wflags.get("tp") == (str(tp) if tp > 1 else None), f"--tp={wflags.get('tp')}")
    gpu = W["gpu"]["enabled"]
    c.check(f"worker --device is cuda exactly when gpu.enabled ({gpu})",
            wflags.get("device") == ("cuda" if gpu else None), f"--device={wflags.get('device')}")
    for key, switch in (("batchInvariant", "no-batch-invariant"), ("cudaGraphs", "no-cuda-graphs")):
        c.check(f"worker --{switch} exactly when {key} is false ({W[key]})",
                (switch in wflags) == (not W[key]), f"args {wargs}")
    c.check(f"worker replicas = {W['replicas']}", sts["spec"].get("replicas") == W["replicas"])
    listen = wflags.get("listen", "")
    wgrpc = port_number(worker, "grpc")
    c.check("worker listens on all interfaces at its grpc port",
            listen == f"0.0.0.0:{wgrpc}" and wgrpc == W["ports"]["grpc"], f"--listen={listen}")
    c.check("worker --metrics-port is its metrics port",
            wflags.get("metrics-port") == str(port_number(worker, "metrics")))

    # Flags: every one must be accepted by the binary, with every $(VAR) resolved.
    def check_flags(binary, args):
        valued, switches = accepted_flags(binary, o.repo)
        pending = PENDING_FLAGS.get(binary, {})
        bad, waiting = [], []
        for a in args:
            if not a.startswith("--"):
                bad.append(f"{a} (not a flag)")
                continue
            name, eq, value = a[2:].partition("=")
            if "$(" in value:
                bad.append(f"{a} (unresolved variable)")
            elif re.fullmatch(r"[-+]?[0-9.]+e[-+]?[0-9]+", value):
                bad.append(f"{a} (exponent notation)")
            elif name in valued and eq and value != "":
                continue
            elif name in switches and not eq:
                continue
            elif name in pending:
                waiting.append(f"--{name}: {pending[name]}")
            else:
                bad.append(a)
        c.check(f"{binary}: every flag is one its --help lists, with its value resolved",
                not bad, ", ".join(bad))
        for w in waiting:
            c.note(f"{binary} does not accept this yet: {w}")

    check_flags("recall-worker", wargs)

    # Model volume.
    m = W["model"]
    mounts = {vm["name"]: vm for vm in worker.get("volumeMounts") or []}
    vols = {v["name"]: v for v in wpod.get("volumes") or []}
    vct = {t["metadata"]["name"]: t for t in sts["spec"].get("volumeClaimTemplates") or []}
    mm = mounts.get("model")
    c.check("worker --model lies in the model volume",
            mm is not None and mm["mountPath"] == m["mountPath"]
            and wflags.get("model", "").startswith(m["mountPath"].rstrip("/") + "/"),
            f"--model={wflags.get('model')}, mount {mm}")
    vtype = m["volume"]["type"]
    if vtype == "hostPath":
        ok = vols.get("model", {}).get("hostPath", {}).get("path") == m["volume"]["hostPath"]
    elif m["volume"].get("existingClaim"):
        ok = vols.get("model", {}).get("persistentVolumeClaim", {}).get("claimName") == \
            m["volume"]["existingClaim"]
    else:
        ok = "model" in vct and "model" not in vols
    c.check(f"worker model volume is the configured {vtype}", ok)

    # Init container fetching the model with a token from a Secret.
    inits = wpod.get("initContainers") or []
    dl = m["download"]
    if dl["enabled"]:
        fetch = next((x for x in inits if x["name"] == "fetch-model"), None)
        if c.check("model download init container is present", fetch is not None):
            fenv = {e["name"]: e for e in fetch.get("env") or []}
            c.check("the init container writes into the model volume at --model's folder",
                    any(vm["name"] == "model" and vm["mountPath"] == m["mountPath"]
                        and not vm.get("readOnly") for vm in fetch.get("volumeMounts") or [])
                    and fenv.get("MODEL_DIR", {}).get("value") == wflags.get("model"))
            tok = dl["token"]
            if tok.get("existingSecret") or tok.get("value"):
                ref = (fenv.get("MODEL_TOKEN", {}).get("valueFrom") or {}).get("secretKeyRef") or {}
                name = ref.get("name")
                exists = name == tok.get("existingSecret") or (
                    name in secrets and ref.get("key") in (secrets[name].get("data") or {}))
                c.check("the init container reads the token from a Secret", exists and
                        ref.get("key") == tok["key"], f"secretKeyRef {ref}")
            for x in inits:
                check_scripts(c, x)
    else:
        c.check("no model download init container", not inits)

    # Headless Service giving the workers their stable names.
    head = next((s for s in services if s["metadata"]["name"] == sts["spec"].get("serviceName")), None)
    c.check("the worker StatefulSet's serviceName is a headless Service selecting its pods",
            head is not None and head["spec"].get("clusterIP") == "None"
            and selects(head["spec"].get("selector"), pod_labels(sts))
            and any(p["name"] == "grpc" and p["port"] == W["ports"]["grpc"]
                    for p in head["spec"]["ports"]))

    # ---- Probes: the gRPC health service on the gRPC port ------------------------------
    def check_probes(who, container, grpc_port, tls):
        kinds = ["readinessProbe", "livenessProbe"] + (["startupProbe"] if who == "worker" else [])
        bad = []
        for k in kinds:
            p = container.get(k)
            if p is None:
                bad.append(f"{k} missing")
            elif tls:
                t = (p.get("tcpSocket") or {}).get("port")
                if port_number(container, t) != grpc_port:
                    bad.append(f"{k} is not a TCP check of the gRPC port: {p}")
            else:
                g = p.get("grpc") or {}
                if g.get("port") != grpc_port or g.get("service", "") != "" or len(
                        {"grpc", "httpGet", "tcpSocket", "exec"} & set(p)) != 1:
                    bad.append(f"{k} is not a gRPC health check of port {grpc_port}: {p}")
        what = ("TCP checks of the gRPC port (TLS: kubelet gRPC probes are plaintext only)"
                if tls else "probes use the gRPC health service on the gRPC port")
        c.check(f"{who} {what} ({grpc_port})", not bad, "; ".join(bad))

    check_probes("worker", worker, wgrpc, False)

    # ---- Coordinator -----------------------------------------------------------------
    dep = one("Deployment", "coordinator")
    if not c.check("one coordinator Deployment", dep is not None):
        return finish(c)
    cpod = dep["spec"]["template"]["spec"]
    coord = next((x for x in cpod["containers"] if x["name"] == "coordinator"), None)
    if not c.check("it runs a recall-coordinator container",
                   coord is not None and coord.get("command") == ["recall-coordinator"]):
        return finish(c)
    cenv = container_env(coord, configmaps)
    cargs = [expand(a, cenv) for a in coord.get("args") or []]
    cflags = flags_of(cargs)
    check_flags("recall-coordinator", cargs)
    cgrpc = port_number(coord, "grpc")
    c.check("coordinator listens on all interfaces at its grpc port",
            cflags.get("listen") == f"0.0.0.0:{cgrpc}" and cgrpc == C["ports"]["grpc"])
    check_probes("coordinator", coord, cgrpc, C["tls"]["enabled"])
    chttp = C["ports"].get("http", 0)
    if chttp:
        c.check("coordinator serves the OpenAI HTTP API on all interfaces at its http port",
                cflags.get("http-listen") == f"0.0.0.0:{chttp}" and port_number(coord, "http") == chttp,
                f"--http-listen={cflags.get('http-listen')}")
    else:
        c.check("no HTTP API with ports.http 0", "http-listen" not in cflags)
    hpa_on = C["autoscaling"]["enabled"]
    if hpa_on:
        c.check("with the autoscaler the Deployment leaves replicas to it",
                "replicas" not in dep["spec"])
    else:
        c.check(f"coordinator replicas = {C['replicas']}", dep["spec"].get("replicas") == C["replicas"])

    # Redis as the session store when several replicas share sessions.
    store = cflags.get("store")
    shared = C["replicas"] > 1 or hpa_on
    if shared:
        c.check(f"{'autoscaled' if hpa_on else str(C['replicas'])} coordinator replicas use "
                "--store redis://HOST:PORT", bool(store) and re.fullmatch(
                    r"redis://[^:/]+:\d+", store or "") is not None, f"--store={store}")
    if R["enabled"]:
        host, _, port = (store or "redis://:").removeprefix("redis://").partition(":")
        svc = next((s for s in services if s["metadata"]["name"] == host), None)
        redis_sts = one("StatefulSet", "redis")
        ok = (svc is not None and redis_sts is not None
              and any(p["port"] == int(port or 0) for p in svc["spec"]["ports"])
              and selects(svc["spec"]["selector"], pod_labels(redis_sts)))
        c.check("--store names the chart's Redis Service and port, which select the Redis pod", ok,
                f"--store={store}")
        if redis_sts:
            cmd = " ".join(redis_sts["spec"]["template"]["spec"]["containers"][0].get("command", []))
            c.check("Redis is durable (appendonly yes, appendfsync always)",
                    "--appendonly yes" in cmd and "--appendfsync always" in cmd, cmd)
    elif R["externalUrl"]:
        c.check("--store is the external Redis URL", store == R["externalUrl"], f"--store={store}")
    else:
        c.check("without Redis there is no --store (SQLite in --data-dir) and a single replica",
                store is None and not shared)
        c.check("no Redis objects without redis.enabled", one("StatefulSet", "redis") is None)
    cm = {vm["mountPath"]: vm for vm in coord.get("volumeMounts") or []}
    c.check("--data-dir is a mounted volume", cflags.get("data-dir") in cm)

    # Workers: the coordinator lists every worker pod's stable DNS name.
    hname = sts["spec"]["serviceName"]
    want = [f"{sts['metadata']['name']}-{i}.{hname}.{ns}.svc.{V['clusterDomain']}:{W['ports']['grpc']}"
            for i in range(W["replicas"])]
    got = (cflags.get("workers") or "").split(",") if cflags.get("workers") else []
    c.check(f"--workers lists the {W['replicas']} worker pods by their headless-Service names",
            got == want, f"got {got}, want {want}")

    # API keys and TLS files come from mounted Secrets.
    def mounted_file(path, key):
        for vm in coord.get("volumeMounts") or []:
            if path.startswith(vm["mountPath"].rstrip("/") + "/"):
                vol = next((v for v in cpod.get("volumes") or [] if v["name"] == vm["name"]), {})
                return vol.get("secret", {}).get("secretName")
        return None

    if C["apiKeys"]["enabled"]:
        path = cflags.get("api-keys") or ""
        sname = mounted_file(path, "api-keys")
        ok = sname is not None
        if C["apiKeys"]["existingSecret"]:
            ok = ok and sname == C["apiKeys"]["existingSecret"]
        else:
            import base64
            data = (secrets.get(sname) or {}).get("data") or {}
            text = base64.b64decode(data.get("api-keys", "")).decode()
            want_lines = [f"{k['key']} {k['tenant']}" for k in C["apiKeys"]["keys"]]
            ok = ok and text.splitlines() == want_lines
        c.check("--api-keys reads a mounted Secret holding '<key> <tenant>' lines", ok, path)
    else:
        c.check("no --api-keys without apiKeys.enabled", "api-keys" not in cflags)
    # The cluster token: the coordinator and every worker read the same mounted Secret.
    def token_secret(container, pod, flags):
        path = flags.get("cluster-token-file") or ""
        for vm in container.get("volumeMounts") or []:
            if path.startswith(vm["mountPath"].rstrip("/") + "/"):
                vol = next((v for v in pod.get("volumes") or [] if v["name"] == vm["name"]), {})
                return vol.get("secret", {}).get("secretName")
        return None

    names = [token_secret(coord, cpod, cflags), token_secret(worker, wpod, wflags)]
    existing = V.get("clusterToken", {}).get("existingSecret")
    c.check("--cluster-token-file on the coordinator and the workers reads one Secret",
            names[0] is not None and names[0] == names[1] and (not existing or names[0] == existing),
            f"{names}")
    # A stopping pod lets its running turns end (--shutdown-grace) within its grace period.
    for name, pod, flags in (("coordinator", cpod, cflags), ("worker", wpod, wflags)):
        grace = pod.get("terminationGracePeriodSeconds")
        c.check(f"the {name}'s --shutdown-grace ends 5 s before its pod's grace period",
                grace is not None and flags.get("shutdown-grace") == str(max(0, grace - 5)),
                f"{flags.get('shutdown-grace')} for {grace}")
    # Secrets' files are not for every user of the pod (the binaries warn when they are).
    modes = [v["secret"].get("defaultMode") for pod in (cpod, wpod)
             for v in pod.get("volumes") or []
             if "secret" in v and v["name"] in ("cluster-token", "api-keys", "tls")]
    c.check("the cluster token, API keys and TLS key are mounted mode 0400 (0440 with fsGroup)",
            modes and all(m == 0o400 for m in modes), f"{modes}")
    if not existing:
        import base64
        data = (secrets.get(names[0]) or {}).get("data") or {}
        token = base64.b64decode(data.get("token", "")).decode()
        c.check("the chart makes that Secret: a token of 16 or more printable characters",
                len(token) >= 16 and token.isprintable() and " " not in token,
                f"{len(token)} characters")
    if C["tls"]["enabled"]:
        names = [mounted_file(cflags.get(f) or "", f) for f in ("tls-cert", "tls-key")]
        c.check("--tls-cert/--tls-key come from the TLS Secret",
                names == [C["tls"]["secretName"]] * 2, str(names))
        c.check("--tls-client-ca exactly when clientCA", ("tls-client-ca" in cflags) == C["tls"]["clientCA"])
    else:
        c.check("no TLS flags without tls.enabled", not {"tls-cert", "tls-key", "tls-client-ca"} & set(cflags))

    # ---- Services select the right pods and ports ---------------------------------------
    bad = []
    for s in services:
        sel = s["spec"].get("selector")
        targets = [w for w in workloads if selects(sel, pod_labels(w))]
        if len(targets) != 1:
            bad.append(f"Service {s['metadata']['name']} selects {len(targets)} workloads")
            continue
        ctrs = targets[0]["spec"]["template"]["spec"]["containers"]
        for p in s["spec"]["ports"]:
            if not any(port_number(x, p.get("targetPort", p["port"])) for x in ctrs):
                bad.append(f"Service {s['metadata']['name']} port {p['name']} targets nothing")
    c.check("every Service selects one workload and targets its container ports", not bad, "; ".join(bad))
    csvc = next((s for s in services if s["metadata"]["name"] == dep["metadata"]["name"]), None)
    want_ports = {"grpc": C["ports"]["grpc"], "metrics": C["ports"]["metrics"]}
    if C["ports"].get("http", 0):
        want_ports["http"] = C["ports"]["http"]
    c.check(f"the coordinator Service exposes ports {', '.join(sorted(want_ports))}",
            csvc is not None and {p["name"]: p["port"] for p in csvc["spec"]["ports"]} == want_ports)

    # ---- ServiceMonitor -------------------------------------------------------------------
    sms = by_kind.get("ServiceMonitor", [])
    operator = "monitoring.coreos.com/v1" in o.api_versions.split(",")
    want_sm = V["serviceMonitor"]["enabled"] and (V["serviceMonitor"]["force"] or operator)
    c.check(f"ServiceMonitor {'rendered' if want_sm else 'absent'} (enabled="
            f"{V['serviceMonitor']['enabled']}, force={V['serviceMonitor']['force']}, "
            f"operator API={operator})", len(sms) == (1 if want_sm else 0))
    for sm in sms:
        spec = sm["spec"]
        matched = [s for s in services if selects(spec["selector"], s["metadata"].get("labels") or {})]
        names = {s["metadata"]["name"] for s in matched}
        c.check("the ServiceMonitor selects the coordinator and worker metrics Services (labels match)",
                names == {dep["metadata"]["name"], hname}, f"selects {sorted(names)}")
        eps = spec.get("endpoints") or []
        ok = bool(eps) and all(any(p.get("name") == ep.get("port") for p in s["spec"]["ports"])
                               for s in matched for ep in eps)
        c.check("each selected Service has the endpoint's port name "
                f"({', '.join(str(ep.get('port')) for ep in eps)})", ok and all(
                    port_number(w["spec"]["template"]["spec"]["containers"][0], "metrics")
                    for w in (dep, sts)))
        nsel = spec.get("namespaceSelector") or {}
        c.check("the ServiceMonitor looks in the release namespace",
                ns in (nsel.get("matchNames") or []) or nsel.get("any") is True or not nsel)
        c.check("the ServiceMonitor carries serviceMonitor.labels",
                all((sm["metadata"].get("labels") or {}).get(k) == v
                    for k, v in V["serviceMonitor"]["labels"].items()))

    # ---- NetworkPolicy: only the coordinator reaches workers (and Redis) ---------------
    nps = by_kind.get("NetworkPolicy", [])
    if V["networkPolicy"]["enabled"]:
        def only_coordinator_reaches(target, port_name, port_num):
            pols = [p for p in nps if selects(p["spec"]["podSelector"], pod_labels(target))]
            if not pols or not all("Ingress" in p["spec"].get("policyTypes", ["Ingress"]) for p in pols):
                return False, "no ingress policy selects the pods"
            allowed = []
            for p in pols:
                for rule in p["spec"].get("ingress") or []:
                    ports = rule.get("ports")
                    if ports and not any(x.get("port") in (port_name, port_num) for x in ports):
                        continue
                    allowed.append(rule.get("from"))
            if not allowed:
                return False, "nobody may connect"
            for peers in allowed:
                if not peers:
                    return False, "a rule admits every source"
                for peer in peers:
                    if set(peer) != {"podSelector"} or not selects(peer["podSelector"], pod_labels(dep)) \
                            or selects(peer["podSelector"], pod_labels(target)):
                        return False, f"a rule admits {peer}"
            return True, ""

        ok, why = only_coordinator_reaches(sts, "grpc", W["ports"]["grpc"])
        c.check("NetworkPolicy: only coordinator pods reach the workers' gRPC port", ok, why)
        cpols = [p for p in nps if selects(p["spec"]["podSelector"], pod_labels(dep))]
        admitted = {x.get("port") for p in cpols for rule in p["spec"].get("ingress") or []
                    for x in rule.get("ports") or []}
        api = {"grpc"} | ({"http"} if C["ports"].get("http", 0) else set())
        c.check(f"NetworkPolicy admits the coordinator's API ports ({', '.join(sorted(api))})",
                api <= admitted and ("http" in admitted) == ("http" in api), str(sorted(admitted)))
        if R["enabled"]:
            ok, why = only_coordinator_reaches(one("StatefulSet", "redis"), "redis", R["port"])
            c.check("NetworkPolicy: only coordinator pods reach Redis", ok, why)
    else:
        c.check("no NetworkPolicy when disabled", not nps)

    # ---- Security contexts, resources, images -------------------------------------------
    bad = []
    for w in workloads:
        pod = w["spec"]["template"]["spec"]
        psc = pod.get("securityContext") or {}
        if pod.get("automountServiceAccountToken") is not False:
            bad.append(f"{w['metadata']['name']}: service account token mounted")
        if pod.get("enableServiceLinks") is not False:
            bad.append(f"{w['metadata']['name']}: Service links would add RECALL_* variables")
        for x in (pod.get("initContainers") or []) + pod["containers"]:
            sc = x.get("securityContext") or {}
            who = f"{w['metadata']['name']}/{x['name']}"
            if not (sc.get("runAsNonRoot", psc.get("runAsNonRoot")) is True):
                bad.append(f"{who}: may run as root")
            if sc.get("runAsUser", psc.get("runAsUser")) == 0:
                bad.append(f"{who}: runAsUser 0")
            if sc.get("allowPrivilegeEscalation") is not False:
                bad.append(f"{who}: privilege escalation allowed")
            if sc.get("readOnlyRootFilesystem") is not True:
                bad.append(f"{who}: writable root filesystem")
            if "ALL" not in ((sc.get("capabilities") or {}).get("drop") or []):
                bad.append(f"{who}: capabilities not dropped")
            r = x.get("resources") or {}
            for part in ("requests", "limits"):
                if not {"cpu", "memory"} <= set(r.get(part) or {}):
                    bad.append(f"{who}: no cpu/memory {part}")
            image = x.get("image", "")
            if ":" not in image.rsplit("/", 1)[-1] or image.endswith(":latest"):
                bad.append(f"{who}: image {image!r} has no pinned tag")
    c.check("every pod: no service account token, no Service links; every container: non-root, "
            "no privilege escalation, read-only root, capabilities dropped, cpu/memory requests "
            "and limits, a pinned image tag", not bad, "; ".join(bad))

    # ---- HPA and PDBs -------------------------------------------------------------------
    hpas = by_kind.get("HorizontalPodAutoscaler", [])
    if hpa_on:
        h = hpas[0] if len(hpas) == 1 else None
        c.check("the HPA scales the coordinator Deployment (autoscaling/v2)",
                h is not None and h["apiVersion"] == "autoscaling/v2"
                and h["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment",
                                                    "name": dep["metadata"]["name"]}
                and h["spec"]["minReplicas"] <= h["spec"]["maxReplicas"])
    else:
        c.check("no HPA when autoscaling is off", not hpas)
    pdbs = by_kind.get("PodDisruptionBudget", [])
    want = [x for x, on in ((dep, C["podDisruptionBudget"]["enabled"]),
                            (sts, W["podDisruptionBudget"]["enabled"])) if on]
    c.check(f"{len(want)} PodDisruptionBudget(s), each selecting its workload's pods",
            len(pdbs) == len(want) and all(any(selects(p["spec"]["selector"], pod_labels(x)) and
                                               not selects(p["spec"]["selector"], pod_labels(y))
                                               for p in pdbs)
                                           for x in want for y in workloads if y is not x))

    # ---- ConfigMap and rollouts -----------------------------------------------------------
    for w in (dep, sts):
        ann = w["spec"]["template"]["metadata"].get("annotations") or {}
        for key in ("checksum/config", "checksum/cluster-token"):
            c.check(f"{w['metadata']['name']} rolls when its settings or the cluster token change ({key})",
                    re.fullmatch(r"[0-9a-f]{64}", ann.get(key, "")) is not None)
    # One coordinator per data directory: a surge pod on a claimed /data is refused.
    strategy = (dep["spec"].get("strategy") or {}).get("type", "RollingUpdate")
    want = "Recreate" if C["persistence"]["existingClaim"] else "RollingUpdate"
    c.check(f"the coordinator Deployment's strategy is {want}", strategy == want, strategy)

    # ---- NOTES.txt tells how to reach it with the recall CLI -----------------------------
    svc_name, port = dep["metadata"]["name"], C["ports"]["grpc"]
    ok = (f"recall chat --server 127.0.0.1:{port}" in notes
          and f"port-forward svc/{svc_name} {port}:{port}" in notes
          and f"recall chat --server {svc_name}.{ns}.svc.{V['clusterDomain']}:{port}" in notes)
    if C["apiKeys"]["enabled"]:
        ok = ok and "--api-key" in notes
    if C["tls"]["enabled"]:
        ok = ok and "--tls-ca" in notes
    c.check("NOTES.txt shows `recall chat --server` for a port-forward and in-cluster", ok)
    http = C["ports"].get("http", 0)
    if http:
        scheme = "https" if C["tls"]["enabled"] else "http"
        c.check("NOTES.txt forwards the HTTP port and shows the OpenAI base URL",
                f" {http}:{http} &" in notes and f"{scheme}://127.0.0.1:{http}/v1" in notes)
    else:
        c.check("NOTES.txt names no HTTP API when it is off", "OpenAI" not in notes)
    return finish(c)


def check_scripts(c, container):
    """`sh -c SCRIPT` in a container: sh -n, and shellcheck when it is installed."""
    cmd = (container.get("command") or []) + (container.get("args") or [])
    if len(cmd) < 3 or cmd[0] not in ("sh", "/bin/sh", "bash") or cmd[1] != "-c":
        return
    script = cmd[2]
    r = subprocess.run(["sh", "-n"], input=script, text=True, capture_output=True)
    c.check(f"{container['name']}: its shell script parses (sh -n)", r.returncode == 0, r.stderr.strip())
    if shutil.which("shellcheck"):
        r = subprocess.run(["shellcheck", "-s", "sh", "-"], input=script, text=True, capture_output=True)
        c.check(f"{container['name']}: shellcheck finds nothing in its script", r.returncode == 0,
                r.stdout.strip())


def finish(c):
    sys.exit(1 if c.failed else 0)


if __name__ == "__main__":
    main()
