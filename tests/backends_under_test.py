"""The backends the `device` fixture runs each test on (FNX_TEST_DEVICES, else interp, cpu and opencl where an
OpenCL device exists): a module of its own, so that a test module can build its parametrizations from the list
(`from conftest import ...` would find whichever conftest.py was imported last: tests/sharding has one too)."""
import os


def _default_devices() -> str:
    """interp (the oracle) and cpu, and opencl where an OpenCL device exists (PoCL gives one on any CPU); CI sets
    FNX_REQUIRE_OPENCL=1, so there a missing one fails the run instead of leaving opencl untested."""
    from fnx.backends.opencl import _cl_devices
    if _cl_devices(): return "interp,cpu,opencl"
    if os.environ.get("FNX_REQUIRE_OPENCL") == "1":
        raise RuntimeError("FNX_REQUIRE_OPENCL=1 but no OpenCL device was found (apt-get install pocl-opencl-icd; "
                           "pip install 'fnx[opencl]')")
    return "interp,cpu"


DEVICES = [d for d in os.environ.get("FNX_TEST_DEVICES", _default_devices()).split(",") if d]
