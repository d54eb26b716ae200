"""The repository diff, sans-IO: successive polls in, debounced add / replace / remove out.

This module decides; it never touches a file or a clock. The worker's repository
watcher (``reactantserver.worker.repository``) lists the bundle directories every
``model_poll_seconds`` and hands each listing to :class:`RepositoryWatch`.

:class:`RepositoryWatch` is given, at each poll, the signature of every bundle
directory it can see (``reactantserver.bundle.signature``: name, size and mtime of
each visible top-level file, so the manifest, the artifact, the weights, ``model.py``
and anything else in the bundle). It remembers the signature it last *acted on* per
name and returns :class:`Action` s:

* a signature that differs from the acted one is acted on only when the very same
  signature was also seen on the previous poll. A bundle being copied or rewritten
  changes between polls and is left alone until it settles; a change that is undone
  before the second poll is never acted on;
* absence works the same way: a directory missing on two consecutive polls is removed;
* the acted signature is recorded when the action is returned, whatever its outcome:
  a version that fails to load is not retried at every poll, only once its files
  change again (touching any file of the bundle is enough to ask for a retry).

Invariants (checked by ``tests/lifecycle/test_lifecycle.py``): an action for ``(name, sig)`` at
poll *k* means polls *k-1* and *k* both saw ``sig`` (both saw no directory for a
removal); no action repeats the acted signature; after two identical consecutive polls
the acted view equals the polled view.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Literal

import attrs

from ..bundle import Signature

__all__ = ["Action", "RepositoryWatch", "changed_files"]


@attrs.frozen
class Action:
    """What the repository diff asks the worker to do with one bundle."""

    kind: Literal["add", "replace", "remove"]
    name: str
    #: The signature to load (empty for ``remove``).
    signature: Signature
    #: The signature acted on before (empty for ``add``).
    previous: Signature = ()


def changed_files(old: Signature, new: Signature) -> list[str]:
    """Names of the files that differ between two signatures (added, removed or changed)."""
    before = {name: (size, mtime) for name, size, mtime in old}
    after = {name: (size, mtime) for name, size, mtime in new}
    return sorted(n for n in before.keys() | after.keys() if before.get(n) != after.get(n))


class RepositoryWatch:
    """Turns successive repository polls into debounced add/replace/remove actions."""

    def __init__(self, acted: Mapping[str, Signature] | None = None) -> None:
        #: name -> the signature last acted on (what the worker loaded or tried to load).
        self._acted: dict[str, Signature] = dict(acted or {})
        #: name -> the differing signature seen on the last poll (``None``: no directory).
        self._pending: dict[str, Signature | None] = {}

    @property
    def acted(self) -> Mapping[str, Signature]:
        return MappingProxyType(self._acted)

    @property
    def pending(self) -> Mapping[str, Signature | None]:
        """Changes seen once, waiting for a second identical poll."""
        return MappingProxyType(self._pending)

    def observe(self, scan: Mapping[str, Signature]) -> list[Action]:
        """One poll's view (name -> signature); the actions due now, sorted by name.

        Removals come first, so a bundle renamed on disk frees its old name's memory
        before the new name compiles.
        """
        actions: list[Action] = []
        # Pending names too: a change that vanished again must be forgotten.
        for name in sorted(self._acted.keys() | scan.keys() | self._pending.keys()):
            now = scan.get(name)
            before = self._acted.get(name)
            if now == before:
                self._pending.pop(name, None)
                continue
            if name not in self._pending or self._pending[name] != now:
                self._pending[name] = now  # first sighting: wait for the next poll
                continue
            del self._pending[name]
            if now is None:
                assert before is not None
                del self._acted[name]
                actions.append(Action("remove", name, (), before))
            else:
                self._acted[name] = now
                kind: Literal["add", "replace"] = "add" if before is None else "replace"
                actions.append(Action(kind, name, now, before or ()))
        actions.sort(key=lambda a: (a.kind != "remove", a.name))
        return actions
