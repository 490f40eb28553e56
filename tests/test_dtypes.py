import ml_dtypes
import numpy as np
import pytest

import fnx
import fnx.dtypes as fd
import fnx.numpy as fnp
from fnx.dtypes import (DTYPES, bfloat16, bool_, float16, float32, float64, int8, int16, int32, int64, uint8,
                        uint16, uint32, uint64)

# JAX "Type promotion semantics" binary promotion table (docs.jax.dev/en/latest/type_promotion.html),
# with the complex rows/columns (c8, c16, c*) dropped. Rows and columns are in the order of COLS. As in JAX with
# x64 off, uint32 with a signed int of at most 32 bits is int32 (the x64 table says int64).
COLS = "b1 u1 u2 u4 u8 i1 i2 i4 i8 bf f2 f4 f8 i* f*".split()
TABLE = """
b1  b1 u1 u2 u4 u8 i1 i2 i4 i8 bf f2 f4 f8 i* f*
u1  u1 u1 u2 u4 u8 i2 i2 i4 i8 bf f2 f4 f8 u1 f*
u2  u2 u2 u2 u4 u8 i4 i4 i4 i8 bf f2 f4 f8 u2 f*
u4  u4 u4 u4 u4 u8 i4 i4 i4 i8 bf f2 f4 f8 u4 f*
u8  u8 u8 u8 u8 u8 f* f* f* f* bf f2 f4 f8 u8 f*
i1  i1 i2 i4 i4 f* i1 i2 i4 i8 bf f2 f4 f8 i1 f*
i2  i2 i2 i4 i4 f* i2 i2 i4 i8 bf f2 f4 f8 i2 f*
i4  i4 i4 i4 i4 f* i4 i4 i4 i8 bf f2 f4 f8 i4 f*
i8  i8 i8 i8 i8 f* i8 i8 i8 i8 bf f2 f4 f8 i8 f*
bf  bf bf bf bf bf bf bf bf bf bf f4 f4 f8 bf bf
f2  f2 f2 f2 f2 f2 f2 f2 f2 f2 f4 f2 f4 f8 f2 f2
f4  f4 f4 f4 f4 f4 f4 f4 f4 f4 f4 f4 f4 f8 f4 f4
f8  f8 f8 f8 f8 f8 f8 f8 f8 f8 f8 f8 f8 f8 f8 f8
i*  i* u1 u2 u4 u8 i1 i2 i4 i8 bf f2 f4 f8 i* f*
f*  f* f* f* f* f* f* f* f* f* bf f2 f4 f8 f* f*
"""
ROWS = {line.split()[0]: dict(zip(COLS, line.split()[1:])) for line in TABLE.strip().splitlines()}
CONCRETE = {"b1": bool_, "u1": uint8, "u2": uint16, "u4": uint32, "u8": uint64, "i1": int8, "i2": int16,
            "i4": int32, "i8": int64, "bf": bfloat16, "f2": float16, "f4": float32, "f8": float64}
OPERAND = {**{c: (d, False) for c, d in CONCRETE.items()}, "i*": 7, "f*": 0.5}  # Python scalars are weak
PAIRS = [(a, b) for a in COLS for b in COLS]


def test_table_is_complete_and_symmetric():
    assert list(ROWS) == COLS
    for a, b in PAIRS:
        assert ROWS[a][b] == ROWS[b][a], (a, b)


@pytest.mark.parametrize("a,b", PAIRS)
def test_result_type_matches_table(a, b):
    expected = ROWS[a][b]
    if expected in CONCRETE:
        want = (CONCRETE[expected], False)
    elif expected == "i*":
        want = (int32, True)
    else:  # f*: fnx's default float, float64 with a 64-bit integer operand (JAX's x64 answer)
        want = (float64 if {a, b} & {"u8", "i8"} else float32, True)
    assert fd.result_type(OPERAND[a], OPERAND[b]) == want
    assert fd.result_type(OPERAND[b], OPERAND[a]) == want


@pytest.mark.parametrize("a,b", [(a, b) for a, b in PAIRS if a in CONCRETE and b in CONCRETE])
def test_promote_types_matches_table(a, b):
    expected = ROWS[a][b]
    want = float64 if expected == "f*" else CONCRETE[expected]
    assert fd.promote_types(CONCRETE[a], CONCRETE[b]) == want
    assert fd.promote_types(CONCRETE[a].np, CONCRETE[b].name) == want


def test_promote_types_examples():
    assert fd.promote_types(uint64, int64) == float64
    assert fd.promote_types(bfloat16, float16) == float32
    assert fd.promote_types(int8, uint8) == int16
    assert fd.promote_types(bool_, int8) == int8


def test_promotion_is_associative():
    ops = list(OPERAND.values())
    for a in ops:
        for b in ops:
            for c in ops:
                # the lattice join is associative; only the width of a weak result may differ
                (d1, w1), (d2, w2) = fd.result_type(fd.result_type(a, b), c), fd.result_type(a, b, c)
                assert w1 == w2 and d1.kind == d2.kind and (w1 or d1 == d2)


def test_result_type_weak_rules():
    assert fd.result_type(1) == (int32, True)
    assert fd.result_type(1.0) == (float32, True)
    assert fd.result_type(True) == (bool_, False)
    assert fd.result_type(True, 1) == (int32, True)
    assert fd.result_type((int16, True), (int8, True)) == (int32, True)  # all-weak stays weak at default width
    assert fd.result_type((bool_, True)) == (bool_, False)  # a weak bool is just a bool
    assert fd.result_type((float64, True), 1.0) == (float64, True)  # weak 64-bit values are not narrowed
    assert fd.result_type((uint64, False), (int8, False), 1) == (float64, True)
    assert fd.result_type(np.float64(1.0), 1) == (float32, False)  # x64 off: a numpy float64 is float32
    assert fd.result_type(np.float16(1.0), 1.0) == (float16, False)
    assert fd.result_type((uint32, False), (int32, False)) == (int32, False)  # JAX's int64, canonicalized
    with fnx.enable_x64():
        assert fd.result_type(np.float64(1.0), 1) == (float64, False)
        assert fd.result_type(1.0) == (float64, True) and fd.result_type(1) == (int64, True)
        assert fd.result_type((uint32, False), (int32, False)) == (int64, False)
        assert fd.result_type((float32, False), 1.0) == (float32, False)
    assert fd.result_type(int32, float) == (float32, True)
    assert fd.result_type("uint8", int) == (uint8, False)
    with pytest.raises(ValueError):
        fd.result_type()


def test_complex_types_are_dtypes():
    assert fd.to_dtype(complex) is fd.complex64 and fd.to_dtype(np.complex64) is fd.complex64
    assert fd.to_dtype("complex128") is fd.complex128 and fd.to_dtype(np.dtype("c8")) is fd.complex64
    with fnx.enable_x64():
        assert fd.to_dtype(complex) is fd.complex128
    assert fd.canonicalize(fd.complex128) is fd.complex64 and fd.complex64.component is float32


def test_canonicalize_scalar():
    assert fd.canonicalize_scalar(True) == (bool_, False)
    assert fd.canonicalize_scalar(3) == (int32, True)
    with pytest.raises(OverflowError, match="int32"):  # x64 off, as in JAX
        fd.canonicalize_scalar(2**40)
    assert fd.canonicalize_scalar(2.5) == (float32, True)
    assert fd.canonicalize_scalar(np.float64(1.0)) == (float32, False)
    with fnx.enable_x64():
        assert fd.canonicalize_scalar(2**40) == (int64, True) and fd.canonicalize_scalar(2.5) == (float64, True)
        assert fd.canonicalize_scalar(np.float64(1.0)) == (float64, False)
    assert fd.canonicalize_scalar(np.int8(1)) == (int8, False)
    assert fd.canonicalize_scalar(ml_dtypes.bfloat16(1)) == (bfloat16, False)
    with pytest.raises(OverflowError):
        fd.canonicalize_scalar(2**70)
    assert fd.canonicalize_scalar(1j) == (fd.complex64, True)  # weak, as JAX's Python complex
    with pytest.raises(TypeError):
        fd.canonicalize_scalar("1")


@pytest.mark.parametrize("d", DTYPES, ids=str)
def test_to_dtype_round_trips(d):
    assert fd.to_dtype(d) is d
    assert fd.to_dtype(d.name) is d
    assert fd.to_dtype(str(d)) is d
    assert fd.to_dtype(d.np) is d
    assert fd.to_dtype(d.np.type) is d
    assert fd.from_numpy(d.np) is d
    assert fd.to_dtype(np.zeros(2, d.np)) is d
    assert d.np.itemsize == d.itemsize
    assert repr(d) == str(d) == d.name
    assert {d: 1}[fd.DType(d.name, d.itemsize, d.kind)] == 1


def test_to_dtype_spellings():
    assert fd.to_dtype(bool) is bool_ and fd.to_dtype("bool_") is bool_
    assert fd.to_dtype(int) is int32 and fd.to_dtype(float) is float32
    assert fd.to_dtype(ml_dtypes.bfloat16) is bfloat16
    assert fd.to_dtype("f4") is float32 and fd.to_dtype("<i8") is int64 and fd.to_dtype("u1") is uint8
    assert fd.to_dtype(np.dtype(">f8")) is float64
    assert fd.from_numpy(np.float64) is float64 and fd.from_numpy("int64") is int64


@pytest.mark.parametrize("bad", [None, "nope", object, np.dtype("c32") if hasattr(np, "complex256") else "c32",
                                 np.dtype("U3"), 3, ml_dtypes.float8_e4m3fn, [float32]])
def test_to_dtype_rejects(bad):
    with pytest.raises(TypeError):
        fd.to_dtype(bad)


def test_properties_and_limits():
    assert [d for d in DTYPES if d.is_float] == [float16, bfloat16, float32, float64]
    assert [d for d in DTYPES if d.is_int] == [int8, int16, int32, int64, uint8, uint16, uint32, uint64]
    assert [d for d in DTYPES if d.is_unsigned] == [uint8, uint16, uint32, uint64]
    assert [d for d in DTYPES if d.is_bool] == [bool_]
    assert (int8.min, int8.max, uint64.max) == (-128, 127, 2**64 - 1)
    assert (float16.min, float16.max) == (float("-inf"), float("inf"))
    assert (bool_.min, bool_.max) == (False, True)
    assert fd.finfo(bfloat16).eps == 2.0**-7 and fd.finfo("float32").eps == np.finfo(np.float32).eps
    assert fd.iinfo(uint16).max == 65535
    with pytest.raises(TypeError):
        fd.finfo(int32)
    with pytest.raises(TypeError):
        fd.iinfo(float32)
    with pytest.raises(AttributeError):
        float32.name = "x"  # frozen


def test_matches_jax_promote_types():
    jax = pytest.importorskip("jax")
    jnp = pytest.importorskip("jax.numpy")
    previous = jax.config.jax_enable_x64
    try:
        for a in DTYPES:
            for b in DTYPES:
                # fnx promotes like JAX with x64 on when an operand is 64-bit, like JAX with x64 off otherwise
                jax.config.update("jax_enable_x64", a.itemsize == 8 or b.itemsize == 8)
                assert fd.from_numpy(jnp.promote_types(a.np, b.np)) == fd.promote_types(a, b), (a, b)
    finally:
        jax.config.update("jax_enable_x64", previous)


@pytest.mark.parametrize("x64", [False, True])
def test_promote_fast_path_agrees_with_the_lattice(x64):
    """trace.promote answers operands of one dtype, some strong, without the lattice: for every dtype (complex and
    64-bit ones too), one to three operands and every weak/strong mix, its dtype and weak flag are result_type's."""
    import itertools
    from fnx.trace import Array, promote
    from fnx.uop import UOp
    with fnx.enable_x64(x64):
        for d in fd.ALL_DTYPES:
            for n in (1, 2, 3):
                for weaks in itertools.product([False, True], repeat=n):
                    arrays = [Array(UOp.const(d, 0), w) for w in weaks]
                    got = promote(arrays)
                    want = fd.result_type(*[(d, w) for w in weaks])
                    assert ([a.uop.dtype for a in got[0]], got[1]) == ([want[0]] * n, want[1]), (d, weaks)


def test_scalar_types_convert_arrays_as_jax_under_every_transform():
    # jnp.int32(x) of a traced value was numpy's int32(x): a TracerArrayConversionError under jit, vmap and grad
    import jax
    import jax.numpy as J
    x = np.array([1.5, -2.7, 3.2], np.float32)

    def f(m):
        return lambda v: m.float32(m.int32(v * 2)) * v + m.float16(v).astype(m.float32) + m.bool_(v > 0)
    want = np.asarray(f(J)(x))
    for g in (f(fnp), fnx.jit(f(fnp))):
        got = g(x)
        assert isinstance(got, fnx.Array)
        np.testing.assert_array_equal(np.asarray(got), want)
    np.testing.assert_array_equal(np.asarray(fnx.vmap(f(fnp))(np.stack([x, -x]))), np.asarray(jax.vmap(f(J))(
        np.stack([x, -x]))))
    np.testing.assert_allclose(np.asarray(fnx.grad(lambda v: f(fnp)(v).sum())(x)),
                               np.asarray(jax.grad(lambda v: f(J)(v).sum())(x)))
    looped = fnx.jit(lambda v: fnx.lax.fori_loop(0, fnp.int32(v[0] * 2), lambda i, c: c + 1.0, v))(x)
    np.testing.assert_array_equal(np.asarray(looped), x + 3)
    # still numpy's types where a dtype is meant, and numpy's scalars of Python values
    for name in ("bool_", "int8", "uint32", "int64", "float16", "float32", "float64", "complex64"):
        t = getattr(fnp, name)
        assert np.dtype(t) == np.dtype(getattr(J, name)) and fnp.zeros(2, t).dtype == J.zeros(2, getattr(J, name)).dtype
        assert isinstance(np.dtype(t).type(1), t) and type(t(1)) is np.dtype(t).type and t == np.dtype(t).type
        assert {np.dtype(t).type: name}[t] == name
    assert fnp.asarray([1, 2]).dtype == fnp.int32 and fnp.float32(2.5) * 2 == 5.0
