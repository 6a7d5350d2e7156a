#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The image definitions of deploy/, checked without a container runtime.

No image can be built on this machine (no Docker daemon, and no base image from a registry is
reachable), so each Dockerfile is checked against the build it packages:

- every file its build stage COPYs from the repository exists;
- every program or library its runtime stage COPYs from the build stage is a target the build
  makes (it exists in BUILD_DIR);
- the runtime stage installs, directly or through their dependencies, the Debian package of every
  shared library those programs link (ldd on this machine's build, the same Debian release the
  images start from), beyond the base image's own (libc6, libgcc-s1, libstdc++6, zlib1g);
- the examples name the image a Dockerfile tags.

    images_test.py [BUILD_DIR]      (default: build/ at the repository root)

Exits 1 naming each problem.
"""
import glob
import pathlib
import re
import shlex
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
IMAGES = {  # Dockerfile -> the tag its header builds
    "deploy/regroup/Dockerfile": "regroup/regroup",
    "deploy/volcano/Dockerfile": "regroup/regroup-scheduler",
}
# In debian:bookworm-slim already (Essential or required by its base).
BASE = {"libc6", "libgcc-s1", "libstdc++6", "zlib1g"}


def stages(text: str):
    """The Dockerfile's stages: (base image, [instructions]) with line continuations joined."""
    joined = re.sub(r"\\\n", " ", text)
    out = []
    for line in joined.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        word, _, rest = line.partition(" ")
        if word.upper() == "FROM":
            out.append((rest.split()[0], []))
        elif out:
            out[-1][1].append((word.upper(), rest.strip()))
    return out


def installed_packages(instructions) -> set:
    pkgs = set()
    for word, rest in instructions:
        if word != "RUN" or "apt-get install" not in rest:
            continue
        for part in rest.split("&&"):
            if "apt-get install" in part:
                pkgs.update(w for w in shlex.split(part.split("install", 1)[1]) if not w.startswith("-"))
    return pkgs


def closure(pkgs: set) -> set:
    """The packages and everything they depend on (Depends and PreDepends), as apt resolves them."""
    out = subprocess.run(["apt-cache", "depends", "--recurse", "--no-recommends", "--no-suggests",
                          "--no-conflicts", "--no-breaks", "--no-replaces", "--no-enhances", *sorted(pkgs)],
                         capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        raise SystemExit(f"apt-cache depends {' '.join(sorted(pkgs))}: {out.stderr.strip()}")
    names = set()
    for line in out.stdout.splitlines():
        line = line.strip()
        if line.startswith(("Depends:", "PreDepends:")):
            line = line.split(":", 1)[1].strip()
        names.add(line.strip("<>").split(":")[0])
    return names


def linked_packages(binary: pathlib.Path) -> set:
    """The Debian packages of the shared libraries `binary` links (ldd, then dpkg -S)."""
    out = subprocess.run(["ldd", str(binary)], capture_output=True, text=True, timeout=30, check=True)
    pkgs = set()
    for line in out.stdout.splitlines():
        m = re.search(r"=> (/\S+)", line)
        if not m:
            continue
        lib = pathlib.Path(m.group(1))
        found = None
        for path in (str(lib.resolve()), str(lib), "/usr" + str(lib)):
            r = subprocess.run(["dpkg", "-S", path], capture_output=True, text=True, timeout=30)
            if r.returncode == 0:
                found = r.stdout.split(":", 1)[0].strip()
                break
        if found is None:
            raise SystemExit(f"{binary.name} links {lib}, which no Debian package holds")
        pkgs.add(found)
    return pkgs


def check(dockerfile: str, tag: str, build: pathlib.Path) -> list:
    problems = []
    text = (ROOT / dockerfile).read_text()
    st = stages(text)
    names = {}
    for i, (base, instructions) in enumerate(st):
        for word, rest in instructions:
            if word == "COPY" and not rest.startswith("--from"):
                for src in shlex.split(rest)[:-1]:
                    if not glob.glob(str(ROOT / src)):
                        problems.append(f"{dockerfile}: COPY {src}: no such file in the repository")
    for i, (base, _) in enumerate(st):
        names[i] = base
    runtime = st[-1][1]
    wanted = set()
    for word, rest in runtime:
        if word != "COPY" or not rest.startswith("--from"):
            continue
        parts = shlex.split(rest)[1:]
        for src in parts[:-1]:
            if not src.startswith("/src/build/"):
                continue
            for path in glob.glob(str(build / src[len("/src/build/"):])) or [None]:
                if path is None:
                    problems.append(f"{dockerfile}: COPY --from=... {src}: the build makes no such file "
                                    f"(looked in {build})")
                    continue
                p = pathlib.Path(path)
                if p.is_file() and not p.is_symlink():
                    wanted |= linked_packages(p)
    have = closure(installed_packages(runtime)) | BASE
    for pkg in sorted(wanted - have):
        problems.append(f"{dockerfile}: its runtime stage installs nothing that provides {pkg}, which the "
                        f"programs it copies link; add it to the apt-get install line")
    if f"{tag}:" not in text:
        problems.append(f"{dockerfile}: its header does not build the tag {tag}")
    return problems


def main() -> int:
    build = pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "build"
    problems = []
    for dockerfile, tag in IMAGES.items():
        problems += check(dockerfile, tag, build)
    # The examples name only images a Dockerfile here builds (or the user's own trainer image).
    for path in sorted((ROOT / "deploy" / "examples").glob("*.yaml")):
        for image in re.findall(r"image:\s*(\S+)", path.read_text()):
            if image.startswith("regroup/") and image.split(":")[0] not in IMAGES.values():
                problems.append(f"{path.relative_to(ROOT)}: image {image} is built by no Dockerfile in deploy/")
    for p in problems:
        print(p)
    if not problems:
        print(f"images_test: {len(IMAGES)} Dockerfiles match the build in {build}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
