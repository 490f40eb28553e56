"""The native driver of a row chain (fnx/lower/chain.py): one LLVM function that runs a chunk of the rows
block by block, calling every kernel of the chain on each block.

`@<chain>(ptr fns, ptr buf..., i64 start, i64 end)`: `fns` is the table of the member kernels' addresses (they
are compiled in the executable's own modules; a call through a pointer costs what a direct one does and keeps each
kernel's `noalias` arguments true per call); the buffers are the chain's `args`, the last of them every thread's
scratch. The chunk's region is the scratch's (start / step)-th (the threads take chunks from a queue, and no two
run one chunk); a scratch buffer's address for the block that
starts at row `lo` is its place in the region minus lo rows, so the kernel's own `row * S + rest` indexing lands
in the region. `@<chain>_packed(ptr argv, i64 start, i64 end)` is the same with its arguments in an array, for
the native worker pool.
"""
from __future__ import annotations

from fnx.lower.chain import RowChain

PREFETCH_LOCALITY = 2  # LLVM's prefetch locality (3: L1, 2: L2, ...)


def render_driver(chain: RowChain) -> tuple[str, set[str]]:
    """The driver's LLVM functions, and the declarations they need (as `llvm_render.render_function`)."""
    n = len(chain.args)
    region_arg = f"%b{n - 1}"
    head = ", ".join(["ptr %fns"] + [f"ptr %b{i}" for i in range(n)] + ["i64 %start", "i64 %end"])
    lines = [f"define void @{chain.name}({head}) {{", "entry:",
             f"  %tid = udiv i64 %start, {chain.step}", f"  %toff = mul i64 %tid, {chain.thread_bytes}",
             f"  %region = getelementptr i8, ptr {region_arg}, i64 %toff"]
    for j in range(len(chain.members)):
        lines += [f"  %fp{j} = getelementptr ptr, ptr %fns, i64 {j}", f"  %f{j} = load ptr, ptr %fp{j}, align 8"]
    lines += ["  br label %check", "check:", "  %lo = phi i64 [%start, %entry], [%hi, %body]",
              "  %more = icmp slt i64 %lo, %end", "  br i1 %more, label %body, label %done", "body:",
              f"  %next = add i64 %lo, {chain.block}", "  %short = icmp slt i64 %next, %end",
              "  %hi = select i1 %short, i64 %next, i64 %end"]
    address = {b: f"%b{i}" for i, b in enumerate(chain.args)}
    for b, (offset, row_bytes) in chain.scratch.items():
        lines += [f"  %s{b}.rows = mul i64 %lo, {row_bytes}", f"  %s{b}.off = sub i64 {offset}, %s{b}.rows",
                  f"  %s{b} = getelementptr i8, ptr %region, i64 %s{b}.off"]  # (no inbounds: it points before)
        address[b] = f"%s{b}"
    head, prefetches = _prefetches(chain, address)
    lines += head
    per = -(-len(prefetches) // len(chain.members))
    for j, kernel in enumerate(chain.members):
        lines += [line for p in prefetches[j * per:(j + 1) * per] for line in p]
        args = ", ".join(f"ptr {address[b]}" for b in kernel.args)
        lines.append(f"  call void %f{j}({args}, i64 %lo, i64 %hi)")
    lines += ["  br label %check", "done:", "  ret void", "}", "", packed_driver(chain)]
    return "\n".join(lines), {"declare void @llvm.prefetch.p0(ptr, i32, i32, i32)"} if prefetches else set()


def _prefetches(chain: RowChain, address: dict) -> tuple[list[str], list[list[str]]]:
    """The next block's address in each of the chain's inputs from memory (`RowChain.prefetch`), and the prefetch
    to L2 of each of its cache lines, which the driver spreads over the members' calls. A prefetch never faults:
    the last block's, past the chunk or the buffer, is harmless."""
    head, out = [], []
    for b, row_bytes in chain.prefetch:
        base = f"%pf{b}"
        head += [f"  {base}.off = mul i64 %hi, {row_bytes}",
                 f"  {base} = getelementptr i8, ptr {address[b]}, i64 {base}.off"]
        for line in range(-(-chain.block * row_bytes // 64)):
            out.append([f"  {base}.{line} = getelementptr i8, ptr {base}, i64 {line * 64}",
                        f"  call void @llvm.prefetch.p0(ptr {base}.{line}, i32 0, i32 {PREFETCH_LOCALITY}, i32 1)"])
    return head, out


def packed_driver(chain: RowChain) -> str:
    n = len(chain.args) + 1  # the kernel table, then the buffers
    body = [f"define void @{chain.name}_packed(ptr %argv, i64 %start, i64 %end) {{"]
    for i in range(n):
        body += [f"  %p{i} = getelementptr ptr, ptr %argv, i64 {i}", f"  %a{i} = load ptr, ptr %p{i}, align 8"]
    args = ", ".join(f"ptr %a{i}" for i in range(n))
    return "\n".join(body + [f"  call void @{chain.name}({args}, i64 %start, i64 %end)", "  ret void", "}"])


__all__ = ["render_driver"]
