"""Small PyTorch surface pieces: 0-d formatting, device flags, lucid.onnx, nn.parallel,
lucid.backends.cudnn."""

import subprocess
import sys

import pytest

import lucid
import lucid.nn as nn


def test_zero_dim_tensors_format_like_numbers():
    assert f"{lucid.tensor(1.5):+.2f}" == "+1.50"
    assert f"{lucid.tensor(3):05d}" == "00003"
    assert f"{lucid.tensor(2.5)}" == "2.5"
    assert f"{lucid.tensor([1.0, 2.0])}" == str(lucid.tensor([1.0, 2.0]))
    with pytest.raises(TypeError):
        f"{lucid.tensor([1.0, 2.0]):.2f}"


def test_device_flags():
    x = lucid.zeros(2)
    assert (x.is_cuda, x.is_xpu, x.is_mps, x.is_cpu) == (False, False, False, True)


def test_onnx_export_is_a_clear_error():
    import lucid.onnx

    assert not lucid.onnx.is_in_onnx_export()
    with pytest.raises(lucid.onnx.ExportNotSupported, match="not supported"):
        lucid.onnx.export(nn.Linear(2, 2), lucid.zeros(1, 2), "model.onnx")
    assert isinstance(lucid.onnx.ExportNotSupported("x"), RuntimeError)


def test_data_parallel_is_a_pass_through_keeping_torch_state_dict_names():
    from lucid.nn.parallel import DataParallel

    lucid.manual_seed(0)
    inner = nn.Linear(3, 2)
    wrapped = nn.DataParallel(inner)
    assert isinstance(wrapped, DataParallel)
    x = lucid.randn(4, 3)
    assert lucid.equal(wrapped(x), inner(x))
    assert sorted(wrapped.state_dict()) == ["module.bias", "module.weight"]
    assert wrapped.module is inner
    with pytest.raises(ValueError, match="several devices"):
        nn.DataParallel(inner, device_ids=[0, 1])
    assert lucid.equal(nn.parallel.data_parallel(inner, x), inner(x))


@pytest.mark.slow  # starts Python processes: CI runs it after the main suite
def test_cudnn_flags_reachable_as_in_torch_without_loading_the_compiler():
    code = (
        "import sys, lucid\n"
        "lucid.backends.cudnn.benchmark = True\n"
        "lucid.backends.cudnn.deterministic = True\n"
        "import lucid.backends.cudnn as cudnn\n"
        "assert cudnn.benchmark and not cudnn.is_available() and cudnn.version() is None\n"
        "assert 'xdsl' not in sys.modules, 'the flags module loaded the compiler'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_contiguous_copies_a_transposed_view_row_major_and_keeps_gradients():
    x = lucid.arange(12.0).reshape(3, 4).requires_grad_(True)
    view = x.t()
    assert not view.is_contiguous()
    copy = view.contiguous()
    assert copy.is_contiguous() and copy.tolist() == view.tolist()
    assert x.contiguous() is x
    (copy * lucid.arange(12.0).reshape(4, 3)).sum().backward()
    assert x.grad.tolist() == lucid.arange(12.0).reshape(4, 3).t().tolist()
