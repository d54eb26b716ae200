"""Regenerate ``reactantserver.protocol`` from the ``.proto`` files in this directory.

Run it as ``nox -s proto`` (or ``python proto/generate.py``) after editing any ``.proto``
file, then commit the result. It produces, under ``src/reactantserver/protocol/``:

* one betterproto package per proto package (``inference/``, ``reactant_control/``,
  ``grpc/reflection/v1alpha/``, ``grpc/reflection/v1/``), each an ``__init__.py`` holding the
  message dataclasses, the grpclib client stubs and the server base classes;
* ``descriptors.bin``: a serialized ``google.protobuf.FileDescriptorSet`` of every file, with
  imports and source comments, which ``reactantserver.protocol.reflection`` serves to
  reflection clients such as grpcurl.

``--out DIR`` writes the same tree into another directory instead (the staleness test
regenerates into a temporary directory and compares byte for byte).

Determinism: the inputs are passed in sorted order, protoc emits descriptor sets in input
order, and betterproto's output depends only on the descriptors (it formats with isort and
black). Running the script twice therefore yields identical bytes, for a fixed set of tool
versions (grpcio-tools, betterproto, black, isort).

The hand-written files in the output directory (``__init__.py``, ``reflection.py``) are never
touched: only the generated package directories are replaced, and ``descriptors.bin``
rewritten.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

PROTO_DIR = Path(__file__).resolve().parent
DEFAULT_OUT = PROTO_DIR.parent / "src" / "reactantserver" / "protocol"
DESCRIPTOR_SET = "descriptors.bin"
PLUGIN_NAME = "protoc-gen-python_betterproto"
# Modern annotations (``list[int]``, ``X | None``): the project targets Python 3.11.
PLUGIN_OPTIONS = "typing.310"


def proto_files() -> list[str]:
    """Every ``.proto`` file under proto/, as sorted POSIX paths relative to proto/.

    These relative paths become the file names inside the descriptors (what reflection
    clients ask for with ``file_by_filename`` and what ``import`` statements refer to).
    """
    return sorted(p.relative_to(PROTO_DIR).as_posix() for p in PROTO_DIR.rglob("*.proto"))


def generated_roots(files: list[str]) -> list[str]:
    """Top-level directories betterproto creates: the first component of each package."""
    roots = set()
    for rel in files:
        for line in (PROTO_DIR / rel).read_text(encoding="utf-8").splitlines():
            stripped = line.strip()
            if stripped.startswith("package ") and stripped.endswith(";"):
                roots.add(stripped[len("package ") : -1].strip().split(".")[0])
                break
        else:
            raise SystemExit(f"{rel}: no `package` statement; every proto file needs one")
    return sorted(roots)


def find_plugin() -> Path:
    """The betterproto protoc plugin installed alongside this interpreter.

    Looked up next to ``sys.executable`` first, so that running the script with a
    virtualenv's python works even when that virtualenv is not on ``PATH``.
    """
    beside = Path(sys.executable).parent / PLUGIN_NAME
    if beside.exists():
        return beside
    found = shutil.which(PLUGIN_NAME)
    if found is None:
        raise SystemExit(
            f"{PLUGIN_NAME} not found; install the generator with "
            "`pip install -e '.[proto]'` (betterproto[compiler] and grpcio-tools)"
        )
    return Path(found)


def run_protoc(files: list[str], py_out: Path, descriptor_out: Path) -> None:
    """One protoc run producing both the betterproto modules and the descriptor set."""
    cmd = [
        sys.executable,
        "-m",
        "grpc_tools.protoc",
        f"--proto_path={PROTO_DIR}",
        f"--plugin={PLUGIN_NAME}={find_plugin()}",
        f"--python_betterproto_out={py_out}",
        f"--python_betterproto_opt={PLUGIN_OPTIONS}",
        f"--descriptor_set_out={descriptor_out}",
        "--include_imports",
        # Source info carries the comments, so `grpcurl describe` shows our documentation.
        "--include_source_info",
        *files,
    ]
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise SystemExit(f"protoc failed ({result.returncode}):\n{result.stderr}")
    # The plugin logs one "Writing <file>" line per module on stderr; anything else it says
    # (name-collision warnings, protoc warnings) is worth surfacing.
    noise = [
        line for line in result.stderr.splitlines() if line and not line.startswith("Writing ")
    ]
    if noise:
        print("\n".join(noise), file=sys.stderr)


def generate(out: Path) -> list[Path]:
    """Regenerate into ``out``; return the written files relative to ``out``, sorted."""
    files = proto_files()
    roots = generated_roots(files)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="reactantserver-proto-") as tmp_name:
        tmp = Path(tmp_name)
        py_out = tmp / "py"
        py_out.mkdir()
        run_protoc(files, py_out, tmp / DESCRIPTOR_SET)
        # Replace each generated package wholesale so a message or package removed from the
        # protos cannot leave a stale module behind. betterproto also writes an empty
        # ``__init__.py`` at the output root, which is dropped: the root is the hand-written
        # ``reactantserver.protocol`` package.
        for root in roots:
            target = out / root
            if target.exists():
                shutil.rmtree(target)
            shutil.copytree(py_out / root, target)
        shutil.copyfile(tmp / DESCRIPTOR_SET, out / DESCRIPTOR_SET)
    written = [Path(DESCRIPTOR_SET)]
    for root in roots:
        written.extend(p.relative_to(out) for p in (out / root).rglob("*.py"))
    return sorted(written)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--out",
        type=Path,
        default=DEFAULT_OUT,
        help=f"output directory (default: {DEFAULT_OUT})",
    )
    args = parser.parse_args(argv)
    out: Path = args.out.resolve()
    for rel in generate(out):
        print(out / rel)
    return 0


if __name__ == "__main__":
    sys.exit(main())
