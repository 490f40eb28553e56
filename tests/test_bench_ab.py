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
