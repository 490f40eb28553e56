"""A compiled program's kernels as one shared library in the compile cache, for processes that come after.

A warm process (its lowering and object code on disk) still linked the object code into an MCJIT engine: a target
machine, the engine, adding each object and `finalize_object` took 1.5-2.6 ms per executable (W7's MLP step: 24
KB of code in 4 modules), most of it fixed costs. `dlopen` of the same code linked as a shared library takes about
0.25 ms. So the process that compiled (or MCJIT-linked) an executable's modules links them with the system's C
compiler driver (`cc -shared`, about 40 ms) when it exits, and a later process whose lowering comes from the
cache opens that library instead.

What a library is: `<dir>/<key[:2]>/<key>.so` and beside it `<key>.so.sha256`, the digest of the key and the
library's bytes. The key hashes the target and the object-cache keys of the modules (which hash their IR), so a
library only ever stands for that exact code. A library whose digest does not match (damaged, half written by a
process that died, written for another key) is not opened: the process links the objects with MCJIT as before.

Without a C compiler (no `cc`, `gcc` or `clang` on PATH, or `$CC`), or where linking fails, nothing changes: MCJIT
links every time. The objects are LLVM's JIT code model (absolute addresses in the code), so the library has text
relocations (`-z notext`): the loader patches the code once at `dlopen`, which glibc allows; a system that
forbids it (SELinux's execmod) makes `dlopen` fail, and MCJIT is used.

Libraries are built at exit, within BUILD_BUDGET seconds together (a long test run compiles thousands of
programs; each link is a process), never while the program runs: a build would compete with its kernels.
"""
from __future__ import annotations

import atexit
import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
import time

from fnx.cache_files import write_atomically

BUILD_BUDGET = 1.0  # seconds of linking at exit, all libraries together (a link is about 40 ms)


class Library:
    """The engine-like face of an opened library: `get_function_address(name)`. It is never closed (code from it
    may run until the process ends)."""

    def __init__(self, path: str):
        self.lib = ctypes.CDLL(path)

    def get_function_address(self, name: str) -> int:
        return ctypes.cast(getattr(self.lib, name), ctypes.c_void_p).value


class SharedLibraries:
    """The libraries of one target in cache directory `directory` (None: none are kept)."""

    def __init__(self, directory: str | None, target_id: str):
        self.directory, self.target_id = directory, target_id
        self.pending: dict[str, list[bytes]] = {}  # key -> the objects to link at exit
        self.lock = threading.Lock()
        self.opened = 0  # libraries opened (the tests read it)
        self.invalid: set[str] = set()  # keys whose library on disk did not match its digest: linked again
        if directory is not None: atexit.register(self.build_pending)
        if hasattr(os, "register_at_fork"): os.register_at_fork(after_in_child=self._forget_pending)

    def _forget_pending(self) -> None:
        """In a forked child: the parent links what it compiled; the child only what it compiles itself."""
        self.lock = threading.Lock()
        self.pending = {}

    def key(self, object_keys: list[str]) -> str:
        return hashlib.sha256("\n".join([self.target_id, *object_keys]).encode()).hexdigest()

    def path(self, key: str) -> str:
        return os.path.join(self.directory, key[:2], key + ".so")

    def open(self, key: str) -> Library | None:
        """The library of `key` when it is on disk and its digest matches, else None."""
        if self.directory is None: return None
        path = self.path(key)
        try:
            with open(path + ".sha256") as f: digest = f.read().strip()
            with open(path, "rb") as f: data = f.read()
        except OSError:
            return None
        if hashlib.sha256(key.encode() + data).hexdigest() != digest:
            self.invalid.add(key)
            return None
        try:
            library = Library(path)
        except OSError:  # (a loader that refuses text relocations, a library of another machine)
            return None
        self.opened += 1
        return library

    def keep(self, key: str, objects: list[bytes]) -> None:
        """Link `objects` into the library of `key` when the process exits (unless it is on disk already)."""
        if self.directory is None or _compiler() is None: return
        if os.path.exists(self.path(key)) and key not in self.invalid: return
        with self.lock: self.pending[key] = list(objects)

    def build_pending(self) -> None:
        """Link the pending libraries, oldest first, for at most BUILD_BUDGET seconds."""
        start = time.perf_counter()
        while time.perf_counter() - start < BUILD_BUDGET:
            with self.lock:
                if not self.pending: return
                key = next(iter(self.pending))
                objects = self.pending.pop(key)
            self.build(key, objects, max(1.0, BUILD_BUDGET - (time.perf_counter() - start)))

    def build(self, key: str, objects: list[bytes], timeout: float = 60.0) -> bool:
        """Link `objects` with the C compiler driver (within `timeout` seconds) and store the library under `key`;
        False where that failed."""
        cc = _compiler()
        if cc is None or self.directory is None or not os.path.isdir(self.directory): return False  # (removed)
        with tempfile.TemporaryDirectory(prefix="fnx-link-") as work:
            names = []
            for i, obj in enumerate(objects):
                names.append(os.path.join(work, f"m{i}.o"))
                with open(names[-1], "wb") as f: f.write(obj)
            out = os.path.join(work, "lib.so")
            try:
                done = subprocess.run([cc, "-shared", "-o", out, *names, "-lm", "-Wl,-z,notext"],
                                      capture_output=True, timeout=timeout)
            except (OSError, subprocess.TimeoutExpired):
                return False
            if done.returncode != 0: return False
            with open(out, "rb") as f: data = f.read()
        path = self.path(key)
        write_atomically(path, data)  # (the library first: a digest never names a library not yet there)
        write_atomically(path + ".sha256", hashlib.sha256(key.encode() + data).hexdigest().encode())
        return True


@functools.cache
def _compiler() -> str | None:
    """The C compiler driver that links libraries: $CC, else cc, gcc or clang on PATH; None when there is none."""
    names = [os.environ["CC"]] if os.environ.get("CC") else ["cc", "gcc", "clang"]
    return next((p for p in map(shutil.which, names) if p), None)


__all__ = ["Library", "SharedLibraries", "BUILD_BUDGET"]
