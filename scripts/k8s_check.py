"""What the Kubernetes schemas cannot see in deploy/kubernetes/ (run by scripts/k8s-validate).

- The custom resources (ServiceMonitor, PrometheusRule), which the built-in schemas
  do not cover, structurally: the fields the Prometheus Operator needs.
- The PrometheusRule's groups, parsed, equal to deploy/alerts.yml's.
- The pieces fit together: the Service and the ServiceMonitor select the serving
  pods and name ports they have; the budgets and the autoscaler name what exists;
  every secretKeyRef names a key of the example Secret; the grace period covers
  the preStop pause plus the server's drain.
"""

import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
DIR = ROOT / "deploy" / "kubernetes"
# The example Secret, kept out of DIR so that applying DIR never overwrites a real
# Secret with its placeholders; checked with the rest.
EXAMPLES = ROOT / "deploy" / "kubernetes-examples"
# The server's own stop: the drain period (STAMPEDE_DRAIN_MS, 5 s), then at most
# STOP_BOUND (15 s, src/startup/mod.rs: the requests in flight, the settlement
# worker's batch, the background jobs), past which it exits anyway.
SERVER_DRAIN_S = 5 + 15

failures = []


def check(ok, what):
    if not ok:
        failures.append(what)


def load():
    docs = []
    for path in sorted(DIR.glob("*.yaml")) + sorted(EXAMPLES.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                docs.append((path.name, doc))
    return docs


def by_kind(docs, kind):
    return [d for _, d in docs if d.get("kind") == kind]


def matches(selector, labels):
    return all(labels.get(k) == v for k, v in selector.items())


def main():
    docs = load()
    for name, d in docs:
        check(d.get("apiVersion") and d.get("kind") and d.get("metadata", {}).get("name"), f"{name}: apiVersion, kind, metadata.name")

    deployments = {d["metadata"]["name"]: d for d in by_kind(docs, "Deployment")}
    check(set(deployments) == {"stampede-serve", "stampede-settle"}, f"the two roles' Deployments: {sorted(deployments)}")
    serve = deployments.get("stampede-serve")
    pod_labels = serve["spec"]["template"]["metadata"]["labels"] if serve else {}

    secret_keys = set()
    for s in by_kind(docs, "Secret"):
        secret_keys |= set(s.get("stringData", {})) | set(s.get("data", {}))
    for name, d in docs:
        if d.get("kind") not in ("Deployment", "Job"):
            continue
        spec = d["spec"]["template"]["spec"]
        for c in spec["containers"]:
            for e in c.get("env", []):
                ref = e.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    check(ref["key"] in secret_keys, f"{name}: secretKeyRef {ref['key']} is a key of the Secret")
            for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
                port = c.get(probe, {}).get("httpGet", {}).get("port")
                if port is not None:
                    check(port in {p["name"] for p in c.get("ports", [])}, f"{name}: {probe} port {port} is a container port")
            pre = c.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command", [])
            pause = int(pre[1]) if pre[:1] == ["sleep"] else 0
            grace = spec.get("terminationGracePeriodSeconds", 30)
            check(grace >= pause + SERVER_DRAIN_S + 5, f"{name}: grace {grace} s covers preStop {pause} s + drain {SERVER_DRAIN_S} s + 5")
    if serve:
        c = serve["spec"]["template"]["spec"]["containers"][0]
        check(c["readinessProbe"]["httpGet"]["path"] == "/readyz", "serve: readiness on /readyz")
        check(c["livenessProbe"]["httpGet"]["path"] == "/healthz", "serve: liveness on /healthz")

    for svc in by_kind(docs, "Service"):
        picked = [d for d in deployments.values() if matches(svc["spec"]["selector"], d["spec"]["template"]["metadata"]["labels"])]
        check(len(picked) == 1, f"Service {svc['metadata']['name']} selects one role's pods")
        ports = {p["name"] for d in picked for c in d["spec"]["template"]["spec"]["containers"] for p in c.get("ports", [])}
        for p in svc["spec"]["ports"]:
            check(p.get("targetPort") in ports, f"Service {svc['metadata']['name']} port {p.get('name')} targets a port of its pods")
    check(any(matches(s["spec"]["selector"], pod_labels) for s in by_kind(docs, "Service") if s["metadata"]["name"] == "stampede"),
          "the Service `stampede` selects the serving pods")
    services = by_kind(docs, "Service")
    for pdb in by_kind(docs, "PodDisruptionBudget"):
        sel = pdb["spec"]["selector"]["matchLabels"]
        check(any(matches(sel, d["spec"]["template"]["metadata"]["labels"]) for d in deployments.values()),
              f"PodDisruptionBudget {pdb['metadata']['name']} selects a Deployment's pods")
    for hpa in by_kind(docs, "HorizontalPodAutoscaler"):
        target = hpa["spec"]["scaleTargetRef"]["name"]
        check(target in deployments, f"HorizontalPodAutoscaler targets {target}")
        # Both owning the count: every apply would reset the autoscaler's.
        check("replicas" not in deployments.get(target, {}).get("spec", {}), f"{target}: no replicas of its own (the autoscaler owns them)")

    # Every role's pods behind one NetworkPolicy, whose ports are the pods' own;
    # the serving pods take HTTP from somewhere and metrics from somewhere.
    policies = by_kind(docs, "NetworkPolicy")
    for name, d in deployments.items():
        labels = d["spec"]["template"]["metadata"]["labels"]
        mine = [p for p in policies if matches(p["spec"]["podSelector"]["matchLabels"], labels)]
        check(len(mine) == 1, f"{name}: one NetworkPolicy selects its pods ({len(mine)})")
        ports = {p["name"] for c in d["spec"]["template"]["spec"]["containers"] for p in c.get("ports", [])}
        allowed = set()
        for p in mine:
            check(p["spec"].get("policyTypes") == ["Ingress"], f"NetworkPolicy {p['metadata']['name']}: ingress only")
            for rule in p["spec"].get("ingress", []):
                check(bool(rule.get("from")), f"NetworkPolicy {p['metadata']['name']}: every rule names who may connect")
                for port in rule.get("ports", []):
                    check(port["port"] in ports, f"NetworkPolicy {p['metadata']['name']}: port {port['port']} is a port of its pods")
                    allowed.add(port["port"])
        check(allowed == ports, f"{name}: its NetworkPolicy lets in each of its ports ({sorted(allowed)} of {sorted(ports)})")

    monitors = by_kind(docs, "ServiceMonitor")
    check(len(monitors) == 1, "one ServiceMonitor")
    for m in monitors:
        check(m["apiVersion"] == "monitoring.coreos.com/v1", "ServiceMonitor apiVersion")
        sel = m["spec"]["selector"]["matchLabels"]
        picked = [s for s in services if matches(sel, s["metadata"].get("labels", {}))]
        check({s["metadata"]["name"] for s in picked} == {"stampede", "stampede-settle"},
              "ServiceMonitor selects the Services of both roles")
        job = m["spec"].get("jobLabel")
        check(job is not None and all(s["metadata"]["labels"].get(job) == "stampede" for s in picked),
              "ServiceMonitor: the job label is `stampede` for both roles (the job the alerts name)")
        for ep in m["spec"]["endpoints"]:
            check(any(ep.get("port") == p["name"] for s in picked for p in s["spec"]["ports"]), f"ServiceMonitor port {ep.get('port')} is a Service port")

    rules = by_kind(docs, "PrometheusRule")
    check(len(rules) == 1, "one PrometheusRule")
    alerts = yaml.safe_load((ROOT / "deploy" / "alerts.yml").read_text())
    for r in rules:
        check(r["apiVersion"] == "monitoring.coreos.com/v1", "PrometheusRule apiVersion")
        groups = r["spec"]["groups"]
        check(groups == alerts["groups"], "the PrometheusRule's groups equal deploy/alerts.yml's")
        for g in groups:
            check(isinstance(g.get("name"), str) and g.get("rules"), "each group has a name and rules")
            for rule in g.get("rules", []):
                check(bool(rule.get("alert") or rule.get("record")) and isinstance(rule.get("expr"), str), f"rule {rule.get('alert')}: alert and expr")
        n = sum(len(g["rules"]) for g in groups)
        print(f"    PrometheusRule: {len(groups)} group(s), {n} rules, the same as deploy/alerts.yml")

    if failures:
        for f in failures:
            print(f"FAIL {f}", file=sys.stderr)
        sys.exit(1)
    print(f"    {len(docs)} manifests fit together (selectors, ports, secret keys, grace periods, custom resources)")


if __name__ == "__main__":
    main()
