"""What importing Lucid and compiling load: ml_dtypes only once bfloat16 is used, and none of
xDSL's parser, printer, declarative assembly format or ``func`` dialect on the compile path.
Checked in fresh interpreters, since the test session imports everything; those under a second
run by default."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

from lucid._dtype import BFloat16Table

_PRINT_LOADED = "\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))\n"


def _loaded_after(script: str) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-c", script + _PRINT_LOADED],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


def test_import_lucid_and_float_work_load_no_ml_dtypes():
    loaded = _loaded_after(
        """
import lucid
assert repr(lucid.bfloat16) == "lucid.bfloat16" and lucid.bfloat16.itemsize == 2
assert lucid.bfloat16 != lucid.float16 and lucid.bfloat16.is_floating_point
assert lucid.finfo(lucid.float16).max == 65504.0
x = lucid.tensor([1.0, 2.0], dtype=lucid.float16)
assert (x * 3).sum().item() == 9.0
"""
    )
    assert "lucid" in loaded
    assert "ml_dtypes" not in loaded


@pytest.mark.slow  # starts Python and ml_dtypes (over a second)
def test_bfloat16_loads_ml_dtypes_on_first_use_and_works():
    loaded = _loaded_after(
        """
import numpy as np, lucid
assert "ml_dtypes" not in __import__("sys").modules
x = lucid.tensor([1.0, 2.5, 3.0], dtype=lucid.bfloat16)
assert x.dtype is lucid.bfloat16 and x.numpy().dtype == lucid.bfloat16.numpy
assert (x * 2).tolist() == [2.0, 5.0, 6.0]
assert lucid.finfo(lucid.bfloat16).eps == 2.0**-7
"""
    )
    assert "ml_dtypes" in loaded


@pytest.mark.slow  # starts Python and ml_dtypes (over a second)
def test_bfloat16_arrays_from_an_ml_dtypes_imported_after_lucid_are_known(tmp_path):
    path = tmp_path / "bf16.safetensors"
    subprocess.run(
        [
            sys.executable,
            "-c",
            f"""
import lucid
lucid.save({{"w": lucid.tensor([1.0, -2.0], dtype=lucid.bfloat16)}}, {str(path)!r})
""",
        ],
        check=True,
        timeout=300,
    )
    _loaded_after(
        f"""
import lucid
state = lucid.load({str(path)!r})  # a fresh process: BF16 data resolves bfloat16 itself
assert state["w"].dtype is lucid.bfloat16 and state["w"].tolist() == [1.0, -2.0]
"""
    )
    _loaded_after(
        """
import lucid, ml_dtypes, numpy as np
a = np.array([1.0, 2.0], dtype=ml_dtypes.bfloat16)
assert lucid.tensor(a).dtype is lucid.bfloat16
assert lucid._dtype.from_numpy(a.dtype) is lucid.bfloat16
m = lucid.nn.Linear(2, 1).to(lucid.bfloat16)
m.load_state_dict({"weight": np.ones((1, 2), ml_dtypes.bfloat16), "bias": a[:1]})
"""
    )


# xDSL modules a compile never uses: they only print, parse or pattern-rewrite IR.
_NOT_ON_THE_COMPILE_PATH = (
    "importlib.metadata",  # read only to find passes installed by other packages
    "ml_dtypes",
    "xdsl.dialects.func",
    "xdsl.dialects.utils",
    "xdsl.irdl.declarative_assembly_format",
    "xdsl.parser",
    "xdsl.printer",
)


def test_compiling_and_training_import_no_printer_parser_or_xdsl_func():
    loaded = _loaded_after(
        """
import numpy as np, lucid, lucid.nn as nn, lucid.nn.functional as F
model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
x = lucid.tensor(np.ones((3, 4), np.float32))
with lucid.no_grad():
    assert np.allclose(lucid.compile(model)(x).numpy(), model(x).numpy(), atol=1e-5)
step = lucid.compile.fused_step(model, F.cross_entropy, lucid.optim.SGD(model.parameters(), 0.1))
step(x, lucid.tensor([0, 1, 0]))
y = lucid.tensor(np.array([np.nan, np.inf, 1.0], np.float32)).half()
got = lucid.compile(lambda v: lucid.nan_to_num(v))(y).float().numpy()
assert got.tolist() == [0.0, 65504.0, 1.0], got  # float16's largest finite value
"""
    )
    assert "lucid.compile.training" in loaded  # the script did compile a step
    assert loaded.isdisjoint(_NOT_ON_THE_COMPILE_PATH), sorted(
        loaded & set(_NOT_ON_THE_COMPILE_PATH)
    )


def test_bfloat16_tables_resolve_their_entry_on_lookup():
    bf16 = np.dtype(ml_dtypes.bfloat16)
    by_name = BFloat16Table({"f16": np.dtype(np.float16)}, name="bf16")
    assert "bf16" in by_name and by_name["bf16"] == bf16
    assert "f8" not in by_name
    with pytest.raises(KeyError):
        by_name["f8"]
    by_numpy = BFloat16Table({np.dtype(np.float16): "f16"}, value="bf16")
    assert bf16 in by_numpy and by_numpy[bf16] == "bf16"
    assert np.dtype(np.int8) not in by_numpy and "bf16" not in by_numpy


_WARM_SCRIPT = """
import numpy as np, lucid, lucid.nn as nn
lucid.manual_seed(0)
model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)).eval()
x = lucid.tensor(np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4))
compiled = lucid.compile(model)
with lucid.no_grad():
    got = compiled(x).numpy()
    assert np.allclose(got, model(x).numpy(), atol=1e-6)
print(sorted(compiled.timing()[0]["passes_ms"]))
"""


def test_a_disk_cache_hit_loads_no_xdsl(tmp_path):
    # The first process compiles and stores; the second finds the entry and must not pay for
    # importing the compiler (xDSL alone is ~80 ms, most of a warm first call).
    env = dict(os.environ, LUCID_COMPILE_DISK_CACHE="1", LUCID_COMPILE_DISK_CACHE_DIR=str(tmp_path))
    runs = [
        subprocess.run(
            [sys.executable, "-c", _WARM_SCRIPT + _PRINT_LOADED],
            capture_output=True,
            text=True,
            check=True,
            timeout=300,
            env=env,
        )
        .stdout.strip()
        .splitlines()
        for _ in range(2)
    ]
    (cold_stages, cold_loaded), (warm_stages, warm_loaded) = [
        (r[-2], json.loads(r[-1])) for r in runs
    ]
    assert "disk-cache-store" in cold_stages and "xdsl" in cold_loaded
    assert "disk-cache-load" in warm_stages and "lower-to-prim" not in warm_stages
    assert not [m for m in warm_loaded if m.split(".")[0] == "xdsl"]


def test_serving_a_saved_compiled_module_loads_no_xdsl(tmp_path):
    # Saved in this process; served by a fresh one, whose saved program runs as it is.
    import lucid
    import lucid.nn as nn

    lucid.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)).eval()
    x = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)
    compiled = lucid.compile(model)
    with lucid.no_grad():
        want = compiled(lucid.tensor(x)).numpy()
    path = tmp_path / "mlp.lucid"
    lucid.compile.save_compiled(compiled, str(path))
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "want.npy", want)
    loaded = _loaded_after(
        f"""
import numpy as np, lucid
served = lucid.compile.load_compiled({str(path)!r})
x = np.load({str(tmp_path / "x.npy")!r})
got = served(lucid.tensor(x)).numpy()
assert np.array_equal(got, np.load({str(tmp_path / "want.npy")!r})), got
"""
    )
    assert "lucid.compile.aot.loaded" in loaded
    assert not [m for m in loaded if m.split(".")[0] == "xdsl"]
