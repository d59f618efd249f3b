"""The coverage table's ``compiled`` column comes from running code: each row's probe call is
traced and its registry ops checked against lowering. Checked here against ``lucid.compile``
itself on a sample of rows, and against rows whose ops are known to be refused."""

import numpy as np
import pytest

import lucid
from lucid.ops import torch_surface
from lucid.tools.coverage import compiled_status

SAMPLE = [
    ("torch", "atan", lucid),
    ("torch", "logcumsumexp", lucid),
    ("torch", "hstack", lucid),
    ("functional", "fractional_max_pool2d", lucid.nn.functional),
    ("functional", "gelu", lucid.nn.functional),
    ("linalg", "vecdot", lucid.linalg),
]


def _flat(out):
    return [o for o in (out if isinstance(out, (tuple, list)) else (out,))]


@pytest.mark.parametrize("kind, name, owner", SAMPLE, ids=[s[1] for s in SAMPLE])
def test_a_yes_row_compiles_strictly_and_matches_eager(kind, name, owner):
    assert compiled_status(kind, name, owner) == "yes"
    fn, args, _ = torch_surface.probe(kind, name, owner)
    tensors = [a for a in args if isinstance(a, lucid.Tensor)]

    def call(*ts):
        it = iter(ts)
        return fn(*(next(it) if isinstance(a, lucid.Tensor) else a for a in args))

    compiled = lucid.compile(call, strict=True)
    for got, want in zip(_flat(compiled(*tensors)), _flat(call(*tensors)), strict=True):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-6)


def test_refused_and_graph_break_rows_name_the_reason():
    status = compiled_status("linalg", "inv", lucid.linalg)
    assert status.startswith("no:") and "linalg_inv" in status
    assert "graph break" in compiled_status("torch", "unique", lucid)
    assert "graph break" in compiled_status("torch", "histc", lucid)
    assert compiled_status("optim", "Adam", lucid.optim) == "yes"
    assert compiled_status("modules", "Linear", lucid.nn) == "yes"
    assert compiled_status("modules", "NotAModule", lucid.nn) == "not probed"


def test_probes_leave_the_random_state_alone():
    lucid.manual_seed(3)
    before = lucid.rand(3).numpy()
    lucid.manual_seed(3)
    torch_surface.probe("modules", "Dropout", lucid.nn)
    np.testing.assert_array_equal(lucid.rand(3).numpy(), before)


def test_lists_and_exclusions_are_consistent():
    lists = {"modules": torch_surface.NN_MODULES, "functional": torch_surface.NN_FUNCTIONAL,
             "optim": torch_surface.OPTIMIZERS, "linalg": torch_surface.LINALG,
             "torch": torch_surface.TORCH_FUNCTIONS}  # fmt: skip
    for names in lists.values():
        assert len(names) == len(set(names))
    for (kind, name), reason in torch_surface.EXCLUDED.items():
        assert name in lists[kind] and reason
    counted = [
        n for n in torch_surface.TORCH_FUNCTIONS if ("torch", n) not in torch_surface.EXCLUDED
    ]
    present = [n for n in counted if hasattr(lucid, n)]
    assert len(present) / len(counted) >= 0.9
    linalg = [n for n in torch_surface.LINALG if ("linalg", n) not in torch_surface.EXCLUDED]
    assert sum(hasattr(lucid.linalg, n) for n in linalg) / len(linalg) >= 0.9
