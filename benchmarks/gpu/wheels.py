"""Wheels for ``nox -s gpu`` on a GPU machine that has no package index.

The GPU machines this project is lent (docs/gpu.md) run an image with Python 3.12 and
JAX's CUDA build already installed, with the packages of :data:`IMAGE` -- and no
network. What ``nox -s gpu`` needs beyond that is :data:`WHEELS`: reactantserver's own
dependencies and its ``cuda`` extra's (``flatbuffers``, which ``jax.export`` needs to
read an artifact, and ``nvidia-ml-py``), pytest-trio, and nox. :func:`needed` computes
that set from the installed distributions' metadata (the closure of those requirements
on CPython 3.12, less the image's packages and JAX's own), and
``tests/project/test_nox_gpu.py`` checks that :data:`WHEELS` is exactly it. This script
downloads them here, as CPython 3.12 manylinux x86_64 wheels, without resolving
dependencies (the list *is* the closure, pinned to versions the suite passes with),
into ``.whl/`` (git-ignored); the device tool carries that folder, and the machine
installs it with

    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl

``attrs`` and ``typing_extensions`` are carried although the image has them: cattrs and
trio need recent ones, and a newer copy first on ``PYTHONPATH`` is backward compatible.

    python benchmarks/gpu/wheels.py                 # into .whl/
    python benchmarks/gpu/wheels.py --dest DIR
"""

from __future__ import annotations

import argparse
import importlib.metadata
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: What the GPU image has already (besides Python 3.12 and JAX's CUDA build).
IMAGE: frozenset[str] = frozenset(
    {
        "numpy",
        "safetensors",
        "prometheus-client",
        "pytest",
        "psutil",
        "packaging",
        "filelock",
        "humanize",
        "multidict",
        "python-dateutil",
        "sortedcontainers",
        "idna",
    }
)
#: JAX and what JAX itself depends on: the image's JAX brings them.
JAX_FAMILY = re.compile(r"^(jax|jaxlib|jax-cuda\d+-(plugin|pjrt)|ml-dtypes|opt-einsum|scipy)$")

#: Requirement -> why it is carried.
WHEELS: dict[str, str] = {
    "trio==0.35.0": "the event loop",
    "outcome==1.3.0.post0": "trio",
    "sniffio==1.3.1": "trio, the client",
    "grpclib==0.4.9": "gRPC",
    "h2==4.4.1": "grpclib",
    "hpack==4.2.0": "h2",
    "hyperframe==6.1.0": "h2",
    "betterproto==2.0.0b7": "the protocol messages",
    "cattrs==26.2.1": "the configuration",
    "attrs==26.1.0": "cattrs needs a recent attrs",
    "typing-extensions==4.16.0": "cattrs, betterproto",
    "ruamel.yaml==0.19.1": "node files",
    "nvidia-ml-py==13.615.71": "NVML: the energy meter (pynvml), in the cuda extra",
    "flatbuffers==25.12.19": "jax.export reads an artifact with it, in the jax and cuda extras",
    "pytest-trio==0.8.0": "the test suite's trio mode",
    "nox==2026.10.20": "nox -s gpu",
    "argcomplete==3.7.2": "nox",
    "colorlog==6.12.0": "nox",
    "dependency-groups==1.3.2": "nox",
    "platformdirs==4.14.8": "nox, virtualenv",
    "python-discovery==1.9.6": "nox, virtualenv",
    "virtualenv==21.15.11": "nox",
    "distlib==0.4.4": "virtualenv",
}

PLATFORMS = (
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_24_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
)


def _name(requirement: str) -> str:
    """A distribution's normalized name (PEP 503) from a requirement string."""
    head = re.split(r"[ ;<>=!~(\[]", requirement.strip(), maxsplit=1)[0]
    return re.sub(r"[-_.]+", "-", head).lower()


def needed(python: str = "3.12") -> set[str]:
    """The distributions ``nox -s gpu`` needs that the image lacks (module docstring): the
    closure, on CPython ``python`` on Linux, of reactantserver's requirements with its
    ``cuda`` extra, pytest-trio and nox, read from the installed distributions' metadata,
    less :data:`IMAGE` and JAX's family (the image's JAX brings those)."""
    from packaging.requirements import Requirement

    base = {"python_version": python, "python_full_version": f"{python}.0"}
    base |= {"sys_platform": "linux", "platform_system": "Linux", "os_name": "posix"}
    base |= {"implementation_name": "cpython", "platform_python_implementation": "CPython"}
    seen: set[str] = set()
    todo: list[tuple[str, frozenset[str]]] = [
        ("reactantserver", frozenset({"cuda"})),
        ("pytest-trio", frozenset()),
        ("nox", frozenset()),
    ]
    while todo:
        name, extras = todo.pop()
        try:
            requires = importlib.metadata.requires(name) or []
        except importlib.metadata.PackageNotFoundError:
            continue  # not installed here: carried, its own requirements not followed
        for text in requires:
            req = Requirement(text)
            env = [dict(base, extra=e) for e in extras] or [dict(base, extra="")]
            if req.marker is not None and not any(req.marker.evaluate(e) for e in env):
                continue
            dist = _name(req.name)
            if dist in IMAGE or JAX_FAMILY.match(dist) or dist in seen:
                continue
            seen.add(dist)
            todo.append((dist, frozenset(req.extras)))
    for root in ("pytest-trio", "nox"):
        seen.add(root)
    return seen


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dest", type=Path, default=ROOT / ".whl")
    parser.add_argument("--python-version", default="3.12")
    args = parser.parse_args(argv)
    args.dest.mkdir(parents=True, exist_ok=True)
    platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--quiet",
        "--no-deps",
        "--only-binary=:all:",
        "--python-version",
        args.python_version,
        "--implementation",
        "cp",
        *platforms,
        "-d",
        str(args.dest),
        *WHEELS,
    ]
    subprocess.run(cmd, check=True)
    wheels = sorted(args.dest.glob("*.whl"))
    size = sum(w.stat().st_size for w in wheels)
    print(f"{len(wheels)} wheels, {size / 2**20:.1f} MiB, in {args.dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
