"""Worker threads that wait for kernel chunks in native code, so handing a chunk to another core costs about a
microsecond instead of the 40-80 us a ThreadPoolExecutor round trip measured here (a futex wake, then the GIL).

Each worker runs `fnx_worker(ctrl)`, an LLVM function entered once through ctypes (so it holds no GIL): it spins
on its control block's sequence number, runs the chunk it describes, and publishes the number back as done.
After a fraction of a millisecond without work it polls with usleep(50) instead of spinning, and after about
10 ms it sleeps in 2 ms steps and says so: a caller that finds it asleep runs that kernel through the thread pool
instead and calls the worker back for the next ones (so a long pause never costs a 2 ms wait). The caller fills in the
chunk (a kernel's packed entry point, its argument array and loop bounds), bumps the sequence number, runs its own
chunk, then waits for every worker it used in `fnx_wait` (native too, bounded, so a dead worker is noticed rather
than waited on forever). One caller at a time: a caller that finds the pool busy falls back to the thread pool.
"""
from __future__ import annotations

import atexit
import ctypes
import functools
import os
import platform
import threading

import numpy as np

SPINS = 20_000   # pause-loop iterations (a few ms) before an idle worker falls back to polling with usleep(50)
YIELD_AFTER = 1024  # pause-loop iterations (tens of us) of a wait, in the workers' and the caller's spins, after
YIELD_EVERY = 32    # which every 32nd also calls sched_yield: the scheduler sometimes starts a worker on the caller's
                    # core and leaves it there for many ms (a 2-core VM, 3 of 10 warm W7 runs: each chunk hand-off
                    # waited for a time slice, the first call 18 -> 28 ms); a yield lets the other thread run. Not
                    # from the first spin: yields in every short wait slowed a 1M-element tanh by 5-10%
NAPS = 200       # polls at 50 us (about 10 ms) before it sleeps in 2 ms steps: an idle process costs under 1% CPU
# control block: 0 sequence, 1 done, 2 packed kernel address, 3 argument array address, 4 the call's chunk queue,
# 5 unused, 6 quit, 7 asleep (set by a worker in its 2 ms sleeps; a caller clears it to call the worker back)
CTRL_WORDS = 8
# chunk queue (one per pool): 0 the next chunk to take (atomic), 1 the number of chunks, 2 the address of their
# (lo, hi) bounds
QUEUE_WORDS = 3


def _yield_turn(other: str) -> str:
    """IR of a spin loop's step `%n.next`: past YIELD_AFTER spins, every YIELD_EVERY-th goes to `%give` (which calls
    sched_yield), the others to `%<other>`."""
    return f"""  %turn = and i64 %n.next, {YIELD_EVERY - 1}
  %late = icmp ugt i64 %n.next, {YIELD_AFTER}
  %due = icmp eq i64 %turn, 0
  %yield = and i1 %late, %due
  br i1 %yield, label %give, label %{other}"""


SOURCE = f"""
declare i32 @usleep(i32)
declare i32 @sched_yield()
declare void @llvm.x86.sse2.pause()

define void @fnx_worker(ptr %ctrl) {{
entry:
  %done.p = getelementptr i64, ptr %ctrl, i64 1
  %fn.p = getelementptr i64, ptr %ctrl, i64 2
  %argv.p = getelementptr i64, ptr %ctrl, i64 3
  %queue.p = getelementptr i64, ptr %ctrl, i64 4
  %quit.p = getelementptr i64, ptr %ctrl, i64 6
  %asleep.p = getelementptr i64, ptr %ctrl, i64 7
  br label %wait
wait:
  %last = phi i64 [0, %entry], [%seq, %run], [%last, %poked]
  br label %spin
spin:
  %n = phi i64 [0, %wait], [%n.next, %pause], [%n.next, %give], [%n.next, %nap], [%n.next, %still]
  %seq = load atomic i64, ptr %ctrl acquire, align 8
  %new = icmp ne i64 %seq, %last
  br i1 %new, label %run, label %idle
idle:
  %quit = load atomic i64, ptr %quit.p acquire, align 8
  %stop = icmp ne i64 %quit, 0
  br i1 %stop, label %exit, label %more
more:
  %n.next = add i64 %n, 1
  %long = icmp ugt i64 %n.next, {SPINS}
  br i1 %long, label %tired, label %pause
pause:
  call void @llvm.x86.sse2.pause()
{_yield_turn("spin")}
give:
  %ignored3 = call i32 @sched_yield()
  br label %spin
tired:
  %drowsy = icmp ugt i64 %n.next, {SPINS + NAPS}
  br i1 %drowsy, label %sleep, label %nap
nap:
  %ignored = call i32 @usleep(i32 50)
  br label %spin
sleep:
  store atomic i64 1, ptr %asleep.p release, align 8
  %ignored2 = call i32 @usleep(i32 2000)
  %flag = load atomic i64, ptr %asleep.p acquire, align 8
  %poke = icmp eq i64 %flag, 0
  br i1 %poke, label %poked, label %still
still:
  br label %spin
poked:
  br label %wait
run:
  store atomic i64 0, ptr %asleep.p release, align 8
  %fn.i = load i64, ptr %fn.p, align 8
  %argv.i = load i64, ptr %argv.p, align 8
  %queue.i = load i64, ptr %queue.p, align 8
  %fn = inttoptr i64 %fn.i to ptr
  %argv = inttoptr i64 %argv.i to ptr
  %queue = inttoptr i64 %queue.i to ptr
  call void @fnx_claim(ptr %queue, ptr %fn, ptr %argv)
  store atomic i64 %seq, ptr %done.p release, align 8
  br label %wait
exit:
  ret void
}}

define void @fnx_claim(ptr %queue, ptr %fn, ptr %argv) {{
entry:
  %count.p = getelementptr i64, ptr %queue, i64 1
  %bounds.p = getelementptr i64, ptr %queue, i64 2
  %count = load i64, ptr %count.p, align 8
  %bounds.i = load i64, ptr %bounds.p, align 8
  %bounds = inttoptr i64 %bounds.i to ptr
  br label %take
take:
  %i = atomicrmw add ptr %queue, i64 1 seq_cst, align 8
  %more = icmp slt i64 %i, %count
  br i1 %more, label %go, label %out
go:
  %at = shl i64 %i, 1
  %lo.p = getelementptr i64, ptr %bounds, i64 %at
  %lo = load i64, ptr %lo.p, align 8
  %at.hi = add i64 %at, 1
  %hi.p = getelementptr i64, ptr %bounds, i64 %at.hi
  %hi = load i64, ptr %hi.p, align 8
  call void %fn(ptr %argv, i64 %lo, i64 %hi)
  br label %take
out:
  ret void
}}

define i64 @fnx_wait(ptr %ctrl, i64 %seq, i64 %spins) {{
entry:
  %done.p = getelementptr i64, ptr %ctrl, i64 1
  br label %spin
spin:
  %n = phi i64 [0, %entry], [%n.next, %next]
  %done = load atomic i64, ptr %done.p acquire, align 8
  %ok = icmp eq i64 %done, %seq
  br i1 %ok, label %yes, label %again
again:
  call void @llvm.x86.sse2.pause()
  %n.next = add i64 %n, 1
{_yield_turn("next")}
give:
  %ignored = call i32 @sched_yield()
  br label %next
next:
  %more = icmp ult i64 %n.next, %spins
  br i1 %more, label %spin, label %no
yes:
  ret i64 1
no:
  ret i64 0
}}
"""


@functools.lru_cache(maxsize=1024)
def _bounds(chunks: tuple) -> np.ndarray:
    """The (lo, hi) pairs of a launch's chunks as the int64 array the queue points at (made once a launch)."""
    return np.array(chunks, np.int64)


class NativePool:
    """`workers` native worker threads (the caller is the other one)."""

    def __init__(self, compiler, workers: int):
        code = _code.pop(compiler, None)  # (prepared when the device was made)
        self.engine, self.module = code.result() if code is not None else compiler.compile(SOURCE)
        worker = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(self.engine.get_function_address("fnx_worker"))
        self._wait = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64)(
            self.engine.get_function_address("fnx_wait"))
        self._claim = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)(
            self.engine.get_function_address("fnx_claim"))
        self.ctrls = [np.zeros(CTRL_WORDS, np.int64) for _ in range(workers)]
        self.queue = np.zeros(QUEUE_WORDS, np.int64)
        self.threads = [threading.Thread(target=worker, args=(c.ctypes.data,), daemon=True, name="fnx-native")
                        for c in self.ctrls]
        self.busy = threading.Lock()
        self._worker = worker  # the ctypes function must outlive the threads
        for t in self.threads: t.start()

    def run(self, packed: int, values: tuple, chunks: tuple) -> bool:
        """Run the chunks ((lo, hi) ranges of its thread-split loop) of the kernel whose packed entry is `packed`:
        the caller and the workers take them one at a time from a queue until none is left, so a core that runs
        slower (another tenant on it, a lower clock) takes fewer. False (nothing run) when another caller holds the
        pool or a worker is asleep."""
        workers = self.ctrls[:len(chunks) - 1]
        if not self.busy.acquire(blocking=False): return False
        if any(ctrl[7] for ctrl in workers):  # asleep: call it back, use the thread pool now
            for ctrl in self.ctrls: ctrl[7] = 0
            self.busy.release()
            return False
        try:
            argv = (ctypes.c_void_p * max(len(values), 1))(*values)
            queue = self.queue
            queue[1], queue[2], queue[0] = len(chunks), _bounds(chunks).ctypes.data, 0
            for ctrl in workers:
                ctrl[2], ctrl[3], ctrl[4] = packed, ctypes.addressof(argv), queue.ctypes.data
                ctrl[0] += 1  # published last: the worker reads the call only after it sees the new number
            self._claim(queue.ctypes.data, packed, ctypes.addressof(argv))
            for ctrl, thread in zip(workers, self.threads):
                while not self._wait(ctrl.ctypes.data, int(ctrl[0]), 1 << 22):
                    if not thread.is_alive(): raise RuntimeError("fnx: a native worker thread died")
            return True
        finally:
            self.busy.release()

    def close(self) -> None:
        for ctrl in self.ctrls: ctrl[6] = 1


_pools: dict[int, NativePool] = {}
_pools_lock = threading.Lock()
_code: dict = {}  # compiler -> the future of the workers' code (engine, module), compiled ahead by `prepare`
_X86 = platform.machine().lower() in ("x86_64", "amd64")  # the workers' spin loop uses x86's `pause`


def pool(compiler, workers: int) -> NativePool | None:
    """The process's native pool with `workers` workers (None when there is nothing to run on other cores)."""
    if workers < 1 or not _X86: return None
    if (found := _pools.get(workers)) is not None: return found
    with _pools_lock:  # one pool per size: a second one made by a racing thread would free code its workers run
        if workers not in _pools: _pools[workers] = NativePool(compiler, workers)
    return _pools[workers]


def prepare(compiler, workers: int) -> None:
    """Compile the workers' code on the LLVM thread now (a device with `workers` native workers is being made):
    the LLVM thread is idle while the first function is traced, and linking the code (~1.5 ms, an engine of its
    own) then no longer competes with the program's own modules. No thread starts until `start` or `pool`."""
    if workers >= 1 and _X86 and not _pools and compiler not in _code:
        _code[compiler] = compiler.submit(SOURCE, report=False)


def start(compiler, workers: int) -> None:
    """Make the pool on a thread of its own if there is none yet: a program with thread-split kernels, being
    compiled, will want it, and linking its code and starting its workers (~2 ms) then overlaps the rest of the
    compile instead of delaying the first run."""
    if workers >= 1 and _X86 and workers not in _pools:
        threading.Thread(target=pool, args=(compiler, workers), daemon=True, name="fnx-native-start").start()


@atexit.register
def _stop_workers() -> None:
    """Let the workers leave their loop before interpreter teardown frees the code they run."""
    for p in _pools.values(): p.close()
    for p in _pools.values():
        for t in p.threads: t.join(timeout=0.1)


def _forget_after_fork() -> None:  # a forked child has none of the parent's threads: start again when needed
    global _pools_lock
    _pools.clear()
    _code.clear()  # (a future of the parent's LLVM thread)
    _pools_lock = threading.Lock()


if hasattr(os, "register_at_fork"): os.register_at_fork(after_in_child=_forget_after_fork)
