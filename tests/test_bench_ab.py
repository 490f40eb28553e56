"""bench/ab.py: each variant is its own code (the in-process caches would otherwise hand the second variant the
first one's build, and an A/B would compare a build with itself), settings are restored, and a run prints every
variant."""
from __future__ import annotations

import sys

import pytest

from bench import ab
from fnx.lower import pipeline


def test_each_variant_is_compiled_under_its_own_setting():
    before = pipeline.STREAM_MIN_CACHES
    built = []
    for variant in ("base", "fnx.lower.pipeline.STREAM_MIN_CACHES=1000000", "base"):
        built.append(ab._build("W10", variant))
        assert pipeline.STREAM_MIN_CACHES == before  # restored after the build
    # after every build (each emptied the in-process caches), each variant still runs its own executable: a
    # jitted function would look its code up again and find the last variant's under the same graph
    executables = []
    for compiled, args in built:
        executables.append(compiled.lowered.executable)
        compiled(*args)
        assert compiled.lowered.executable is executables[-1]
    assert len({id(e) for e in executables}) == 3
    texts = [compiled.as_text("llvm") for compiled, _ in built]
    assert "!nontemporal" in texts[0] and "!nontemporal" not in texts[1] and "!nontemporal" in texts[2]


def test_a_run_reports_every_variant(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["ab.py", "W4", "base", "fnx.lower.optimize.ROW_PAIRS=0", "--calls", "2"])
    ab.main()
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in lines] == ["W4 base", "W4 fnx.lower.optimize.ROW_PAIRS=0"]


def test_an_unknown_setting_is_refused():
    with pytest.raises(SystemExit, match="no NOT_A_KNOB"):
        ab._settings("fnx.lower.optimize.NOT_A_KNOB=1")


def test_bench_rounds_report_each_implementations_best_with_its_own_note(monkeypatch, capsys):
    """bench/run.py --rounds: every workload runs in each round; the table keeps each implementation's fastest
    row, whose rates and note are from the round that measured it."""
    from bench import run
    times = iter([2.0, 3.0, 1.0, 4.0])

    def workload():
        return run.report("W0 fake workload", {"fnx": next(times), "jax": next(times)}, "fnx note", bytes_moved=10**9)
    monkeypatch.setitem(run.WORKLOADS, "W0", workload)
    monkeypatch.setattr(run, "memory_bandwidth", lambda: 1.0)
    monkeypatch.setattr(run, "core_peak", lambda: (1.0, ["fake peak"]))
    run.main(["W0", "--rounds", "2", "--markdown"])
    line = [x for x in capsys.readouterr().out.splitlines() if x.startswith("| W0")]
    assert line == ["| W0 fake workload | 1.00 s |  | 3.00 s (3.00x) | fnx 1.0 GB/s (100% of measured bandwidth) |"]
