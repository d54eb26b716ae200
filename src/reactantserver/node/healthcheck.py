"""``python -m reactantserver.node.healthcheck [URL]``: exit 0 when the node is ready.

The container's ``HEALTHCHECK``: one GET of the node's ``/readyz`` (the gateway's, or the
single worker's), ``REACTANT_HEALTHCHECK_URL`` or ``http://127.0.0.1:8002/readyz`` by
default. Exit status 0 for 200, 1 for anything else (503 while models compile, no
answer), with the reason on stderr. Standard library only: it runs every few seconds
and must start fast.
"""

from __future__ import annotations

import os
import sys
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence

URL_VAR = "REACTANT_HEALTHCHECK_URL"
DEFAULT_URL = "http://127.0.0.1:8002/readyz"


def check(url: str, timeout: float = 4.0) -> tuple[bool, str]:
    """Whether ``url`` answers 200, and what it said."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            body = response.read(200).decode("utf-8", "replace").strip()
            return response.status == 200, f"{response.status} {body}"
    except urllib.error.HTTPError as exc:
        return False, f"{exc.code} {exc.read(200).decode('utf-8', 'replace').strip()}"
    except (OSError, ValueError) as exc:
        return False, f"no answer from {url}: {exc}"


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    environment = os.environ if env is None else env
    url = args[0] if args else environment.get(URL_VAR, DEFAULT_URL)
    ok, said = check(url)
    if not ok:
        print(f"not ready: {said}", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
