#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The parts of Regroup depend one way: abi <- common <- plugin <- {manager, agent, cli, go}.

Checks every quoted #include of the C and C++ sources (and the cgo preambles of go/) against
that direction and prints each include that breaks it, naming the file, the line and the rule.
Run by ctest as `Layering`; exits 1 on any violation.
"""
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent

# What each part may include, besides itself. "proto" is the generated wire protocol
# (regroup/v1/...), "abi" the public header (abi/regroup.h, also reachable as "regroup.h").
ALLOWED = {
    "abi": set(),
    "common": {"abi", "proto"},
    "plugin": {"abi", "common", "proto"},
    "manager": {"abi", "common", "plugin", "proto"},
    "agent": {"abi", "common", "proto"},
    "cli": {"abi", "common", "plugin", "proto"},
    # The simulation drives the manager's job control and the agent's logic together.
    "sim": {"abi", "common", "plugin", "proto", "manager", "agent"},
    "go": {"abi"},
}
INCLUDE = re.compile(r'^\s*(?://\s*)?#\s*include\s+"([^"]+)"')
SOURCES = ("*.c", "*.cc", "*.h", "*.hh", "*.go")


def part_of(include: str, including_dir: pathlib.Path) -> str:
    """The part an include names: its first folder, or the folder of a file beside the includer."""
    if include in ("regroup.h", "regroup.hh"):
        return "abi"
    if include.startswith("regroup/v1/"):
        return "proto"
    head = include.split("/", 1)[0]
    if "/" in include and (ROOT / head).is_dir():
        return head
    return "."  # beside the includer, in its own part


def violations():
    for part, allowed in ALLOWED.items():
        for pattern in SOURCES:
            for path in sorted((ROOT / part).rglob(pattern)):
                rel = path.relative_to(ROOT)
                for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                    m = INCLUDE.match(line)
                    if not m:
                        continue
                    target = part_of(m.group(1), path.parent)
                    if target in (".", part) or target in allowed:
                        continue
                    yield (f"{rel}:{number}: includes \"{m.group(1)}\" ({target}/), but {part}/ may "
                           f"include only {', '.join(sorted(allowed | {part})) or 'itself'}")


def main() -> int:
    found = list(violations())
    for v in found:
        print(v)
    if found:
        print(f"{len(found)} include(s) against the direction abi <- common <- plugin <- "
              f"{{manager, agent, cli, go}}")
        return 1
    print("layering: every include points one way")
    return 0


if __name__ == "__main__":
    sys.exit(main())
