"""Files of the on-disk caches under FNX_CACHE_DIR (compiled code, BEAM's schedules), written so that a reader
never sees half of one; below lowering and the backends, so both can write them."""
from __future__ import annotations

import os
import tempfile


def write_atomically(path: str, data: bytes) -> None:
    """Write a cache file under a temporary name, then rename it (readers never see half a file). A read-only or
    full disk only costs the cache: the error is ignored."""
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".tmp-")
        with os.fdopen(fd, "wb") as f: f.write(data)
        os.replace(tmp, path)
    except OSError:
        return


__all__ = ["write_atomically"]
