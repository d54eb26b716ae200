"""Model bundles: the on-disk format, its validation, and repository scanning.

JAX-free. A bundle is a directory::

    mlp/
      manifest.yaml          format_version, kind, inputs/outputs, batching, provenance
      model.jaxexport        a serialized jax.export artifact (symbolic batch axis)
      weights.safetensors    weight arguments; __metadata__.argument_order fixes their order
      model.py               optional preprocess/postprocess hooks (required for kind: meta)

``manifest`` parses and validates ``manifest.yaml``; ``weights`` reads and writes the
safetensors file; ``repository`` loads one bundle or scans a repository. The artifact
is checked against the manifest by ``reactantserver.runtime`` (that needs JAX).
See docs/bundles.md for the operator's view.
"""

from .manifest import (
    DEFAULT_ARTIFACT,
    DEFAULT_WEIGHTS,
    EXECUTABLE_DATATYPES,
    FORMAT_VERSION,
    MANIFEST_FILE,
    MODEL_PY,
    Manifest,
    TensorSpec,
    dump_manifest,
    manifest_from_data,
    parse_manifest,
)
from .repository import (
    Bundle,
    BundleListing,
    ScanResult,
    Signature,
    bundle_dirs,
    find_bundles,
    load_bundle,
    scan_repository,
    signature,
)
from .weights import ARGUMENT_ORDER_KEY, WeightSpec, read_weight_specs, read_weights, write_weights

__all__ = [
    "ARGUMENT_ORDER_KEY",
    "DEFAULT_ARTIFACT",
    "DEFAULT_WEIGHTS",
    "EXECUTABLE_DATATYPES",
    "FORMAT_VERSION",
    "MANIFEST_FILE",
    "MODEL_PY",
    "Bundle",
    "BundleListing",
    "Manifest",
    "ScanResult",
    "Signature",
    "TensorSpec",
    "WeightSpec",
    "bundle_dirs",
    "dump_manifest",
    "find_bundles",
    "load_bundle",
    "manifest_from_data",
    "parse_manifest",
    "read_weight_specs",
    "read_weights",
    "scan_repository",
    "signature",
    "write_weights",
]
