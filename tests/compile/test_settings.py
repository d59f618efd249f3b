"""Bad settings are refused once, clearly, at the first compile (issue 15, item 13), instead of
sending every signature to eager with one warning each."""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest

import lucid
import lucid.nn as nn
import lucid.nn.functional as F
from lucid import optim
from lucid.compile import fused_step, make_step


def _entry_points(model):
    x, y = lucid.ones(2, 3), lucid.zeros(2, 2)
    cm = lucid.compile(model)

    def call():
        with lucid.no_grad():
            cm(x)

    yield "lucid.compile", call, cm
    yield "make_step", lambda: make_step(model, F.mse_loss)(x, y), None
    opt = optim.SGD(model.parameters(), lr=0.1)
    yield "fused_step", lambda: fused_step(model, F.mse_loss, opt)(x, y), None


@pytest.mark.parametrize("value", ["abc", "0", "-3", "1.5"])
def test_bad_thread_count_is_refused(monkeypatch, caplog, value):
    monkeypatch.setenv("LUCID_NUM_THREADS", value)
    model = nn.Linear(3, 2)
    with caplog.at_level(logging.WARNING, logger="lucid.compile"):
        for name, run, cm in _entry_points(model):
            with pytest.raises(ValueError, match="LUCID_NUM_THREADS must be a positive integer"):
                run()
            if cm is not None:
                assert not cm.cache_info()["eager_only"], name
    assert not caplog.records  # no per-signature fallback warnings


def test_bad_cache_cap_is_refused(monkeypatch):
    monkeypatch.setenv("LUCID_COMPILE_MAX_CACHE", "lots")
    with pytest.raises(ValueError, match="LUCID_COMPILE_MAX_CACHE"):
        lucid.compile(nn.Linear(3, 2))


def test_unwritable_debug_dir_is_refused(monkeypatch, tmp_path, caplog):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("LUCID_COMPILE_DEBUG", "1")
    monkeypatch.setenv("LUCID_COMPILE_DEBUG_DIR", str(blocker / "traces"))
    cm = lucid.compile(nn.Linear(3, 2))
    with caplog.at_level(logging.WARNING, logger="lucid.compile"), lucid.no_grad():
        for _ in range(2):
            with pytest.raises(ValueError, match="LUCID_COMPILE_DEBUG_DIR=.*not a writable folder"):
                cm(lucid.ones(2, 3))
    assert not cm.cache_info()["eager_only"] and not caplog.records


def test_writable_debug_dir_gets_the_trace(monkeypatch, tmp_path):
    monkeypatch.setenv("LUCID_COMPILE_DEBUG", "1")
    monkeypatch.setenv("LUCID_COMPILE_DEBUG_DIR", str(tmp_path / "traces"))
    with lucid.no_grad():
        lucid.compile(nn.Linear(3, 2))(lucid.ones(2, 3))
    assert list((tmp_path / "traces").glob("lucid-trace-*.json"))


@pytest.mark.slow  # starts Python processes: CI runs it after the main suite
def test_bad_thread_count_does_not_break_import():
    code = "import lucid, lucid.backends.cpu; print('ok')"
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={"LUCID_NUM_THREADS": "abc", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
