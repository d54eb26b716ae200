"""The model repository's driver: the startup load, and dynamic mode's watcher.

Theory of operation
-------------------
:meth:`RepositoryDriver.load_startup_set` loads the startup set -- ``models_include``, or
every bundle when it is empty, in every mode -- and returns the signatures it came from.
A repository directory without a ``manifest.yaml`` is no bundle: it gets one warning
line, the first time a listing shows it (not one per poll; again only if it comes back
after it was fixed or removed).
They are taken *before* the bundles are read: a file that changes in between then
differs from the baseline and is reloaded by the watcher, never missed. Bundles that
fail their checks are reported and listed as failed; in explicit mode every other bundle
of the repository is listed as not loaded (the control plane may load it). The models
load one at a time in ``startup_order`` (with the cache on, the warm-ups are its probe),
meta models last.

:meth:`RepositoryDriver.watch` is dynamic mode's loop, one small Trio loop over the
sans-IO :class:`~reactantserver.lifecycle.RepositoryWatch`: every ``model_poll_seconds``
list the repository (in a thread: one directory listing and one ``stat`` per file),
hand the listing to the watch, and carry out the settled changes it returns through the
lifecycle driver, one at a time. A repository that cannot be listed is reported and
skipped -- never taken for an empty one, which would unload everything.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from functools import partial
from pathlib import Path

import attrs
import trio

from ..bundle import MANIFEST_FILE, Signature, find_bundles, scan_repository, signature
from ..config import ServerConfig
from ..lifecycle import Action, ModelState, ModelVersions, RepositoryWatch, changed_files
from ..models import ServedModel
from ..runtime.weight_provider import startup_order
from ..threads import ThreadRunner
from .build import Version
from .lifecycle import LifecycleDriver

__all__ = ["RepositoryDriver", "RepositoryListing", "RepositoryStatistics", "list_signatures"]

# One logger for the whole worker package (operators filter on "reactantserver.worker").
log = logging.getLogger(__package__)

#: name -> (bundle directory, signature) of every bundle the repository shows now.
Listing = Mapping[str, tuple[Path, Signature]]


@attrs.frozen
class RepositoryListing:
    """One listing of the repository: its bundles, and the directories that are none."""

    #: name -> (bundle directory, signature), the first directory winning.
    bundles: Mapping[str, tuple[Path, Signature]]
    #: Visible subdirectories without a manifest.yaml.
    unbundled: tuple[Path, ...] = ()


def list_signatures(model_dirs: Sequence[str], include: Sequence[str]) -> RepositoryListing:
    """Every bundle directory (first one wins) and its signature; blocking (a thread).

    Raises ``OSError`` when a repository directory cannot be listed.
    """
    found = find_bundles(model_dirs, include=include)
    out: dict[str, tuple[Path, Signature]] = {}
    for name, path in found.paths.items():
        sig = signature(path)
        if sig:  # empty: the directory vanished while we looked
            out[name] = (path, sig)
    return RepositoryListing(out, found.unbundled)


@attrs.frozen
class RepositoryStatistics:
    """The watcher's progress, for metrics and tests."""

    #: Repository polls completed (listed and diffed), failed ones not counted.
    polls: int
    #: Polls that could not list the repository.
    poll_failures: int


class RepositoryDriver:
    """The startup load and dynamic mode's watcher (see the module docstring)."""

    def __init__(
        self,
        config: ServerConfig,
        versions: ModelVersions[Version],
        lifecycle: LifecycleDriver,
        *,
        thread: ThreadRunner,
    ) -> None:
        self._config = config
        self._versions = versions
        self._lifecycle = lifecycle
        self._thread = thread
        self._polls = 0
        self._poll_failures = 0
        #: Directories without a manifest the log has named (each once while it lasts).
        self._unbundled: set[Path] = set()

    def statistics(self) -> RepositoryStatistics:
        return RepositoryStatistics(polls=self._polls, poll_failures=self._poll_failures)

    async def load_startup_set(self) -> dict[str, Signature]:
        """Load the startup set; the signatures it came from (the watch's baseline)."""
        cfg = self._config
        explicit = cfg.model_control_mode == "explicit"
        found = await self._thread(
            list_signatures, cfg.model_dirs, () if explicit else cfg.models_include
        )
        self._note_unbundled(found.unbundled)
        listing = found.bundles
        scan = await self._thread(
            partial(
                scan_repository,
                cfg.model_dirs,
                include=cfg.models_include,
                follow_symlinks=cfg.follow_symlinks,
            )
        )
        versions = self._versions
        if explicit:
            for name in listing:  # the control plane may load any bundle
                versions.declare(name)
        for name, error in scan.errors.items():
            log.error("%s", error)
            if name not in scan.bundles:  # a duplicate name keeps its first bundle
                versions.begin_load(name)
                versions.load_failed(name, error.public)  # the log above has the detail
        for name in scan.bundles:
            versions.begin_load(name)  # readiness lists them as loading until they are
        for name in startup_order(scan.bundles, cfg):
            await self._lifecycle.load(name, scan.bundles[name], begun=True)
        await self._lifecycle.finish_startup()
        ready = sorted(n for n, v in versions.current.items() if isinstance(v, ServedModel))
        failed = versions.states.in_state(ModelState.FAILED)
        log.info(
            "startup load done: %d model(s) ready (%s), %d failed%s",
            len(ready),
            ", ".join(ready) or "none",
            len(failed),
            f" ({', '.join(failed)})" if failed else "",
        )
        baseline = {name: sig for name, (_, sig) in listing.items() if name in scan.errors}
        baseline.update({name: b.signature for name, b in scan.bundles.items()})
        return baseline

    async def watch(self, baseline: Mapping[str, Signature]) -> None:
        """Dynamic mode: poll the repository and act on settled changes, one at a time."""
        cfg = self._config
        watch = RepositoryWatch(baseline)
        log.info(
            "watching %s every %g s for added, changed and removed bundles",
            ", ".join(cfg.model_dirs),
            cfg.model_poll_seconds,
        )
        while True:
            await trio.sleep(cfg.model_poll_seconds)
            try:
                found = await self._thread(list_signatures, cfg.model_dirs, cfg.models_include)
            except OSError as exc:
                self._poll_failures += 1
                log.warning("repository poll failed (%s); leaving every model as it is", exc)
                continue
            self._note_unbundled(found.unbundled)
            listing = found.bundles
            actions = watch.observe({name: sig for name, (_, sig) in listing.items()})
            for action in actions:
                await self._apply(action, listing)
            self._polls += 1

    def _note_unbundled(self, unbundled: Sequence[Path]) -> None:
        """One warning per repository directory that has no manifest, while it has none."""
        now = set(unbundled)
        for path in sorted(now - self._unbundled):
            log.warning(
                "repository: %s has no %s, so it is not a bundle (add the manifest, or "
                "move the directory out of the repository)",
                path,
                MANIFEST_FILE,
            )
        self._unbundled = now

    async def _apply(self, action: Action, listing: Listing) -> None:
        """Carry out one repository change through the lifecycle driver."""
        name = action.name
        if action.kind == "remove":
            log.info("repository: %r was removed; unloading it", name)
            state = self._versions.state(name)
            if state in (ModelState.READY, ModelState.FAILED):
                await self._lifecycle.unload(name)
            if self._versions.state(name) is ModelState.UNLOADED:
                self._versions.forget(name)
            return
        files = ", ".join(changed_files(action.previous, action.signature))
        if action.kind == "add":
            log.info("repository: %r is new; loading it", name)
        elif name in self._versions.current:
            log.info(
                "repository: %r changed (%s); loading the new version while the current one serves",
                name,
                files,
            )
        else:
            log.info("repository: %r changed (%s); trying to load it again", name, files)
        await self._lifecycle.load(name, listing[name][0])
