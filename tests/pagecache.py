"""What part of a file is in the page cache, for tests of the page-cache budget."""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os

_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long)
_libc.munmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
_libc.mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p)


def resident_bytes(path) -> int:
    """How much of the file is in the page cache (mincore over a read-only mapping)."""
    size = os.path.getsize(path)
    fd = os.open(path, os.O_RDONLY)
    try:
        address = _libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        assert address not in (None, ctypes.c_void_p(-1).value), os.strerror(ctypes.get_errno())
        pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
        vector = ctypes.create_string_buffer(pages)
        try:
            assert _libc.mincore(address, size, vector) == 0, os.strerror(ctypes.get_errno())
        finally:
            _libc.munmap(address, size)
        return sum(byte & 1 for byte in vector.raw[:pages]) * mmap.PAGESIZE
    finally:
        os.close(fd)
