"""Eight cpu devices for the sharding tests (as FNX_CPU_DEVICES=8 gives), and the meshes the tests use."""
import pytest

import fnx
from fnx.backends.device import get_device
from fnx.config import config


@pytest.fixture
def cpus(monkeypatch):
    get_device("cpu:0")  # made with the process's own thread count first: later tests in this worker use it whole
    monkeypatch.setattr(config, "cpu_devices", 8)
    return fnx.devices("cpu")


@pytest.fixture
def mesh24(cpus):
    return fnx.make_mesh((2, 4), ("data", "model"))


@pytest.fixture
def mesh4(cpus):
    return fnx.make_mesh((4,), ("i",))
