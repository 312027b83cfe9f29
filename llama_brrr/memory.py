"""Giving freed memory back to the operating system.

glibc's malloc keeps the pages of freed blocks in its arenas (the main heap below the top chunk,
and one arena per thread that allocated) instead of returning them, so a process that loads and
drops models sees its resident set grow although nothing is alive. malloc_trim(0) returns every
whole free page of every arena. Llama.close() calls release_freed_memory() once the engine and
the weights are gone; it is a no-op where glibc is absent (musl, macOS).
"""

from __future__ import annotations

import ctypes
import ctypes.util

_libc = None


def release_freed_memory() -> bool:
    """malloc_trim(0): True when some memory was returned, False otherwise or without glibc."""
    global _libc
    if _libc is None:
        try:
            _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            _libc.malloc_trim.argtypes = [ctypes.c_size_t]
        except (OSError, AttributeError):
            _libc = False
    if _libc is False:
        return False
    return bool(_libc.malloc_trim(0))
