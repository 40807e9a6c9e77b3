"""TensorBoard event files written by hand: no TensorBoard, TensorFlow, tensorboardX or torch (``EventFile``).

An event file is a sequence of TFRecords (the data's length as uint64, the masked CRC-32C of those 8
bytes, the data, the data's masked CRC-32C; little-endian), each an ``Event`` protocol buffer: the first
carries ``file_version`` "brain.Event:2", each later one a wall time, a step and a ``Summary`` of one
value, a scalar (``simple_value``) or a text (a string tensor for the text plugin). Only those fields are
encoded, with protobuf's wire format (a key ``field << 3 | wire type``, then a varint, 8 or 4 bytes, or a
length and the bytes), in field order, as protobuf serialises them: the bytes equal tensorboardX's for the
same events (tests/test_tracking.py compares). Why not tensorboardX: importing it imports torch, seconds
that a restarted averager's process would spend before its rounds are quick again.
"""

from __future__ import annotations

import math
import os
import re
import socket
import struct
import time
from collections.abc import Callable
from pathlib import Path

__all__ = ["EventFile", "crc32c", "masked_crc32c"]

FILE_VERSION = b"brain.Event:2"
DT_STRING = 7  # tensorflow.DataType
FLOAT32_MAX = 3.4028234663852886e38
# The characters TensorBoard's summary names may hold; others become "_" (tensorboardX does the same).
_INVALID_TAG = re.compile(r"[^-/\w\.]")


def _crc_table() -> tuple[int, ...]:
    """CRC-32C (Castagnoli, reflected polynomial 0x82F63B78): the byte-at-a-time lookup table."""
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
        table.append(crc)
    return tuple(table)


_TABLE = _crc_table()


def crc32c(data: bytes) -> int:
    """CRC-32C of ``data`` (crc32c(b"123456789") == 0xE3069283). Pure Python: records are a few hundred
    bytes, a round writes a handful."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc32c(data: bytes) -> int:
    """TFRecord's mask: the CRC rotated right by 15 bits plus a constant (a CRC of data holding CRCs)."""
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _varint(value: int) -> bytes:
    """Protobuf's base-128 varint; a negative int64 as its two's complement (10 bytes)."""
    value &= (1 << 64) - 1
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited field (wire type 2): a string, bytes or a nested message."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _event(wall_time: float, step: int, **what: bytes) -> bytes:
    """Event: wall_time (1, double), step (2, int64; 0 is not written), then file_version (3) or
    summary (5)."""
    out = b""
    if wall_time:
        out += b"\x09" + struct.pack("<d", wall_time)
    if step:
        out += b"\x10" + _varint(step)
    if "file_version" in what:
        out += _field(3, what["file_version"])
    if "summary" in what:
        out += _field(5, what["summary"])
    return out


def _scalar_value(tag: str, value: float) -> bytes:
    """Summary.Value: tag (1), simple_value (2, float32; part of a oneof, so 0.0 is written too). A finite
    value beyond float32's range is written as an infinity, as protobuf's conversion makes it."""
    if abs(value) > FLOAT32_MAX:  # NaN compares False: packed as it is
        value = math.copysign(math.inf, value)
    return _field(1, tag.encode()) + b"\x15" + struct.pack("<f", value)


def _text_value(tag: str, text: str) -> bytes:
    """Summary.Value of the text plugin: tag (1); tensor (8): dtype (1) DT_STRING, shape (2) one dim (2) of
    size (1) 1, string_val (8); metadata (9): plugin_data (1), plugin_name (1) "text" (its content, an
    empty TextPluginData, is not written)."""
    shape = _field(2, b"\x08\x01")
    tensor = b"\x08" + _varint(DT_STRING) + _field(2, shape) + _field(8, text.encode("utf-8"))
    metadata = _field(1, _field(1, b"text"))
    return _field(1, f"{tag}/text_summary".encode()) + _field(8, tensor) + _field(9, metadata)


class EventFile:
    """One event file ``<prefix>.out.tfevents.<seconds>.<host><suffix>`` in ``folder``, opened (with its
    version record) when made; ``scalar`` and ``text`` append a record each, ``flush`` puts them on disk
    (fsync: a reader, or a crash, sees every flushed record). ``clock``: the wall time (tests pass one)."""

    def __init__(
        self,
        folder: Path,
        *,
        prefix: str = "events",
        suffix: str = "",
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.clock = clock
        now = clock()
        name = f"{prefix}.out.tfevents.{str(now)[:10]}.{socket.gethostname()}{suffix}"
        self.path = Path(folder) / name
        self._file = open(self.path, "ab")  # noqa: SIM115 (open until close())
        self._write(_event(now, 0, file_version=FILE_VERSION))

    def scalar(self, tag: str, value: float, step: int) -> None:
        """``value`` under ``tag`` (TensorBoard's naming rules applied: other characters become "_")."""
        tag = _INVALID_TAG.sub("_", tag).lstrip("/")
        self._write(_event(self.clock(), step, summary=_field(1, _scalar_value(tag, float(value)))))

    def text(self, tag: str, text: str, step: int) -> None:
        """``text`` under ``tag``/text_summary (the text plugin's dashboard)."""
        self._write(_event(self.clock(), step, summary=_field(1, _text_value(tag, text))))

    def flush(self) -> None:
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        self._file.close()

    def _write(self, data: bytes) -> None:
        header = struct.pack("<Q", len(data))
        record = (
            header + struct.pack("<I", masked_crc32c(header)) + data + struct.pack("<I", masked_crc32c(data))
        )
        self._file.write(record)
