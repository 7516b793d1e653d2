"""Does every wheel of the GPU kit (``.whl/``, built by benchmarks/gpu_kit.sh) find what it needs?

``names`` (here, when the kit is built; no network, no install): every requirement of a kit
wheel, for Python 3.12 on Linux with extras left out, is another kit wheel or a package of the
GPU image (benchmarks/gpu_image.txt); and the kit holds one version of each package. Prints the
version ranges the kit asks of the image's packages, whose versions are mostly not known here.
``versions`` (there, after ``pip install --target``): every such requirement is met, by version,
by what this interpreter imports (the kit on ``PYTHONPATH``, then the image).
Each prints one line per problem and exits 1 if there was any.

Run: ``python benchmarks/gpu_kit_deps.py names|versions [.whl]``.
"""

from __future__ import annotations

import re
import sys
import zipfile
from email.parser import Parser
from importlib import metadata
from pathlib import Path

try:
    from packaging.requirements import Requirement
    from packaging.version import Version
except ImportError:  # pip carries its own copy
    from pip._vendor.packaging.requirements import Requirement
    from pip._vendor.packaging.version import Version

IMAGE = Path(__file__).with_name("gpu_image.txt")
TARGET = {"python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux",
          "platform_system": "Linux", "os_name": "posix", "implementation_name": "cpython",
          "platform_python_implementation": "CPython", "platform_machine": "x86_64",
          "extra": ""}  # fmt: skip
"""The GPU image's interpreter, for the requirements' environment markers."""


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def image_packages() -> dict[str, str | None]:
    """Name -> version where gpu_image.txt gives one, else None."""
    rows = [ln.split("#")[0].strip() for ln in IMAGE.read_text().splitlines()]
    return {
        canonical(r.split("==")[0]): (r.split("==")[1] if "==" in r else None) for r in rows if r
    }


def kit_wheels(folder: Path) -> list[tuple[str, str, list[Requirement]]]:
    """(name, version, requirements that apply on the image) of each wheel in ``folder``."""
    wheels = []
    for path in sorted(folder.glob("*.whl")):
        with zipfile.ZipFile(path) as z:
            meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
            msg = Parser().parsestr(z.read(meta).decode())
        reqs = [Requirement(r) for r in msg.get_all("Requires-Dist") or []]
        reqs = [r for r in reqs if r.marker is None or r.marker.evaluate(TARGET)]
        wheels.append((canonical(msg["Name"]), msg["Version"], reqs))
    return wheels


def check_names(folder: Path) -> list[str]:
    wheels, image = kit_wheels(folder), image_packages()
    names = [w[0] for w in wheels]
    problems = [f"two versions of {n} in {folder}: pip refuses the whole install"
                for n in sorted({n for n in names if names.count(n) > 1})]  # fmt: skip
    problems += [f"{n} is in the kit and in the image: carry it only for another version"
                 for n in names if n in image]  # fmt: skip
    asked = []
    for name, version, reqs in wheels:
        for r in reqs:
            need = canonical(r.name)
            if need in names:
                kit_version = next(w[1] for w in wheels if w[0] == need)
                if not r.specifier.contains(kit_version, prereleases=True):
                    problems.append(f"{name} {version} needs {r}; the kit has {need} {kit_version}")
            elif need in image:
                if str(r.specifier):
                    seen = image[need]
                    bad = seen is not None and not r.specifier.contains(seen, prereleases=True)
                    asked.append(f"{need}{r.specifier} ({name}; image: {seen or 'version not known'}"
                                 f"{', NOT MET' if bad else ''})")  # fmt: skip
                    if bad:
                        problems.append(f"{name} {version} needs {r}; the image has {need} {seen}")
            else:
                problems.append(f"{name} {version} needs {r}: neither in the kit nor in the image")
    print(f"[gpu_kit] {len(wheels)} wheels: " + ", ".join(f"{n} {v}" for n, v, _ in wheels))
    print("[gpu_kit] asked of the image: " + ("; ".join(sorted(set(asked))) or "nothing"))
    return problems


def check_versions(folder: Path) -> list[str]:
    problems = []
    for name, version, reqs in kit_wheels(folder):
        try:
            got = metadata.version(name)
        except metadata.PackageNotFoundError:
            problems.append(f"{name} {version} is in the kit but not importable (PYTHONPATH?)")
            continue
        if got != version:
            problems.append(f"{name}: the kit has {version}, this interpreter finds {got}")
        for r in reqs:
            try:
                have = metadata.version(r.name)
            except metadata.PackageNotFoundError:
                problems.append(f"{name} needs {r}: not installed")
                continue
            if not r.specifier.contains(Version(have), prereleases=True):
                problems.append(f"{name} needs {r}; found {r.name} {have}")
    return problems


def main(argv: list[str]) -> int:
    mode, folder = argv[0], Path(argv[1] if len(argv) > 1 else ".whl")
    if not any(folder.glob("*.whl")):
        print(f"[gpu_kit] no wheels in {folder}: run bash benchmarks/gpu_kit.sh")
        return 1
    problems = check_names(folder) if mode == "names" else check_versions(folder)
    for p in problems:
        print(f"[gpu_kit] PROBLEM {p}")
    if mode == "versions" and not problems:
        print(f"[gpu_kit] every requirement of the kit's wheels is met on {sys.version.split()[0]}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
