"""The checks a configuration needs the filesystem for: is the model repository there?

Theory of operation
-------------------
Everything else in ``config`` is a pure function of the file and the environment; this
module is the one place that looks at the disk, so that a node file naming a missing
or unreadable ``model_repo`` is refused at load time -- by ``reactantserver config`` as
much as by ``reactantserver serve`` -- with the line to fix, instead of surfacing later
as an exception from deep inside a starting worker.

A repository must be a directory the process can list (``os.scandir``: it needs read
and search permission). An empty directory is fine: in ``dynamic`` mode bundles may
arrive later. The paths checked are the effective ones (relative paths anchored at the
node file's directory, ``INFERENCE_SERVER_MODEL_DIRS`` applied), and the message shows
both what was written and, when it differs, the absolute path it means.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from .schema import ServerConfig
from .source import Origin, Path, Problem, show

EXPECTED = "expected a readable directory of model bundles"


def directory_problem(path: str) -> str | None:
    """Why ``path`` cannot serve as a model repository (``None``: it can)."""
    try:
        with os.scandir(path):
            return None
    except FileNotFoundError:
        return "does not exist"
    except NotADirectoryError:
        return "is not a directory"
    except PermissionError:
        return "cannot be read (permission denied)"
    except OSError as exc:
        return f"cannot be read ({exc.strerror or exc})"


def repository_problems(
    cfg: ServerConfig, written: Callable[[Path], object], locate: Callable[[Path], Origin]
) -> list[Problem]:
    """A problem for each of ``cfg.model_dirs`` that is not a readable directory.

    ``written(path)`` is the value as the operator wrote it (before anchoring), for the
    message; ``locate(path)`` where it came from.
    """
    found = []
    for index, directory in enumerate(cfg.model_dirs):
        if not directory.strip():
            continue  # the rules already say an empty entry is wrong
        why = directory_problem(directory)
        if why is None:
            continue
        raw = written(("model_dirs", index))
        shown = show(raw if isinstance(raw, str) else directory)
        if isinstance(raw, str) and os.path.normpath(raw) != directory:
            shown += f" ({directory})"
        found.append(
            Problem(locate(("model_dirs", index)), f"{EXPECTED}; got {shown}, which {why}")
        )
    return found
