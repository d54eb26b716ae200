"""HTTP/2 SETTINGS as the server keeps them: ours, and the peer's.

Below both :mod:`.h2lean` (the connection that serves) and :mod:`.h2conn` (the corked
writes, which hands out new connections), so that neither imports the other's module
for these and the two do not import each other.

* :func:`local_settings`: every limit of :class:`~.limits.WireLimits` that goes into the
  server's first SETTINGS frame (stream count, header list size, frame size, stream
  window; push disabled), in force from the first byte.
* :class:`Settings`: one side's values, HTTP/2's defaults until a SETTINGS frame changes
  them; :meth:`Settings.apply` takes a received frame's values (checked first:
  :func:`check_received`) and says what changed.

The stream count we advertise is not enforced as a connection error (h2 treats one stream
too many as ``TooManyStreamsError``, GOAWAY, which drops every call of a client that raced
our SETTINGS); RFC 9113 §5.1.2 lets a server refuse just that stream with REFUSED_STREAM,
which gRPC clients retry, and :mod:`.h2guard` does that.
"""

from __future__ import annotations

from collections.abc import ItemsView

from .h2events import ChangedSetting, ErrorCodes, InvalidSettingsValueError, SettingCodes
from .h2wire import DEFAULT_FRAME, DEFAULT_WINDOW, MAX_FRAME_CEILING, MAX_WINDOW
from .limits import WireLimits


def local_settings(limits: WireLimits) -> dict[SettingCodes, int]:
    """Our SETTINGS: every limit, in the first SETTINGS frame."""
    return {
        SettingCodes.MAX_CONCURRENT_STREAMS: limits.max_concurrent_streams,
        SettingCodes.MAX_HEADER_LIST_SIZE: limits.max_header_list_size,
        SettingCodes.MAX_FRAME_SIZE: limits.max_frame_size,
        SettingCodes.INITIAL_WINDOW_SIZE: limits.stream_window,
        SettingCodes.ENABLE_PUSH: 0,
    }


def setting_code(code: int) -> SettingCodes | int:
    """``code`` as a :class:`SettingCodes` member when it is one (unknown codes stay)."""
    try:
        return SettingCodes(code)
    except ValueError:
        return code


def check_received(code: int, value: int, *, from_client: bool) -> None:
    """A received setting's value against its range (RFC 9113 §6.5.2, RFC 8441 §3):
    :class:`~.h2events.InvalidSettingsValueError` with the code RFC 9113 gives."""
    if code == SettingCodes.ENABLE_PUSH:
        bad = value not in (0, 1) or (not from_client and value != 0)
        invalid = ErrorCodes.PROTOCOL_ERROR if bad else None
    elif code == SettingCodes.INITIAL_WINDOW_SIZE:
        invalid = ErrorCodes.FLOW_CONTROL_ERROR if value > MAX_WINDOW else None
    elif code == SettingCodes.MAX_FRAME_SIZE:
        bad = not DEFAULT_FRAME <= value <= MAX_FRAME_CEILING
        invalid = ErrorCodes.PROTOCOL_ERROR if bad else None
    elif code == SettingCodes.ENABLE_CONNECT_PROTOCOL:
        invalid = ErrorCodes.PROTOCOL_ERROR if value not in (0, 1) else None
    else:
        invalid = None
    if invalid is not None:
        raise InvalidSettingsValueError(f"Setting {code} has invalid value {value}", invalid)


class Settings:
    """One side's SETTINGS values: HTTP/2's defaults (``client``: the side's role, for
    ENABLE_PUSH), then ``initial_values``, then what :meth:`apply` sets."""

    __slots__ = ("values",)

    def __init__(self, client: bool, initial_values: dict[SettingCodes, int] | None = None) -> None:
        self.values: dict[SettingCodes | int, int] = {
            SettingCodes.HEADER_TABLE_SIZE: 4096,
            SettingCodes.ENABLE_PUSH: int(client),
            SettingCodes.INITIAL_WINDOW_SIZE: DEFAULT_WINDOW,
            SettingCodes.MAX_FRAME_SIZE: DEFAULT_FRAME,
            SettingCodes.ENABLE_CONNECT_PROTOCOL: 0,
        }
        for code, value in (initial_values or {}).items():
            self.values[code] = value

    def items(self) -> ItemsView[SettingCodes | int, int]:
        return self.values.items()

    @property
    def initial_window_size(self) -> int:
        return self.values[SettingCodes.INITIAL_WINDOW_SIZE]

    @property
    def max_frame_size(self) -> int:
        return self.values[SettingCodes.MAX_FRAME_SIZE]

    def apply(self, received: dict[int, int]) -> dict[SettingCodes | int, ChangedSetting]:
        """A SETTINGS frame's values (already checked), in force now: what changed."""
        changes: dict[SettingCodes | int, ChangedSetting] = {}
        for code, value in received.items():
            key = setting_code(code)
            changes[key] = ChangedSetting(key, self.values.get(key), value)
            self.values[key] = value
        return changes
