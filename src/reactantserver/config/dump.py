"""The effective configuration as YAML: for the log line at start and ``reactantserver config``.

``to_plain`` turns any record of ``schema`` into plain data with the YAML spellings
(``global_`` -> ``global``, a worker entry's settings inline), keys in schema order;
``dump_config`` renders it. The output of ``dump_config(resolve_worker(...))`` is a valid
settings document: every key it prints is one the schema accepts, with its effective
value, so an operator can read exactly what a worker runs with.
"""

from __future__ import annotations

import io
from collections.abc import Mapping
from typing import Any

import attrs
from ruamel.yaml import YAML
from ruamel.yaml.representer import RoundTripRepresenter

from .schema import NodeConfig, WorkerEntry


class _Representer(RoundTripRepresenter):
    """ruamel's round-trip representer, writing None as ``null`` rather than nothing
    (a subclass, so other users of ruamel keep the stock behaviour)."""


_Representer.add_representer(
    type(None), lambda rep, _: rep.represent_scalar("tag:yaml.org,2002:null", "null")
)


def to_plain(obj: Any) -> Any:
    """A record (or mapping, tuple, scalar) as plain ``dict``/``list``/scalars."""
    if attrs.has(type(obj)):
        out: dict[str, Any] = {}
        for field in attrs.fields(type(obj)):
            value = getattr(obj, field.name)
            if field.name == "source":
                continue
            if isinstance(obj, WorkerEntry) and field.name == "settings":
                out.update(to_plain(value))
                continue
            if value is None and isinstance(obj, WorkerEntry | NodeConfig):
                continue  # "not set" has no spelling in a node file but leaving the key out
            out["global" if field.name == "global_" else field.name] = to_plain(value)
        return out
    if isinstance(obj, Mapping):
        return {str(k): to_plain(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [to_plain(v) for v in obj]
    return obj


def dump_config(obj: Any) -> str:
    """YAML text of a record (``ServerConfig``, ``NodeConfig``, ``GatewayConfig``, ...)."""
    yaml = YAML(typ="rt")
    yaml.Representer = _Representer  # before anything makes ruamel build its representer
    yaml.default_flow_style = False
    yaml.indent(mapping=2, sequence=4, offset=2)
    yaml.width = 100
    stream = io.StringIO()
    yaml.dump(to_plain(obj), stream)
    return stream.getvalue()
