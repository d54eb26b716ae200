"""Compiled programs shared between bundles that have the same artifact.

Theory of operation
-------------------
A catalog of fine-tuned variants is many bundles over a few architectures: the same
artifact, byte for byte, with different weights. Weights are arguments of the compiled
programs, never baked in, so such bundles can run the very same executables.
``Runtime.load`` looks each (bundle, batch size) up here by everything that determines
the compiled program -- the SHA-256 of the artifact's bytes, the platform, the memory its outputs
are compiled into (``pinned_host`` on CUDA, ``model.py``'s ``output_path``; ``device``
otherwise) and the concrete shapes and dtypes of every argument at that size -- and
compiles only what is
missing. A catalog of a thousand variants of four architectures then compiles (or loads
from the persistent cache) twelve programs instead of three thousand, and on a GPU holds
twelve programs' code in device memory instead of three thousand.

Invariants: a program is shared only between keys that are equal, so a bundle runs a
program compiled for exactly its artifact and argument types; entries are weak
references, so a program lives exactly as long as some ``LoadedModel`` holds it (unload
every model of an architecture and its programs are freed); the table is guarded by a
lock because loads run in worker threads (two concurrent first loads of one artifact may
both compile; the second simply replaces the first entry).

This module imports no JAX.
"""

from __future__ import annotations

import hashlib
import threading
import weakref
from collections.abc import Sequence
from typing import Any

#: (artifact digest, platform, batch size, output memory kind, ((shape, dtype), ...) of
#: every argument).
ProgramKey = tuple[str, str, int, str, tuple[tuple[tuple[int, ...], str], ...]]

__all__ = ["ProgramKey", "SharedPrograms", "artifact_digest", "program_key"]


def artifact_digest(data: bytes | bytearray | memoryview) -> str:
    """The SHA-256 of an artifact's bytes."""
    return hashlib.sha256(data).hexdigest()


def program_key(
    digest: str, platform: str, size: int, args: Sequence[Any], *, output_memory: str = "device"
) -> ProgramKey:
    """The key of the program for ``args`` (objects with ``shape`` and ``dtype``) whose
    outputs are compiled into ``output_memory``."""
    return (
        digest,
        platform,
        size,
        output_memory,
        tuple((tuple(a.shape), str(a.dtype)) for a in args),
    )


class SharedPrograms:
    """Weakly held compiled programs by :data:`ProgramKey` (see the module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._programs: dict[ProgramKey, weakref.ref[Any]] = {}

    def get(self, key: ProgramKey) -> Any | None:
        """The live program for ``key``, or None."""
        with self._lock:
            ref = self._programs.get(key)
            program = ref() if ref is not None else None
            if ref is not None and program is None:
                del self._programs[key]
            return program

    def put(self, key: ProgramKey, program: Any) -> None:
        """Share ``program`` under ``key`` for as long as something else holds it."""
        with self._lock:
            self._programs[key] = weakref.ref(program)

    def __len__(self) -> int:
        """Live programs (dead entries are dropped as they are found)."""
        with self._lock:
            dead = [k for k, ref in self._programs.items() if ref() is None]
            for k in dead:
                del self._programs[k]
            return len(self._programs)
