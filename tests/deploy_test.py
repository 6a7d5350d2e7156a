#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The manifests of deploy/ apply together without one undoing another.

Every object (kind, namespace, name) is defined once across deploy/examples and the Helm chart
(deploy/helm/regroup, rendered with its default values), so applying the examples after the
chart never replaces one of its objects; and every NetworkPolicy in the scheduler's namespace
selects pods that the chart's scheduler Deployment runs, so the coordinator's port is never left
open by a policy that selects nothing.

    deploy_test.py                 the examples only (ctest `Deploy`: no helm in that stage)
    deploy_test.py --helm PATH     the examples and the chart (integration/kube_test.py)

Exits 1 naming each object that breaks a rule.
"""
import argparse
import pathlib
import subprocess
import sys

import yaml

ROOT = pathlib.Path(__file__).resolve().parent.parent
CHART = ROOT / "deploy" / "helm" / "regroup"
NAMESPACE = "volcano-system"


def examples():
    for path in sorted((ROOT / "deploy" / "examples").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if isinstance(doc, dict) and "kind" in doc:
                yield str(path.relative_to(ROOT)), doc


def chart(helm: str):
    out = subprocess.run([helm, "template", "regroup", str(CHART), "--namespace", NAMESPACE],
                         capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        sys.exit(f"helm template {CHART}: {out.stderr.strip()}")
    for doc in yaml.safe_load_all(out.stdout):
        if isinstance(doc, dict) and "kind" in doc:
            doc.setdefault("metadata", {}).setdefault("namespace", NAMESPACE if doc["kind"] not in (
                "ClusterRole", "ClusterRoleBinding") else None)
            yield "deploy/helm/regroup", doc


def problems(docs):
    found, seen, scheduler_labels = [], {}, []
    for _, doc in docs:
        if doc["kind"] == "Deployment" and doc["metadata"].get("namespace") == NAMESPACE:
            scheduler_labels.append(doc["spec"]["template"]["metadata"].get("labels", {}))
    for where, doc in docs:
        meta = doc.get("metadata", {})
        key = (doc["kind"], meta.get("namespace") or "default", meta.get("name"))
        if key in seen:
            found.append(f"{where}: {key[0]} {key[1]}/{key[2]} is also defined in {seen[key]}: "
                         "applying both keeps only the last")
        seen.setdefault(key, where)
        if doc["kind"] == "NetworkPolicy" and meta.get("namespace") == NAMESPACE:
            wanted = doc["spec"]["podSelector"].get("matchLabels", {})
            if not any(all(labels.get(k) == v for k, v in wanted.items()) for labels in scheduler_labels):
                found.append(f"{where}: NetworkPolicy {meta.get('name')} selects {wanted}, which no "
                             "scheduler pod of the chart carries: the port it guards stays open")
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--helm", help="a helm binary: render the chart and check it with the examples")
    args = parser.parse_args()
    docs = list(examples())
    if args.helm:
        docs += list(chart(args.helm))
    found = problems(docs)
    for p in found:
        print(p)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
