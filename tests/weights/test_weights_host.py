"""The host store against real ``weights.safetensors`` files written in tmp."""

from __future__ import annotations

import gc
import json
import mmap
import os
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import attrs
import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import save_file

from reactantserver.errors import BundleError
from reactantserver.weights import WEIGHTS_FILE, HostStore, map_weights, read_layout
from reactantserver.weights.host import PACK_ALIGN, materialize, pack_offsets

ORDER = ["w2", "b", "w1", "scalar", "empty", "bf"]


def tensors() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "w1": rng.standard_normal((4, 3)).astype(np.float32),
        "b": np.arange(5, dtype=np.int64),
        "w2": rng.standard_normal((2, 2, 2)).astype(np.float16),
        "scalar": np.array(7.5, dtype=np.float64),
        "empty": np.zeros((0, 3), dtype=np.float32),
        "bf": np.array([1.5, -2.0, 3.25], dtype=ml_dtypes.bfloat16),
    }


@pytest.fixture
def bundle(tmp_path: Path) -> Path:
    d = tmp_path / "mymodel"
    d.mkdir()
    save_file(tensors(), str(d / WEIGHTS_FILE), metadata={"argument_order": json.dumps(ORDER)})
    return d / WEIGHTS_FILE


def write_raw(path: Path, header: dict[str, Any], data: bytes = b"") -> Path:
    raw = json.dumps(header).encode()
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)
    return path


def test_layout_follows_argument_order_without_reading_data(bundle: Path) -> None:
    layout = read_layout(bundle)
    assert layout.names == tuple(ORDER)
    expected = tensors()
    assert layout.nbytes == sum(a.nbytes for a in expected.values())
    for spec in layout.tensors:
        assert spec.shape == expected[spec.name].shape
        assert spec.dtype == expected[spec.name].dtype
    assert [s.dtype_name for s in layout.tensors] == ["F16", "I64", "F32", "F64", "F32", "BF16"]


def test_materialize_reads_every_tensor_into_one_packed_buffer(bundle: Path) -> None:
    """One RAM buffer per version: each tensor a writable view of it, in argument order, at
    a PACK_ALIGN boundary, with exactly the file's values."""
    layout = read_layout(bundle)
    weights = materialize("mymodel", layout)
    assert not weights.mapped and weights.packed is not None
    assert weights.packed.flags.owndata and weights.packed.dtype == np.uint8
    offsets, size = pack_offsets(layout.tensors)
    assert weights.packed.nbytes == size >= layout.nbytes
    start = weights.packed.ctypes.data
    for name, arr, offset in zip(ORDER, weights.arrays, offsets, strict=True):
        np.testing.assert_array_equal(arr, tensors()[name])
        assert arr.base is not None and arr.flags.writeable and arr.flags.c_contiguous
        assert offset % PACK_ALIGN == 0
        assert arr.size == 0 or arr.ctypes.data == start + offset


def test_pack_offsets_depend_only_on_the_tensors_in_argument_order(bundle: Path) -> None:
    layout = read_layout(bundle)
    offsets, size = pack_offsets(layout.tensors)
    ends = [o + t.nbytes for o, t in zip(offsets, layout.tensors, strict=True)]
    assert list(offsets) == sorted(offsets) and size == ends[-1]
    assert all(e <= o for e, o in zip(ends, offsets[1:], strict=False))  # no overlap
    assert all(o - e < PACK_ALIGN for e, o in zip(ends, offsets[1:], strict=False))  # tight
    assert pack_offsets(()) == ((), 0)


def test_the_allocator_seam_receives_the_one_buffer(bundle: Path) -> None:
    handed_out: list[np.ndarray] = []

    def allocate(shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray:
        out = np.full(shape, 0, dtype)  # stands in for a pinned-memory pool
        handed_out.append(out)
        return out

    store = HostStore(allocate)
    weights = store.materialize("mymodel", read_layout(bundle))
    assert len(handed_out) == 1 and weights.packed is handed_out[0]
    for arr in weights.arrays:  # no copies: views of the allocator's buffer
        assert arr.size == 0 or np.shares_memory(arr, handed_out[0])


def test_a_transient_copy_is_read_into_one_buffer_never_mapped(bundle: Path) -> None:
    """Issue 41: the transient copy of an unpinned/device load was a memory map, and a
    file truncated under it killed the worker with SIGBUS. It is read now: every array is
    a read-only view of the load's one buffer, and the file changing later does not show
    through (the bytes were read)."""
    layout = read_layout(bundle)
    with map_weights("mymodel", layout) as mapped:
        arrays = mapped.weights.arrays
        for name, arr in zip(ORDER, arrays, strict=True):
            np.testing.assert_array_equal(arr, tensors()[name])
            assert not arr.flags.writeable
        bases = set()
        for arr in arrays:
            base = arr
            while isinstance(base.base, np.ndarray):
                base = base.base
            bases.add(id(base))
            assert not isinstance(base.base, memoryview | mmap.mmap)
        assert len(bases) == 1  # one buffer for the whole load
        w1 = arrays[ORDER.index("w1")]
        spec = layout.tensors[ORDER.index("w1")]
        with bundle.open("r+b") as f:
            f.seek(spec.begin)
            f.write(np.float32(42.0).tobytes())
        assert w1.flat[0] == tensors()["w1"].flat[0]
        del arrays, w1
    assert mapped.closed
    with pytest.raises(ValueError, match="closed"):
        _ = mapped.weights


_TRUNCATE_UNDER_A_LOAD = """
import os, sys
import numpy as np
from reactantserver.weights.host import map_weights, read_layout
path = sys.argv[1]
layout = read_layout(path)
with map_weights("m", layout) as loaded:
    os.truncate(path, 0)  # another process cuts the file while the transfer reads it
    print(sum(float(np.asarray(a, dtype=np.float64).sum()) for a in loaded.weights.arrays))
"""


def test_a_file_truncated_under_a_load_does_not_kill_the_process(bundle: Path) -> None:
    """The file cut after the load began, while its arrays are read (as a transfer reads
    them): with a memory map that was SIGBUS (the process died, rc -7); read, the load has
    its bytes already."""
    done = subprocess.run(
        [sys.executable, "-c", _TRUNCATE_UNDER_A_LOAD, str(bundle)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, (done.returncode, done.stderr)
    expected = sum(float(t.astype(np.float64).sum()) for t in tensors().values())
    assert float(done.stdout) == pytest.approx(expected)


def test_a_file_cut_short_before_its_data_is_read_is_a_load_error(bundle: Path) -> None:
    layout = read_layout(bundle)
    os.truncate(bundle, layout.file_size - 10)
    with pytest.raises(BundleError, match="changed size since its header was read"):
        map_weights("mymodel", layout)
    cut = attrs.evolve(layout, file_size=layout.file_size - 10)  # cut after the size check
    with pytest.raises(BundleError, match=r"file ended after \d+ of \d+ bytes"):
        map_weights("mymodel", cut)


def test_closing_a_map_while_a_view_escaped_is_safe(bundle: Path) -> None:
    mapped = map_weights("mymodel", read_layout(bundle))
    kept = mapped.weights.arrays[0]
    mapped.close()  # the map stays alive for `kept` and goes with it
    np.testing.assert_array_equal(kept, tensors()["w2"])
    del kept
    gc.collect()


def test_store_holds_system_copies_and_reports_bytes(bundle: Path) -> None:
    store = HostStore()
    layout = read_layout(bundle)
    store.materialize("a", layout)
    with store.map("b", layout):
        assert store.statistics().maps_open == 1
    stats = store.statistics()
    assert stats.maps_open == 0 and stats.maps == 1 and stats.materializations == 1
    assert dict(stats.models) == {"a": layout.nbytes}
    assert stats.resident_bytes == layout.nbytes
    store.rename("a", "z")
    weights = store.get("z")
    assert weights is not None and weights.model == "z"
    assert store.drop("z") and not store.drop("z")
    assert store.statistics().resident_bytes == 0


def test_a_file_without_tensors_needs_no_argument_order(tmp_path: Path) -> None:
    path = write_raw(tmp_path / "m" / WEIGHTS_FILE, {"__metadata__": {}})
    layout = read_layout(path)
    assert layout.names == () and layout.nbytes == 0
    with map_weights("m", layout) as mapped:
        assert mapped.weights.arrays == ()


F32x2 = {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}
ORDER_X = {"argument_order": '["x"]'}


@pytest.mark.parametrize(
    ("header", "data", "match"),
    [
        ({"x": F32x2}, bytes(8), "argument_order.* is missing"),
        ({"__metadata__": {"argument_order": '["y"]'}, "x": F32x2}, bytes(8), "not listed"),
        ({"__metadata__": {"argument_order": '["x","x"]'}, "x": F32x2}, bytes(8), "twice"),
        ({"__metadata__": {"argument_order": "x"}, "x": F32x2}, bytes(8), "not JSON"),
        ({"__metadata__": ORDER_X, "x": {**F32x2, "dtype": "C64"}}, bytes(8), "dtype 'C64'"),
        ({"__metadata__": ORDER_X, "x": {**F32x2, "shape": [3]}}, bytes(8), "needs 12 bytes"),
        ({"__metadata__": ORDER_X, "x": F32x2}, bytes(4), r"data_offsets \[0, 8\]"),
        ({"__metadata__": ORDER_X, "x": {**F32x2, "shape": [-2]}}, bytes(8), "integers >= 0"),
        (
            {"__metadata__": ORDER_X, "x": {**F32x2, "shape": [2**62, 2**62]}},
            bytes(8),
            "needs",
        ),
    ],
)
def test_malformed_files_are_bundle_errors_naming_the_bundle(
    tmp_path: Path, header: dict[str, Any], data: bytes, match: str
) -> None:
    path = write_raw(tmp_path / "broken" / WEIGHTS_FILE, header, data)
    with pytest.raises(BundleError, match=match) as info:
        read_layout(path)
    assert info.value.bundle == "broken"


def test_a_truncated_or_garbled_header_is_a_bundle_error(tmp_path: Path) -> None:
    path = tmp_path / "t" / WEIGHTS_FILE
    path.parent.mkdir()
    path.write_bytes(b"\x01\x02")
    with pytest.raises(BundleError, match="too short"):
        read_layout(path)
    path.write_bytes(struct.pack("<Q", 10**6) + b"{}")
    with pytest.raises(BundleError, match="does not fit the file"):
        read_layout(path)
    path.write_bytes(struct.pack("<Q", 3) + b"{{{")
    with pytest.raises(BundleError, match="not valid JSON"):
        read_layout(path)
    with pytest.raises(BundleError, match="cannot read"):
        read_layout(tmp_path / "missing" / WEIGHTS_FILE)


def test_a_file_that_shrank_after_its_header_was_read_is_caught(bundle: Path) -> None:
    layout = read_layout(bundle)
    with bundle.open("r+b") as f:
        f.truncate(layout.file_size - 4)
    with pytest.raises(BundleError, match="changed size"):
        map_weights("mymodel", layout)
    with pytest.raises(BundleError, match="file ended after"):
        materialize("mymodel", layout)
