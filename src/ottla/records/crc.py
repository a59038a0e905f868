"""CRC-32C (Kafka's record batch checksum) from the `crc32c` package's C extension, loaded
without running the package's `__init__`: that looks the package's own version up with
`importlib.metadata`, which imports email, zipfile and csv and scans every entry of sys.path
(about 0.05 s of every broker start, more on a loaded machine). The extension is all we use."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
from typing import Callable


def _load() -> Callable[..., int]:
    spec = importlib.util.find_spec("crc32c")  # locates the package; does not run it
    for directory in (spec.submodule_search_locations or []) if spec else []:
        for suffix in importlib.machinery.EXTENSION_SUFFIXES:
            path = os.path.join(directory, "_crc32c" + suffix)
            if os.path.isfile(path):
                loader = importlib.machinery.ExtensionFileLoader("crc32c._crc32c", path)
                module = importlib.util.module_from_spec(importlib.util.spec_from_loader(loader.name, loader))
                loader.exec_module(module)
                return module.crc32c
    from crc32c import crc32c as packaged  # a layout we do not know: the ordinary import

    return packaged


crc32c = _load()
