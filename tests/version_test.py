#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The release is written once, in VERSION. Checks that everything else takes it from there.

CMake reads VERSION (project(), and common/version.h for the library and regroupctl); the Python
package's version is VERSION through the link python/VERSION; the manifests in deploy/ and
examples/ name Regroup's images with that tag, and the Helm chart's version and appVersion are
it. Run by ctest as `Version`; exits 1 naming each
place that disagrees.

    version_test.py PROGRAM...   checks instead that each PROGRAM --version prints its name and
                                 VERSION ("regroup-manager 0.1.0") and exits 0 (ctest runs it as
                                 Version.<program> for each program CMake builds to be run)
"""
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent


def python_version() -> str:
    """regroup.__version__, imported from the repository's python/ (no torch needed)."""
    code = "import regroup; print(regroup.__version__)"
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT / "python", capture_output=True,
                          text=True, check=True).stdout.strip()


def problems(version: str):
    if python_version() != version:
        yield f"regroup.__version__ is {python_version()!r}, VERSION says {version!r}"
    link = ROOT / "python" / "VERSION"
    if not link.is_symlink() or link.resolve() != (ROOT / "VERSION").resolve():
        yield "python/VERSION must be a link to ../VERSION"
    pyproject = (ROOT / "python" / "pyproject.toml").read_text()
    if 'dynamic = ["version"]' not in pyproject or 'version = {file = "VERSION"}' not in pyproject:
        yield "python/pyproject.toml must take its version from VERSION (dynamic, file = VERSION)"
    if re.search(r'^version\s*=\s*"', pyproject, re.M):
        yield "python/pyproject.toml writes a version of its own"
    for folder in ("deploy", "examples"):
        for path in sorted((ROOT / folder).rglob("*.yaml")):
            for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                m = re.search(r"image:\s*regroup/([\w.-]+):([\w.-]+)", line)
                if m and m.group(2) not in (version, "latest"):
                    yield (f"{path.relative_to(ROOT)}:{number}: image regroup/{m.group(1)} is "
                           f"tagged {m.group(2)}, but VERSION says {version}")
    chart = (ROOT / "deploy" / "helm" / "regroup" / "Chart.yaml").read_text()
    for field in ("version", "appVersion"):
        m = re.search(rf'^{field}:\s*"?([^"\s]+)"?', chart, re.M)
        if not m or m.group(1) != version:
            yield (f"deploy/helm/regroup/Chart.yaml: {field} is {m.group(1) if m else 'missing'}, "
                   f"but VERSION says {version}")
    for path in (ROOT / "plugin" / "c_api.cc", ROOT / "cli" / "convert.h"):
        if re.search(r'"\d+\.\d+\.\d+"', path.read_text()):
            yield f"{path.relative_to(ROOT)} writes a release number; use REGROUP_VERSION_STRING"


def program_problems(version: str, programs):
    for program in programs:
        want = f"{pathlib.Path(program).name} {version}\n"
        try:
            run = subprocess.run([program, "--version"], capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired) as e:
            yield f"{program} --version did not run: {e}"
            continue
        if run.returncode != 0 or run.stdout != want:
            yield (f"{program} --version printed {run.stdout!r} and exited {run.returncode} "
                   f"(stderr {run.stderr!r}); want {want!r} and 0")


def main() -> int:
    version = (ROOT / "VERSION").read_text().strip()
    if not re.fullmatch(r"\d+\.\d+\.\d+", version):
        print(f"VERSION holds {version!r}, not MAJOR.MINOR.PATCH")
        return 1
    programs = sys.argv[1:]
    found = list(program_problems(version, programs) if programs else problems(version))
    for p in found:
        print(p)
    if not found:
        print(f"version: {', '.join(programs)} print {version}" if programs else
              f"version: {version} is written once, in VERSION")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
