"""Tensor cores: which kernels a grid device may compute with warp-level matrix instructions, and how they tile.

A kernel qualifies when it is one float32 sum over its reduce loops k (several act as one, flattened: a
convolution's channels and window) of a product of two 16-bit floats (float16
or bfloat16, the same for both) widened to float32 — `sum_k f32(A) * f32(B)`, what a float16 or bfloat16 matmul
lowers to — where A varies along output loops m that B does not, and B along loops n that A does not (several
such loops act as one, flattened: vmap's batch of the left operand is more rows). Any other output loops are the
batch. A and B may be any expressions (a load, an elementwise producer,
a gathered or transposed read): each element of them is computed once per block tile, never per multiply-add.
Whatever the kernel does after the sum (casts, an activation, several stores) is its epilogue.

The product of two 16-bit floats is exact in float32, so the tensor core's `mma` (exact products, float32
accumulation) computes what the scalar kernel does, up to the order of the float32 additions.

The tile (the renderer's, fnx/backends/c_render.py `TensorCoreRenderer`): a block of WARPS warps computes a
BLOCK_M x BLOCK_N tile of the output, each warp 32 x 32 of it as 2 x 4 `mma.m16n8k16` tiles with float32
accumulators in registers. The k loop advances BLOCK_K at a time: the block's threads compute that slab of A and
B into shared memory (zero beyond the matrix), then each warp multiplies from it. One block per output tile of
each batch element: the launch is `blocks(tile)` blocks of THREADS threads.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from fnx import dtypes
from fnx.dtypes import DType
from fnx.lower.linearize import range_deps
from fnx.lower.rangeify import Kernel
from fnx.uop import Ops, UOp

BLOCK_M = BLOCK_N = 64
BLOCK_K = 32
WARPS = 4                  # 2 x 2 warps, each 32 x 32 of the block's tile
THREADS = 32 * WARPS
MAX_K = 1 << 16            # longer sums stay scalar: each accumulator adds K / 16 partial sums in a row
TYPES = (dtypes.float16, dtypes.bfloat16)


class NotTensorCore(ValueError):
    """Why a kernel cannot use tensor cores."""


@dataclass(frozen=True)
class TensorCoreTile:
    reduce: UOp                 # the float32 REDUCE ADD of f32(a) * f32(b)
    a: UOp                      # the 16-bit value of A: varies along batch, m and k
    b: UOp                      # ... of B: batch, k and n
    m: tuple                    # the output RANGEs only A varies along, outermost first (flattened: the rows)
    n: tuple                    # the output RANGEs only B varies along (the columns)
    k: tuple                    # the reduce RANGEs, outermost first (flattened: the depth)
    batch: tuple                # the other output RANGEs, outermost first
    dtype: DType                # float16 or bfloat16

    @property
    def rows(self) -> int:
        return math.prod(r.arg.size for r in self.m)

    @property
    def columns(self) -> int:
        return math.prod(r.arg.size for r in self.n)

    @property
    def depth(self) -> int:
        return math.prod(r.arg.size for r in self.k)

    @property
    def blocks(self) -> int:
        """Thread blocks of one launch: the batch times the output tiles."""
        tiles = -(-self.rows // BLOCK_M) * -(-self.columns // BLOCK_N)
        return math.prod(r.arg.size for r in self.batch) * tiles


def _half_operand(x: UOp) -> UOp | None:
    """`x`'s 16-bit source when x widens one to float32."""
    if x.op is Ops.CAST and x.dtype == dtypes.float32 and x.src[0].dtype in TYPES: return x.src[0]
    return None


def tensor_core_tile(k: Kernel) -> TensorCoreTile:
    """The tensor-core view of kernel `k`, or NotTensorCore saying why it has none."""
    if k.lanes or k.locals or k.init or k.prelude or k.row_ranges is not None or k.thread_range >= 0:
        raise NotTensorCore("only a kernel with no other schedule action")
    if not k.parallel: raise NotTensorCore("its iterations are not independent")
    reduces = [u for u in k.sink.toposort if u.op is Ops.REDUCE]
    if len(reduces) != 1: raise NotTensorCore("not one reduction")
    red, ks = reduces[0], tuple(k.reduce_ranges)
    if red.arg.op is not Ops.ADD or red.dtype != dtypes.float32 or set(red.src[1:]) != set(ks) or not ks:
        raise NotTensorCore("not a float32 sum over the kernel's reduce loops")
    if (depth := math.prod(r.arg.size for r in ks)) > MAX_K:
        raise NotTensorCore(f"a sum of {depth} terms (at most {MAX_K})")
    prod = red.src[0]
    halves = [_half_operand(s) for s in prod.src] if prod.op is Ops.MUL else [None]
    if None in halves or halves[0].dtype != halves[1].dtype:
        raise NotTensorCore("the sum is not of products of two float16 or two bfloat16 values")
    deps = range_deps(k.sink)
    if any(set(ks) & deps[st] for st in k.sink.src): raise NotTensorCore("a store runs inside the reduce loop")
    a, b = halves
    only_a = [r for r in k.ranges if r in deps[a] and r not in deps[b]]
    only_b = [r for r in k.ranges if r in deps[b] and r not in deps[a]]
    if not only_a or not only_b or not set(ks) & (deps[a] | deps[b]):
        raise NotTensorCore("not a product of an (m, k) by a (k, n) operand")
    batch = tuple(r for r in k.ranges if r not in only_a and r not in only_b)
    return TensorCoreTile(red, a, b, tuple(only_a), tuple(only_b), ks, batch, a.dtype)


def launch_dims(k: Kernel) -> tuple[int, int, int]:
    """(lo, hi, threads) of a tensor-core kernel's launch: one block per output tile."""
    return (0, tensor_core_tile(k).blocks, THREADS)


def is_tensor_core(k: Kernel) -> bool:
    return any(o.op == "TC" for o in k.opts)


__all__ = ["BLOCK_K", "BLOCK_M", "BLOCK_N", "MAX_K", "THREADS", "TYPES", "WARPS", "NotTensorCore",
           "TensorCoreTile", "is_tensor_core", "launch_dims", "tensor_core_tile"]
