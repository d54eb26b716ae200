"""Bundles on disk: loading one directory, scanning a repository of them.

Theory of operation
-------------------
A model repository is a directory; each immediate subdirectory holding a
``manifest.yaml`` is a bundle, named after the directory (a ``name:`` key in the
manifest is informational only: renaming the directory renames the model). Hidden
directories (``.foo``) are skipped so editors and the exporter's temporary
directories never show up as models. A visible subdirectory *without* a manifest is no
bundle either, but it is most likely one that lost (or never got) its manifest, so
``find_bundles`` names those too (``BundleListing.unbundled``): the worker says so once.

``load_bundle`` does every check that needs no JAX, cheapest first: the manifest
(``manifest.py`` rules), the artifact's presence, the weights header and its
``argument_order``, and the import of ``model.py`` with its hooks. Whether the
artifact matches the manifest (arity, dtypes, shapes) needs JAX and is checked by
``reactantserver.runtime`` when the bundle is loaded there.

``find_bundles`` walks the model directories once and names each bundle's directory,
the first directory that has a name winning; it is the one walk that scanning,
the repository watcher, RepositoryModelLoad and the meta-model checks share.
``scan_repository`` loads every bundle it finds and returns the good ones *and* the
per-bundle errors: one broken bundle never stops the others.

``signature`` fingerprints a bundle directory by the (name, size, mtime) of its
top-level files; the repository watcher compares signatures between polls to decide
what to reload.

Symbolic links out of the repository are refused unless the operator sets
``follow_symlinks: true`` (``load_bundle``'s ``follow_symlinks``): a bundle directory, or a
file it reads (the manifest, the artifact, the weights, ``model.py``), whose real path is
not inside the real path of the repository directory holding the bundle is a
``BundleError`` naming the file (issue 41: a manifest linked to ``/etc/passwd`` was read,
and its first line shown to clients). Links that stay inside the repository (one bundle
sharing another's weights) are followed either way.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import attrs
import numpy as np

from ..errors import BundleError, ConfigError
from ..hooks import Hooks, load_hooks
from .manifest import MANIFEST_FILE, MODEL_PY, Manifest, TensorSpec, parse_manifest
from .weights import WeightSpec, read_weight_specs, read_weights

#: (file name, size in bytes, mtime in ns) for each top-level file of a bundle.
Signature = tuple[tuple[str, int, int], ...]


@attrs.frozen(eq=False)
class Bundle:
    """A bundle that passed every JAX-free check."""

    name: str
    path: Path
    manifest: Manifest
    #: Weight arguments in artifact order (empty for meta bundles).
    weight_specs: tuple[WeightSpec, ...]
    hooks: Hooks | None
    signature: Signature

    @property
    def kind(self) -> str:
        return self.manifest.kind

    @property
    def is_meta(self) -> bool:
        return self.manifest.kind == "meta"

    @property
    def batched(self) -> bool:
        return self.manifest.batched

    @property
    def compiled_batch_sizes(self) -> tuple[int, ...]:
        return self.manifest.compiled_batch_sizes

    @property
    def inputs(self) -> tuple[TensorSpec, ...]:
        return self.manifest.inputs

    @property
    def outputs(self) -> tuple[TensorSpec, ...]:
        return self.manifest.outputs

    @property
    def client_inputs(self) -> tuple[TensorSpec, ...]:
        """What clients send (the executable inputs unless model.py changes them)."""
        return self.manifest.effective_client_inputs

    @property
    def client_outputs(self) -> tuple[TensorSpec, ...]:
        return self.manifest.effective_client_outputs

    @property
    def artifact_path(self) -> Path | None:
        return self.path / self.manifest.artifact if self.manifest.artifact else None

    @property
    def weights_path(self) -> Path | None:
        return self.path / self.manifest.weights if self.manifest.weights else None

    @property
    def weights_nbytes(self) -> int:
        return sum(w.nbytes for w in self.weight_specs)

    def read_weights(self) -> list[np.ndarray]:
        """Host copies of the weights, in argument order (reads the file)."""
        if self.weights_path is None:
            return []
        return read_weights(self.name, self.weights_path, self.weight_specs)

    def read_artifact(self) -> bytes:
        """The serialized artifact's bytes."""
        if self.artifact_path is None:
            raise BundleError(self.name, "a kind: meta bundle has no artifact")
        try:
            return self.artifact_path.read_bytes()
        except OSError as exc:
            raise BundleError(
                self.name, f"{self.artifact_path.name}: cannot read ({exc.strerror})"
            ) from None


def signature(path: Path) -> Signature:
    """Fingerprint of a bundle directory: its visible top-level files."""
    entries = []
    try:
        with os.scandir(path) as it:
            for entry in it:
                if entry.name.startswith(".") or not entry.is_file():
                    continue
                st = entry.stat()
                entries.append((entry.name, st.st_size, st.st_mtime_ns))
    except OSError:
        return ()
    return tuple(sorted(entries))


def _inside(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def _check_links(name: str, path: Path, files: Iterable[str]) -> None:
    """Refuse the bundle directory ``path`` or one of its ``files`` whose real path is out
    of the repository directory holding the bundle (module docstring)."""
    root = path.parent.resolve()
    for file in ("", *files):
        real = (path / file).resolve()
        if not _inside(real, root):
            what = file or "the bundle directory"
            raise BundleError(
                name,
                f"{what}: a symbolic link out of the model repository (to {real}); set "
                "follow_symlinks: true to follow links out of it",
                public=f"{what}: a symbolic link out of the model repository; set "
                "follow_symlinks: true to follow links out of it",
            )


def load_bundle(
    path: Path | str, *, name: str | None = None, follow_symlinks: bool = False
) -> Bundle:
    """Validate the bundle directory ``path`` (JAX-free checks) and load its hooks;
    links out of the repository refused unless ``follow_symlinks`` (module docstring)."""
    path = Path(path)
    name = name or path.name
    sig = signature(path)
    if not follow_symlinks:
        _check_links(name, path, (MANIFEST_FILE, MODEL_PY))
    manifest_path = path / MANIFEST_FILE
    try:
        text = manifest_path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise BundleError(name, f"{MANIFEST_FILE}: file not found in {path}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise BundleError(name, f"{MANIFEST_FILE}: cannot read ({exc})") from None
    model_py = path / MODEL_PY
    has_model_py = model_py.is_file()
    manifest = parse_manifest(name, text, has_model_py=has_model_py)

    specs: tuple[WeightSpec, ...] = ()
    if manifest.kind == "model":
        assert manifest.artifact is not None and manifest.weights is not None
        if not follow_symlinks:
            _check_links(name, path, (manifest.artifact, manifest.weights))
        if not (path / manifest.artifact).is_file():
            raise BundleError(
                name, f"{manifest.artifact}: file not found (manifest key 'artifact')"
            )
        specs = read_weight_specs(name, path / manifest.weights)

    hooks = load_hooks(name, model_py, kind=manifest.kind) if has_model_py else None
    if hooks is not None and manifest.kind == "model":
        _check_hooks_cover(name, manifest, hooks)
    return Bundle(
        name=name, path=path, manifest=manifest, weight_specs=specs, hooks=hooks, signature=sig
    )


def _check_hooks_cover(name: str, manifest: Manifest, hooks: Hooks) -> None:
    """Client tensors that differ from the executable's need the hook that converts them."""
    changed_in = manifest.client_inputs is not None and manifest.client_inputs != manifest.inputs
    if changed_in and hooks.preprocess is None:
        raise BundleError(
            name,
            f"{MODEL_PY}: client_inputs differ from inputs, so model.py must define "
            "preprocess(inputs) to convert them; it does not",
        )
    changed_out = (
        manifest.client_outputs is not None and manifest.client_outputs != manifest.outputs
    )
    if changed_out and hooks.postprocess is None:
        raise BundleError(
            name,
            f"{MODEL_PY}: client_outputs differ from outputs, so model.py must define "
            "postprocess(outputs) to convert them; it does not",
        )


@attrs.frozen
class BundleListing:
    """Where the bundles of a repository are: the result of :func:`find_bundles`."""

    #: name -> its bundle directory, in the first repository directory that has it.
    paths: Mapping[str, Path]
    #: name -> the first *other* repository directory that has it too (ignored).
    duplicates: Mapping[str, Path]
    #: Visible subdirectories with no manifest.yaml (not bundles; the worker warns once).
    unbundled: tuple[Path, ...] = ()


@attrs.frozen
class ScanResult:
    """The bundles found in a repository: those that loaded, and why the others did not."""

    bundles: Mapping[str, Bundle]
    errors: Mapping[str, BundleError]


def bundle_dirs(directory: Path) -> list[Path]:
    """Immediate, visible subdirectories of ``directory`` holding a manifest.yaml."""
    return _subdirectories(directory)[0]


def _subdirectories(directory: Path) -> tuple[list[Path], list[Path]]:
    """``directory``'s visible subdirectories: those with a manifest.yaml, and the others."""
    bundles: list[Path] = []
    others: list[Path] = []
    for entry in sorted(directory.iterdir(), key=lambda p: p.name):
        if entry.name.startswith(".") or not entry.is_dir():
            continue
        (bundles if (entry / MANIFEST_FILE).is_file() else others).append(entry)
    return bundles, others


def find_bundles(
    directories: Sequence[Path | str], *, include: Iterable[str] = ()
) -> BundleListing:
    """Every bundle directory of ``directories`` by name; the first directory wins.

    ``include`` (the ``models_include`` allowlist) restricts the names; empty keeps all.
    Raises ``OSError`` when a directory cannot be listed: a caller must never mistake an
    unreadable repository for an empty one.
    """
    wanted = set(include)
    paths: dict[str, Path] = {}
    duplicates: dict[str, Path] = {}
    unbundled: list[Path] = []
    for directory in directories:
        bundles, others = _subdirectories(Path(directory))
        for path in bundles:
            name = path.name
            if wanted and name not in wanted:
                continue
            if name in paths:
                duplicates.setdefault(name, Path(directory))
            else:
                paths[name] = path
        unbundled.extend(p for p in others if not wanted or p.name in wanted)
    return BundleListing(paths=paths, duplicates=duplicates, unbundled=tuple(unbundled))


def scan_repository(
    directories: Path | str | Sequence[Path | str],
    *,
    include: Iterable[str] = (),
    follow_symlinks: bool = False,
) -> ScanResult:
    """Load every bundle of one or more repositories.

    ``include`` (the ``models_include`` allowlist) restricts which names are loaded;
    empty loads all. A name found in two repositories is an error for the second
    one (the first wins). A missing repository directory is a ``ConfigError``.
    ``follow_symlinks``: as :func:`load_bundle`'s.
    """
    dirs = (
        [Path(directories)]
        if isinstance(directories, str | Path)
        else [Path(d) for d in directories]
    )
    for directory in dirs:
        if not directory.is_dir():
            raise ConfigError(f"model_dirs: {directory}: not a directory")
    listing = find_bundles(dirs, include=include)
    bundles: dict[str, Bundle] = {}
    errors: dict[str, BundleError] = {}
    for name, path in listing.paths.items():
        try:
            bundles[name] = load_bundle(path, follow_symlinks=follow_symlinks)
        except BundleError as exc:
            errors[name] = exc
    for name, directory in listing.duplicates.items():
        first = listing.paths[name].parent
        errors.setdefault(
            name,
            BundleError(
                name,
                f"found in both {first} and {directory}; bundle names must be unique across "
                f"model_dirs (serving the one in {first})",
            ),
        )
    return ScanResult(bundles=bundles, errors=errors)
