"""Reading the records both coordinators keep in their internal topics.

`__consumer_offsets` and `__transaction_state` use Kafka's message encodings: classic
(int16/int32 lengths) or flexible (compact lengths, tagged fields). One bounds-checked reader
serves both, so a short or malformed record raises RecordFormatError, never IndexError.
"""

from __future__ import annotations

import struct

_I8 = struct.Struct(">b")
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")


class RecordFormatError(ValueError):
    """A key or value in an internal topic that does not parse."""


class RecordReader:
    def __init__(self, data: bytes, flexible: bool = False):
        self.data = memoryview(data)
        self.pos = 0
        self.flexible = flexible

    def _take(self, n: int) -> memoryview:
        if n < 0 or self.pos + n > len(self.data):
            raise RecordFormatError("record is truncated")
        chunk = self.data[self.pos:self.pos + n]
        self.pos += n
        return chunk

    def int8(self) -> int:
        return _I8.unpack(self._take(1))[0]

    def int16(self) -> int:
        return _I16.unpack(self._take(2))[0]

    def int32(self) -> int:
        return _I32.unpack(self._take(4))[0]

    def int64(self) -> int:
        return _I64.unpack(self._take(8))[0]

    def uvarint(self) -> int:
        value = shift = 0
        while True:
            byte = self._take(1)[0]
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return value
            shift += 7
            if shift > 28:
                raise RecordFormatError("varint is too long")

    def nullable_string(self) -> str | None:
        length = self.uvarint() - 1 if self.flexible else self.int16()
        if length < 0:
            return None
        return bytes(self._take(length)).decode()

    def string(self) -> str:
        value = self.nullable_string()
        if value is None:
            raise RecordFormatError("null in a non-nullable string")
        return value

    def bytes_(self) -> bytes:
        length = self.uvarint() - 1 if self.flexible else self.int32()
        if length < 0:
            raise RecordFormatError("null in a non-nullable bytes field")
        return bytes(self._take(length))

    def nullable_array_length(self) -> int | None:
        length = self.uvarint() - 1 if self.flexible else self.int32()
        return None if length < 0 else length

    def array_length(self) -> int:
        length = self.nullable_array_length()
        if length is None:
            raise RecordFormatError("null in a non-nullable array")
        return length

    def tagged_fields(self) -> dict[int, bytes]:
        """The tagged-field section of a flexible structure (nothing in classic encodings)."""
        fields = {}
        if self.flexible:
            for _ in range(self.uvarint()):
                tag = self.uvarint()
                fields[tag] = bytes(self._take(self.uvarint()))
        return fields

    def expect_end(self) -> None:
        if self.pos != len(self.data):
            raise RecordFormatError("trailing bytes after the record")
