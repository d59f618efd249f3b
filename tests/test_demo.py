"""The demo (README's first command) runs, agrees with eager, and its loss falls."""

import re

from lucid import demo


def test_demo_quick_runs_and_the_loss_falls(capsys):
    demo.main(["--quick"])
    out = capsys.readouterr().out
    first, last = map(float, re.search(r"loss fell from ([\d.]+) to ([\d.]+)", out).groups())
    assert last < first
    assert "entries=1, eager_only=0" in out
    assert "lucid.linear" in out
