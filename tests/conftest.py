"""Test configuration: the `device` fixture runs a test once per backend that works on this machine."""
import atexit
import gc
import glob
import os
import shutil
import sys
import tempfile


def _remove_caches_of_killed_runs() -> None:
    """A run killed by a signal never reaches atexit: remove the test caches whose process (named in the directory's
    name) no longer exists."""
    if os.name != "posix": return  # (os.kill(pid, 0) only asks whether pid exists on POSIX)
    for path in glob.glob(os.path.join(tempfile.gettempdir(), "fnx-test-cache-*-*")):
        pid = os.path.basename(path).split("-")[3]
        if not pid.isdigit(): continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(path, ignore_errors=True)
        except PermissionError:
            pass  # alive, another user's


# fnx's compile cache (FNX_CACHE_DIR, read once when fnx is imported) goes to a temporary directory removed at exit,
# so that the tests never write the user's ~/.cache/fnx; a FNX_CACHE_DIR the user set is kept. xdist's workers and
# the tests' subprocesses inherit the variables, so they share this directory (FNX_TEST_CACHE_DIR says who made it)
if "FNX_CACHE_DIR" not in os.environ:
    _remove_caches_of_killed_runs()
    os.environ["FNX_CACHE_DIR"] = os.environ["FNX_TEST_CACHE_DIR"] = tempfile.mkdtemp(
        prefix=f"fnx-test-cache-{os.getpid()}-")
    atexit.register(shutil.rmtree, os.environ["FNX_CACHE_DIR"], ignore_errors=True)

# JAX, an oracle here, with eight host devices like the sharding tests' FNX_CPU_DEVICES=8 (set before it is imported)
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

from fnx.trace import state  # noqa: E402

settings.register_profile("fnx", max_examples=int(os.environ.get("FNX_TEST_EXAMPLES", "12")), deadline=None,
                          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
settings.load_profile("fnx")

from backends_under_test import DEVICES  # noqa: E402


@pytest.fixture(params=DEVICES)
def device(request):
    """Run the test with `request.param` as the default device."""
    previous = state.default_device
    state.default_device = f"{request.param}:0"
    yield request.param
    state.default_device = previous


OPENCL_EXAMPLES = 2  # on opencl, a property test draws 1/OPENCL_EXAMPLES of its examples


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    """A property test (hypothesis) on the opencl backend draws half as many examples as on interp and cpu. On
    PoCL, CI's OpenCL device, each new program costs a build of 0.2 s (PoCL parses its whole builtin header each
    time), and most examples compile a program or two of their own: the property tests' opencl runs took 300 of
    the suite's 3,400 test-seconds. What an example checks on opencl that cpu does not is the OpenCL C renderer and
    runtime; each run of the suite draws new examples (hypothesis is not derandomized)."""
    test = getattr(item, "obj", None)
    params = getattr(getattr(item, "callspec", None), "params", {})
    drawn = getattr(test, "_hypothesis_internal_use_settings", None)
    if drawn is None or "opencl" not in (params.get("device"), params.get("backend")):
        yield
        return
    test._hypothesis_internal_use_settings = settings(drawn, max_examples=-(-drawn.max_examples // OPENCL_EXAMPLES))
    try:
        yield
    finally:
        test._hypothesis_internal_use_settings = drawn


@pytest.fixture(scope="module")
def jax_x64():
    """JAX in float64 for one module (the others use JAX's default float32): `pytestmark =
    pytest.mark.usefixtures("jax_x64")`."""
    jax = pytest.importorskip("jax")
    previous = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    yield
    jax.config.update("jax_enable_x64", previous)


_WIDE_NAMES = ("float64", "int64", "uint64")


def _wide(value) -> bool:
    """Whether a test parameter is a 64-bit dtype (numpy's type or dtype, fnx's DType, or its name)."""
    if isinstance(value, str): return value in _WIDE_NAMES
    if isinstance(value, np.dtype) or (isinstance(value, type) and issubclass(value, np.generic)):
        return np.dtype(value).name in _WIDE_NAMES
    return type(value).__name__ == "DType" and getattr(value, "name", None) in _WIDE_NAMES


@pytest.fixture(autouse=True, scope="module")
def _forget_compiled_programs_after_each_module():
    """Each test module starts with empty trace and executable caches (the on-disk object cache stays): an xdist
    worker runs a hundred modules, and 512 cached executables of a megabyte or two each, kept from module to module
    beside JAX's own caches, added gigabytes to each worker on a 2-core, 24 GiB CI machine."""
    yield
    import fnx
    fnx.clear_caches()
    if "jax" in sys.modules: sys.modules["jax"].clear_caches()
    gc.collect()


@pytest.fixture(autouse=True)
def _x64_for_64_bit_parameters(request):
    """A test parametrized with a 64-bit dtype tests that dtype, so it runs with 64-bit types on (as a JAX user
    testing float64 sets jax_enable_x64); every other test runs in the default mode, x64 off."""
    params = getattr(getattr(request.node, "callspec", None), "params", {})
    if any(_wide(v) for v in params.values()): request.getfixturevalue("x64")


@pytest.fixture
def x64():
    """fnx (and JAX, where installed) with 64-bit types on, for tests that compute in float64/int64: as a test
    argument, or for a whole module `pytestmark = pytest.mark.usefixtures("x64")`."""
    import fnx
    try:
        import jax
    except ImportError:
        jax = None
    before = (fnx.config.read("jax_enable_x64"), jax.config.jax_enable_x64 if jax is not None else None)
    fnx.config.update("jax_enable_x64", True)
    if jax is not None: jax.config.update("jax_enable_x64", True)
    yield
    fnx.config.update("jax_enable_x64", before[0])
    if jax is not None: jax.config.update("jax_enable_x64", before[1])
