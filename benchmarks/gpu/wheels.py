"""Wheels for ``nox -s gpu`` on a GPU machine that has no package index.

The GPU machines this project is lent (docs/gpu.md) run an image with Python 3.12 and
JAX's CUDA build already installed, with numpy, safetensors, prometheus-client,
pytest, psutil, packaging, filelock, humanize, multidict, python-dateutil,
sortedcontainers and idna -- and no network. What ``nox -s gpu`` needs beyond that is
below: reactantserver's own dependencies, pytest-trio, and nox. This script downloads
them here, as CPython 3.12 manylinux x86_64 wheels, without resolving dependencies (the
list *is* the closure, pinned to versions the suite passes with), into ``.whl/``
(git-ignored); the device tool carries that folder, and the machine installs it with

    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl

``attrs`` and ``typing_extensions`` are carried although the image has them: cattrs and
trio need recent ones, and a newer copy first on ``PYTHONPATH`` is backward compatible.

    python benchmarks/gpu/wheels.py                 # into .whl/
    python benchmarks/gpu/wheels.py --dest DIR
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: Requirement -> why it is carried.
WHEELS: dict[str, str] = {
    "trio==0.35.0": "the event loop",
    "outcome==1.3.0.post0": "trio",
    "sniffio==1.3.1": "trio, the client",
    "trio-asyncio==0.16.0": "grpclib inside trio",
    "greenlet==3.5.6": "trio-asyncio",
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
