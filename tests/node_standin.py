"""A stand-in child for supervisor tests: reports what it was started with, then behaves
as ``STANDIN_MODE`` says. Run as ``python node_standin.py``.

It prints one JSON line first (``{"pid", "env", "cpus"}``: the variables the supervisor
sets, and the CPU affinity it was given), then:

* ``serve`` (default): wait for SIGTERM, print ``stopping <name>`` and exit 0;
* ``crash``: exit 3 at once;
* ``stubborn``: print ``ignoring SIGTERM`` on each SIGTERM and keep running;
* ``chatty``: write lines to stdout and stderr and a last line without a newline, then
  wait like ``serve``.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

KEYS = (
    "CUDA_VISIBLE_DEVICES",
    "REACTANT_WORKER_NAME",
    "REACTANT_WORKER_THREADS",
    "OMP_NUM_THREADS",
    "INFERENCE_SERVER_ENDPOINTS_PORT",
)


def main() -> None:
    mode = os.environ.get("STANDIN_MODE", "serve")
    name = os.environ.get("REACTANT_WORKER_NAME", "gateway")
    report = {
        "pid": os.getpid(),
        "argv": sys.argv[1:],
        "env": {key: os.environ[key] for key in KEYS if key in os.environ},
        "cpus": sorted(os.sched_getaffinity(0)),
    }
    if mode == "stubborn":
        signal.signal(signal.SIGTERM, lambda *_: print("ignoring SIGTERM", flush=True))
    else:

        def stop(*_: object) -> None:
            # chatty closed its stdout; stderr is still there
            print(f"stopping {name}", flush=True, file=sys.stderr if mode == "chatty" else None)
            sys.exit(0)

        signal.signal(signal.SIGTERM, stop)
    # Report only once the handlers are in place: a test signals as soon as it reads this.
    print(json.dumps(report), flush=True)
    if mode == "crash":
        sys.exit(3)
    if mode == "chatty":
        print("out one\nout two", flush=True)
        print("err one", file=sys.stderr, flush=True)
        sys.stdout.write("no newline at the end")
        sys.stdout.flush()
        os.close(1)  # EOF on stdout: the partial line must still arrive
    while True:
        time.sleep(0.1)  # real-clock: the stand-in idles until it is stopped


if __name__ == "__main__":
    main()
