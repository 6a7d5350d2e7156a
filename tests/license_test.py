#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Every source file the repository tracks names its license (SPDX) within its first three lines,
and the license is the LICENSE file's. Run by ctest as `License`; exits 1 naming each file that
does not, with the line to add.

    license_test.py          check
    license_test.py --fix    add the line where it is missing (after a #! line)
"""
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
TAG = "SPDX-License-Identifier: Apache-2.0"
SOURCES = (".cc", ".h", ".c", ".go", ".py", ".proto", ".sh")


def sources():
    files = subprocess.run(["git", "-C", str(ROOT), "ls-files"], capture_output=True, text=True,
                           check=True).stdout.split()
    for name in files:
        path = ROOT / name
        if "/_proto/" in name or path.is_symlink() or not path.is_file():
            continue
        if name.endswith(SOURCES) or path.name == "CMakeLists.txt" or name.startswith("scripts/") \
                or name == ".ci/run":
            yield path


def comment(path: pathlib.Path) -> str:
    if path.suffix in (".h", ".c") and path.parts[-2] == "abi":
        return f"/* {TAG} */"          # the public C header: plain C comments
    if path.suffix in (".cc", ".h", ".c", ".go", ".proto"):
        return f"// {TAG}"
    return f"# {TAG}"


def main() -> int:
    fix = "--fix" in sys.argv[1:]
    if "Apache License" not in (ROOT / "LICENSE").read_text() or "Version 2.0" not in (ROOT / "LICENSE").read_text():
        print("LICENSE is not the Apache License 2.0 that the SPDX lines name")
        return 1
    missing = []
    for path in sources():
        text = path.read_text()
        if TAG in "\n".join(text.splitlines()[:3]):
            continue
        if not fix:
            missing.append(path)
            continue
        lines = text.splitlines(keepends=True)
        at = 1 if lines and lines[0].startswith("#!") else 0
        extra = "\n" if path.suffix == ".go" else ""   # not the package's doc comment
        lines.insert(at, comment(path) + "\n" + extra)
        path.write_text("".join(lines))
    for path in missing:
        print(f"{path.relative_to(ROOT)}: add `{comment(path)}` as its first line (after a #! line)")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
