"""Build the CPU variant of the image without any registry, and run it: ``nox -s image``.

No Docker engine runs here and no registry is reachable, so this builds the Dockerfile on
a Debian base made locally and starts the result the way a container runtime would:

1. **Base.** ``debootstrap --variant=minbase bookworm`` from the Debian package mirror,
   imported into podman's store as ``localhost/debian:bookworm-minbase`` (once; cached).
2. **Build.** ``podman build --isolation chroot`` of the repository's Dockerfile with
   ``BASE_IMAGE`` = that base and ``JAX_EXTRA=jax``. The host's CA bundle is mounted for
   the build's ``pip`` only (a machine whose registries sit behind an inspecting proxy
   needs it); it does not end up in the image.
3. **Run.** The image's file system is exported and its ``ENTRYPOINT`` + ``CMD`` run as its
   ``USER``, in its ``WORKDIR`` with its ``ENV``, in new PID and mount namespaces (tini is
   PID 1 there), with a one-bundle repository and a CPU node file mounted where the
   compose file mounts them. (podman's own ``run`` needs a cgroup setup this kind of
   machine does not have; namespaces + chroot are what a runtime does underneath.)
4. **Check.** The image's own ``HEALTHCHECK`` command fails while the node starts and
   passes once it is ready; ``double`` answers ``[0..15] -> [0, 2, ..., 30]`` on the
   public port; SIGTERM to PID 1 drains the node and everything exits 0.

Needs root, podman, debootstrap, unshare and chroot. Prints what it proved.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BASE = "localhost/debian:bookworm-minbase"
IMAGE = "localhost/reactantserver:0.1.0-cpu"
MIRROR = "http://deb.debian.org/debian"
TOOLS = ("podman", "debootstrap", "unshare", "chroot")


def run(*argv: str, **kwargs: object) -> subprocess.CompletedProcess[str]:
    print("+", " ".join(argv), flush=True)
    return subprocess.run(argv, check=True, text=True, **kwargs)  # type: ignore[call-overload]


def missing_tools() -> list[str]:
    return [tool for tool in TOOLS if shutil.which(tool) is None]


def base_image(work: Path) -> None:
    if subprocess.run(["podman", "image", "exists", BASE]).returncode == 0:
        return
    rootfs = work / "debian-rootfs"
    if not (rootfs / "etc" / "debian_version").exists():
        shutil.rmtree(rootfs, ignore_errors=True)
        run("debootstrap", "--variant=minbase", "bookworm", str(rootfs), MIRROR)
    tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
    run("podman", "import", "-", BASE, stdin=tar.stdout)
    tar.wait()


def build(work: Path) -> None:
    mounts: list[str] = []
    bundle = Path("/etc/ssl/certs/ca-certificates.crt")
    if bundle.exists():
        pip_conf = work / "pip.conf"
        pip_conf.write_text("[global]\ncert = /run/host-ca.crt\n")
        mounts = ["-v", f"{pip_conf}:/etc/pip.conf:ro", "-v", f"{bundle}:/run/host-ca.crt:ro"]
    run(
        "podman", "build", "--format", "docker", "--isolation", "chroot", "--network", "host",
        *mounts,
        "--build-arg", f"BASE_IMAGE={BASE}", "--build-arg", "JAX_EXTRA=jax",
        "-t", IMAGE, str(ROOT),
    )  # fmt: skip


def export_rootfs(work: Path) -> tuple[Path, dict[str, object]]:
    rootfs = work / "image-rootfs"
    shutil.rmtree(rootfs, ignore_errors=True)
    rootfs.mkdir(parents=True)
    cid = run("podman", "create", IMAGE, capture_output=True).stdout.strip()
    try:
        export = subprocess.Popen(["podman", "export", cid], stdout=subprocess.PIPE)
        run("tar", "-C", str(rootfs), "-x", stdin=export.stdout)
        export.wait()
    finally:
        run("podman", "rm", cid, capture_output=True)
    inspect = run("podman", "image", "inspect", IMAGE, capture_output=True).stdout
    data = json.loads(inspect)[0]
    config: dict[str, object] = dict(data["Config"])
    config["Healthcheck"] = data.get("Healthcheck")  # podman keeps it beside Config
    return rootfs, config


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def inside(rootfs: Path, config: dict[str, object], argv: list[str], extra_env: dict[str, str]) -> list[str]:  # fmt: skip
    """The command line that runs ``argv`` as the image would: its user, workdir and env."""
    env = [*map(str, config.get("Env") or []), *(f"{k}={v}" for k, v in extra_env.items())]
    user = str(config.get("User") or "0:0")
    workdir = str(config.get("WorkingDir") or "/")
    script = f'cd {workdir} && exec "$@"'
    return ["chroot", f"--userspec={user}", str(rootfs), "/usr/bin/env", "-i", *env,
            "/bin/sh", "-c", script, "sh", *argv]  # fmt: skip


def smoke(work: Path, rootfs: Path, config: dict[str, object]) -> list[str]:
    proved: list[str] = []
    models = work / "models"
    if not (models / "double" / "manifest.yaml").exists():
        run(sys.executable, str(ROOT / "examples" / "build_repo.py"), "--only", "double",
            "--out", str(models))  # fmt: skip
    grpc_port, admin_port = free_port(), free_port()
    node = work / "node.yaml"
    node.write_text(
        "model_repo: /var/lib/reactantserver/models\ngpus: 0\n"
        "global:\n  cache_dir: /var/cache/reactantserver\n  model_control_mode: static\n"
        "  runtime: {backend: cpu}\n  endpoints: {host: 0.0.0.0}\n"
        f"gateway:\n  listen: {{grpc: '0.0.0.0:{grpc_port}', metrics: '0.0.0.0:{admin_port}'}}\n"
    )
    url = f"http://127.0.0.1:{admin_port}/readyz"
    entry = [*map(str, config["Entrypoint"] or []), *map(str, config["Cmd"] or [])]  # type: ignore[call-overload]
    mounts = (
        f"mount -t proc proc {rootfs}/proc && mount --rbind /dev {rootfs}/dev && "
        f"mount --bind {models} {rootfs}/var/lib/reactantserver/models && "
        f'mount --bind {node} {rootfs}/etc/reactantserver/node.yaml && exec "$@"'
    )
    command = inside(rootfs, config, entry, {"REACTANT_HEALTHCHECK_URL": url})
    log = (work / "node.log").open("w")
    container = subprocess.Popen(
        ["unshare", "--mount", "--pid", "--fork", "--kill-child", "/bin/sh", "-c", mounts, "sh", *command],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    health = config["Healthcheck"]["Test"]  # type: ignore[index]
    assert health[0] == "CMD", health
    check = inside(rootfs, config, list(health[1:]), {"REACTANT_HEALTHCHECK_URL": url})
    try:
        first = subprocess.run(check, capture_output=True, text=True)
        if first.returncode != 0:
            proved.append(f"HEALTHCHECK fails while the node starts: {first.stderr.strip()}")
        deadline = time.monotonic() + 300
        while subprocess.run(check, capture_output=True).returncode != 0:
            assert container.poll() is None, (work / "node.log").read_text()
            assert time.monotonic() < deadline, "not ready in 300 s"
            time.sleep(1)
        proved.append("HEALTHCHECK (the image's own command) passes once the node is ready")
        tini = _pid_one(container.pid)
        status = Path(f"/proc/{tini}/status").read_text()
        uid = next(line.split()[1] for line in status.splitlines() if line.startswith("Uid:"))
        comm = Path(f"/proc/{tini}/comm").read_text().strip()
        proved.append(f"PID 1 of the container is {comm}, running as uid {uid}")

        import numpy as np
        import tritonclient.grpc as grpcclient

        client = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}")
        x = np.arange(16, dtype=np.float32).reshape(1, 16)
        tensor = grpcclient.InferInput("x", [1, 16], "FP32")
        tensor.set_data_from_numpy(x)
        y = client.infer("double", [tensor]).as_numpy("y")
        assert y is not None and np.array_equal(y, 2 * x), y
        client.close()
        proved.append("double answers [0..15] -> [0, 2, ..., 30] on the node's public port")

        os.kill(tini, signal.SIGTERM)
        rc = container.wait(120)
        text = (work / "node.log").read_text()
        assert rc == 0, text
        assert "node stopped (exit status 0)" in text, text
        proved.append("SIGTERM to PID 1: the node drains and the container exits 0")
    finally:
        if container.poll() is None:
            container.kill()
            container.wait()
        log.close()
    return proved


def _pid_one(unshare_pid: int) -> int:
    """The container's PID 1 (tini): the child of the forked unshare helper."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for path in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = path.read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            parent = int(fields[1])
            if parent == unshare_pid:
                child = int(path.parent.name)
                # unshare --fork: unshare -> sh (mounts) exec'ed into chroot ... -> tini
                if Path(f"/proc/{child}/comm").read_text().strip() == "tini":
                    return child
        time.sleep(0.2)
    raise AssertionError("no tini under the container's unshare")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", default=str(ROOT / ".cache" / "image"))
    args = parser.parse_args()
    if missing := missing_tools():
        print(f"cannot build here: {', '.join(missing)} not installed", file=sys.stderr)
        return 2
    if os.geteuid() != 0:
        print("cannot build here: needs root (debootstrap, namespaces)", file=sys.stderr)
        return 2
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    base_image(work)
    build(work)
    rootfs, config = export_rootfs(work)
    proved = [f"built {IMAGE} from the Dockerfile on a debootstrapped Debian, no registry"]
    proved += smoke(work, rootfs, config)
    print("\nWhat this run proved:")
    for line in proved:
        print(f"  - {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
