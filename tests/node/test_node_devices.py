"""Device detection: every source, its parsing, the order they are consulted in, errors.

The I/O of detection (running ``nvidia-smi``, listing ``/dev``) is injected, so these run
without a GPU; ``test_nvidia_smi_on_path_is_run`` runs a fake ``nvidia-smi`` for real.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import pytest

from reactantserver.config.source import EnvOrigin, FileOrigin
from reactantserver.errors import ConfigError
from reactantserver.node import devices as dev
from reactantserver.node.devices import detect

U0 = "GPU-0a1b2c3d-0000-1111-2222-333344445555"
U1 = "GPU-9f8e7d6c-0000-1111-2222-333344445555"
ORIGIN = FileOrigin("node.yaml", 4, ("gpus",))

SMI_TWO = f"GPU 0: NVIDIA H100 80GB HBM3 (UUID: {U0})\nGPU 1: NVIDIA H100 80GB HBM3 (UUID: {U1})\n"
SMI_MIG = (
    f"GPU 0: NVIDIA A100-SXM4-40GB (UUID: {U0})\n"
    "  MIG 3g.20gb     Device  0: (UUID: MIG-aaaa-1111)\n"
    "  MIG 3g.20gb     Device  1: (UUID: MIG-bbbb-2222)\n"
    f"GPU 1: NVIDIA A100-SXM4-40GB (UUID: {U1})\n"
)


def no_smi(env: Mapping[str, str]) -> str | None:
    return None


def smi(output: str):  # type: ignore[no-untyped-def]
    return lambda env: output


def no_dev() -> list[str]:
    return ["null", "nvidiactl", "nvidia-uvm"]


# --- each source's syntax ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "devices"),
    [
        ("2", ("0", "1")),
        (" 3 ", ("0", "1", "2")),
        ("0", ()),
        ("1,3", ("1", "3")),
        ("3,", ("3",)),  # one ordinal (a bare 3 would be a count)
        (f"{U1}, {U0}", (U1, U0)),
        (f"0,{U1}", ("0", U1)),
        ("MIG-GPU-0a1b/1/0", ("MIG-GPU-0a1b/1/0",)),
    ],
)
def test_reactant_gpus_is_a_count_or_a_list(text: str, devices: tuple[str, ...]) -> None:
    assert dev.parse_count_or_list(text, EnvOrigin("REACTANT_GPUS")) == devices


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "",
            "REACTANT_GPUS: expected a device count (0 = a CPU node) or a comma-separated "
            "list of device ordinals or UUIDs; got ''",
        ),
        (" , ", "REACTANT_GPUS: expected a device count"),
        ("-1", "REACTANT_GPUS: expected device ordinals (0, 1, ...) or UUIDs"),
        ("all", "REACTANT_GPUS: expected device ordinals (0, 1, ...) or UUIDs (GPU-..., "),
        ("0,0", "REACTANT_GPUS: expected each device once; '0' is listed twice"),
    ],
)
def test_reactant_gpus_errors_say_what_to_write(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        dev.parse_count_or_list(text, EnvOrigin("REACTANT_GPUS"))
    assert str(info.value).startswith(message)


def test_node_gpus_auto_defers_and_counts_and_lists_decide() -> None:
    assert dev.from_node_gpus("auto", ORIGIN) is None
    assert dev.from_node_gpus(2, ORIGIN) == ("0", "1")
    assert dev.from_node_gpus(0, ORIGIN) == ()
    assert dev.from_node_gpus((1, U0), ORIGIN) == ("1", U0)
    with pytest.raises(ConfigError, match=r"^node.yaml:4: gpus: expected device ordinals"):
        dev.from_node_gpus(("gpu0",), ORIGIN)


@pytest.mark.parametrize(
    ("text", "devices"),
    [
        ("0,1", ("0", "1")),
        (f"{U0}", (U0,)),
        ("", ()),
        ("-1", ()),
        ("2,-1,3", ("2",)),  # CUDA stops at the first invalid token
        (" 1 , 2 ", ("1", "2")),
    ],
)
def test_cuda_visible_devices_like_cuda_reads_it(text: str, devices: tuple[str, ...]) -> None:
    assert dev.from_visible_devices(text) == devices


def test_nvidia_smi_lists_uuids_and_mig_instances_replace_their_gpu() -> None:
    assert dev.from_nvidia_smi(SMI_TWO) == (U0, U1)
    assert dev.from_nvidia_smi(SMI_MIG) == ("MIG-aaaa-1111", "MIG-bbbb-2222", U1)
    assert dev.from_nvidia_smi("GPU 0: Tesla T4\nGPU 1: Tesla T4\n") == ("0", "1")
    assert dev.from_nvidia_smi("No devices were found\n") == ()
    assert dev.from_nvidia_smi("") == ()


def test_dev_nodes_are_plain_nvidia_devices_in_numeric_order() -> None:
    names = ["nvidia10", "nvidiactl", "nvidia2", "nvidia-uvm", "nvidia0", "nvidia-modeset", "sda"]
    assert dev.from_dev_nodes(names) == ("0", "2", "10")


# --- the order ---------------------------------------------------------------------------------


def run(env: Mapping[str, str], gpus: object = "auto", **io: object) -> dev.Detection:
    io.setdefault("nvidia_smi", smi(SMI_TWO))
    io.setdefault("dev_nodes", lambda: ["nvidia0", "nvidia1", "nvidia2"])
    return detect(gpus, ORIGIN, env, **io)  # type: ignore[arg-type]


def test_reactant_gpus_wins_over_everything() -> None:
    found = run({"REACTANT_GPUS": "1", "CUDA_VISIBLE_DEVICES": "5,6,7"}, gpus=(2, 3))
    assert found.devices == ("5",)  # ordinal 0 of the supervisor's own visible devices
    assert found.source == "REACTANT_GPUS=1"
    assert found.explicit
    assert run({"REACTANT_GPUS": "0"}, gpus=2).devices == ()


def test_node_gpus_come_second() -> None:
    found = run({}, gpus=(1, 0))
    assert (found.devices, found.source, found.explicit) == (("1", "0"), "gpus: [1, 0]", True)
    assert found.tried == ("REACTANT_GPUS unset", "gpus: [1, 0]: 1, 0")


def test_host_visible_devices_come_third_and_filter_ordinals() -> None:
    found = run({"CUDA_VISIBLE_DEVICES": f"3,{U1}"})
    assert (found.devices, found.source, found.explicit) == (
        ("3", U1),
        f"CUDA_VISIBLE_DEVICES=3,{U1}",
        False,
    )
    assert run({"CUDA_VISIBLE_DEVICES": ""}).devices == ()  # set but empty: no device
    assert run({"CUDA_VISIBLE_DEVICES": "4,5"}, gpus=(1,)).devices == ("5",)
    assert run({"CUDA_VISIBLE_DEVICES": "4,5"}, gpus=(U0,)).devices == (U0,)


def test_an_ordinal_beyond_the_visible_devices_is_an_error() -> None:
    with pytest.raises(ConfigError) as info:
        run({"REACTANT_GPUS": "3", "CUDA_VISIBLE_DEVICES": "4,5"})
    assert str(info.value) == (
        "REACTANT_GPUS: expected device ordinals below 2, since CUDA_VISIBLE_DEVICES=4,5 "
        "leaves 2 visible; got 2"
    )
    with pytest.raises(ConfigError, match=r"^node.yaml:4: gpus: expected device ordinals below"):
        run({"CUDA_VISIBLE_DEVICES": "4"}, gpus=2)


def test_nvidia_smi_comes_fourth_then_dev_nodes() -> None:
    found = run({})
    assert (found.devices, found.source) == ((U0, U1), "nvidia-smi -L")
    found = run({}, nvidia_smi=no_smi)
    assert (found.devices, found.source) == (("0", "1", "2"), "/dev/nvidia*")
    assert run({}, nvidia_smi=smi("No devices were found")).source == "/dev/nvidia*"


def test_nothing_found_names_every_source_tried() -> None:
    found = run({}, nvidia_smi=no_smi, dev_nodes=no_dev)
    assert found.devices == ()
    assert found.source == "none"
    assert found.tried == (
        "REACTANT_GPUS unset",
        "gpus: auto",
        "CUDA_VISIBLE_DEVICES unset",
        "nvidia-smi -L not on PATH or failed",
        "no /dev/nvidiaN device nodes",
    )


def test_declarative_only_never_looks_at_hardware() -> None:
    def boom(*_: object) -> None:
        raise AssertionError("hardware looked at")

    found = detect("auto", ORIGIN, {}, nvidia_smi=boom, dev_nodes=boom, hardware=False)
    assert (found.devices, found.source) == ((), "none")


def test_nvidia_smi_on_path_is_run(tmp_path: Path) -> None:
    """The real ``run_nvidia_smi``: a fake ``nvidia-smi -L`` found on the given PATH."""
    fake = tmp_path / "nvidia-smi"
    fake.write_text(f'#!/bin/sh\n[ "$1" = "-L" ] || exit 9\nprintf "%s" "{SMI_TWO}"\n')
    fake.chmod(0o755)
    env = {"PATH": f"{tmp_path}{os.pathsep}{os.environ.get('PATH', '')}"}
    assert dev.run_nvidia_smi(env) == SMI_TWO
    assert detect("auto", ORIGIN, env, dev_nodes=no_dev).devices == (U0, U1)
    failing = tmp_path / "fail"
    failing.mkdir()
    (failing / "nvidia-smi").write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed' >&2\nexit 9\n")
    (failing / "nvidia-smi").chmod(0o755)
    assert dev.run_nvidia_smi({"PATH": str(failing)}) is None
    assert dev.run_nvidia_smi({"PATH": str(tmp_path / "nowhere")}) is None
