#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The manifests under deploy/ apply together without one undoing another.

Every object (kind, namespace, name) is defined once across deploy/, so applying the examples
after the scheduler's manifests never replaces a real object with an example's; and every
NetworkPolicy in the scheduler's namespace selects pods that the scheduler's Deployment runs, so
the coordinator's port is never left open by a policy that selects nothing. Run by ctest as
`Deploy`; exits 1 naming each object that breaks a rule.
"""
import pathlib
import sys

import yaml

ROOT = pathlib.Path(__file__).resolve().parent.parent


def documents():
    for path in sorted((ROOT / "deploy").rglob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if isinstance(doc, dict) and "kind" in doc:
                yield path.relative_to(ROOT), doc


def main() -> int:
    problems, seen = [], {}
    docs = list(documents())
    scheduler_labels = []
    for path, doc in docs:
        if doc["kind"] == "Deployment" and doc["metadata"].get("namespace") == "volcano-system":
            scheduler_labels.append(doc["spec"]["template"]["metadata"].get("labels", {}))
    for path, doc in docs:
        meta = doc.get("metadata", {})
        key = (doc["kind"], meta.get("namespace", "default"), meta.get("name"))
        if key in seen:
            problems.append(f"{path}: {key[0]} {key[1]}/{key[2]} is also defined in {seen[key]}: "
                            "applying both keeps only the last")
        seen.setdefault(key, path)
        if doc["kind"] == "NetworkPolicy" and meta.get("namespace") == "volcano-system":
            wanted = doc["spec"]["podSelector"].get("matchLabels", {})
            if not any(all(labels.get(k) == v for k, v in wanted.items()) for labels in scheduler_labels):
                problems.append(f"{path}: NetworkPolicy {meta.get('name')} selects {wanted}, which no "
                                "scheduler pod in deploy/ carries: the port it guards stays open")
    for p in problems:
        print(p)
    if not scheduler_labels:
        print("deploy/: no Deployment in volcano-system (the scheduler) was found")
        return 1
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
