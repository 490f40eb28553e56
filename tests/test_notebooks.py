"""The user's world: the notebooks in notebooks/ run from top to bottom and check their own results, their stored
files carry no outputs and are what notebooks/make_notebooks.py writes, and the test suite leaves the user's
compile cache (~/.cache/fnx) alone."""
from __future__ import annotations

import importlib.util
import os
import shutil
import time

import pytest

from fnx.config import config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOKS = os.path.join(ROOT, "notebooks")
NAMES = ["01_quickstart.ipynb", "02_training.ipynb", "03_sharding.ipynb", "04_inside_the_compiler.ipynb"]
PASSED = "all checks passed"   # what each notebook's last cell prints once its asserts held
CELL_TIMEOUT = 300             # seconds per cell


def _generator():
    spec = importlib.util.spec_from_file_location("make_notebooks", os.path.join(NOTEBOOKS, "make_notebooks.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_notebook_is_tested():
    assert sorted(n for n in os.listdir(NOTEBOOKS) if n.endswith(".ipynb")) == NAMES


@pytest.mark.parametrize("name", NAMES)
def test_stored_notebook_is_what_the_generator_writes(name):
    """No outputs in the repository, and no hand edits the generator would lose."""
    pytest.importorskip("nbformat")
    with open(os.path.join(NOTEBOOKS, name), encoding="utf-8") as f:
        stored = f.read()
    assert stored == _generator().text(name), f"{name}: run `python notebooks/make_notebooks.py` to rewrite it"


def _outputs_text(cell) -> str:
    parts = []
    for out in cell.get("outputs", []):
        if out["output_type"] == "stream": parts.append(out["text"])
        elif "data" in out: parts.append(out["data"].get("text/plain", ""))
    return "".join(parts)


def _run(name: str, tmp_path):
    """Execute notebook `name` in a fresh kernel (this interpreter), in a copy under tmp_path, with its own
    compile cache; returns the executed notebook."""
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    workdir = tmp_path / "notebooks"
    workdir.mkdir()
    shutil.copy(os.path.join(NOTEBOOKS, name), workdir / name)
    nb = nbformat.read(workdir / name, as_version=4)
    # the notebooks' own settings (03 sets FNX_CPU_DEVICES), not the test run's; a cache of their own
    env = {k: v for k, v in os.environ.items() if k not in ("FNX_DEVICE", "FNX_CPU_DEVICES", "FNX_BEAM", "FNX_DEBUG")}
    env["FNX_CACHE_DIR"] = str(tmp_path / "fnx-cache")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH", "")) if p)
    client = nbclient.NotebookClient(nb, timeout=CELL_TIMEOUT, kernel_name="python3",
                                     resources={"metadata": {"path": str(workdir)}})
    try:
        client.execute(env=env)
    except nbclient.exceptions.CellExecutionError as e:
        pytest.fail(f"{name}: a cell raised:\n{e}")
    errors = [out for cell in nb.cells for out in cell.get("outputs", []) if out["output_type"] == "error"]
    assert not errors, f"{name}: error outputs: {[e['ename'] + ': ' + e['evalue'] for e in errors]}"
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(c.get("execution_count") for c in code), f"{name}: not every code cell ran"
    assert PASSED in _outputs_text(code[-1]), f"{name}: the last cell did not print {PASSED!r}"
    return nb


def _mime_types(cell) -> set[str]:
    return {mime for out in cell.get("outputs", []) for mime in out.get("data", {})}


def _code_text(nb) -> str:
    return "".join(_outputs_text(c) for c in nb.cells if c.cell_type == "code")


def _check_quickstart(nb) -> None:
    graph_cell = next(c for c in nb.cells if c.cell_type == "code" and c.source == "graph")
    assert "function(" in _outputs_text(graph_cell), "the graph's text"
    assert "image/svg+xml" in _mime_types(graph_cell), "Jupyter should draw the graph"


def _check_training(nb) -> None:
    plots = [c for c in nb.cells if c.cell_type == "code" and "image/png" in _mime_types(c)]
    assert len(plots) == 2, "the data and the loss curve should be drawn"


def _check_sharding(nb) -> None:
    text = _code_text(nb)
    assert "CPU 7" in text and "PartitionSpec('data', 'model')" in text


def _check_compiler(nb) -> None:
    drawn = [c for c in nb.cells if c.cell_type == "code" and "image/svg+xml" in _mime_types(c)]
    assert len(drawn) == 7, "every stage (graph, callify, rangeify, optimize, linearize, memory, schedule) is drawn"
    text = _code_text(nb)
    assert "BEAM's actions" in text and "define void @" in text


CHECKS = {"01_quickstart.ipynb": _check_quickstart, "02_training.ipynb": _check_training,
          "03_sharding.ipynb": _check_sharding, "04_inside_the_compiler.ipynb": _check_compiler}


@pytest.mark.parametrize("name", NAMES)
def test_notebook_runs_and_checks_itself(name, tmp_path):
    """Every cell runs without an error, the notebook's own asserts hold (its last cell prints PASSED), and what it
    shows is there (drawings, plots, the mesh)."""
    start = time.perf_counter()
    nb = _run(name, tmp_path)
    CHECKS[name](nb)
    print(f"{name} ran in {time.perf_counter() - start:.1f} s")


def test_the_tests_do_not_write_the_users_cache():
    """tests/conftest.py points FNX_CACHE_DIR at a temporary directory unless the user chose one."""
    home_cache = os.path.realpath(os.path.join(os.path.expanduser("~"), ".cache"))
    chosen_by_tests = os.environ.get("FNX_TEST_CACHE_DIR")
    if chosen_by_tests is None:
        pytest.skip(f"FNX_CACHE_DIR={os.environ.get('FNX_CACHE_DIR')!r} was set by the user")
    assert config.cache_dir == chosen_by_tests
    assert not os.path.realpath(config.cache_dir).startswith(home_cache + os.sep), config.cache_dir
    assert os.path.basename(config.cache_dir).startswith("fnx-test-cache-")
