"""Run by tests/sharding/test_distributed.py under `mpirun -n P`: process 1 stops taking part (`sleep`: it hangs
after a first psum across processes; `exit`: it returns before any; `raise`: an exception no one catches), and the
others run a psum across processes. They must raise DistributedError within FNX_DISTRIBUTED_TIMEOUT (or be stopped
by the job's abort), and mpirun must exit nonzero instead of hanging.

    mpirun -n 2 env FNX_CPU_DEVICES=2 FNX_DISTRIBUTED_TIMEOUT=3 python tests/sharding/mpi_stalled.py sleep
"""
import sys
import time

import numpy as np

import fnx
from fnx.sharding import NamedSharding, P

fnx.distributed.initialize()
mesh = fnx.make_mesh((len(fnx.devices()),), ("i",))
x = fnx.device_put(np.arange(4.0 * len(fnx.devices()), dtype=np.float32), NamedSharding(mesh, P("i")))
total = fnx.jit(lambda a: a.sum())
mode = sys.argv[1]
if mode == "sleep": total(x)  # the processes have met: the next psum waits in an MPI collective, not a greeting
if fnx.process_index() == 1:
    if mode == "sleep": time.sleep(120)
    if mode == "raise": raise KeyError("process 1 failed on purpose")
    sys.exit(0)
print(f"process {fnx.process_index()} starts its psum at {time.time():.3f}", flush=True)
total(x * 2)
print(f"process {fnx.process_index()} was not stopped", flush=True)
