"""The module-level queries PyTorch scripts make before training (device choice, seeding, matmul
precision) answer truthfully for Lucid's CPU-only eager runtime, so such scripts run renamed."""

import pytest

import lucid


def test_cuda_is_reported_absent():
    assert lucid.cuda.is_available() is False
    assert lucid.cuda.device_count() == 0
    device = lucid.device("cuda" if lucid.cuda.is_available() else "cpu")
    assert device == "cpu"
    with pytest.raises(ValueError, match="unknown device 'cuda'"):
        lucid.device("cuda")


def test_cuda_seeding_is_ignored_and_leaves_the_global_stream_alone():
    lucid.manual_seed(4)
    expected = lucid.randn(3).tolist()
    lucid.manual_seed(4)
    lucid.cuda.manual_seed(123)
    lucid.cuda.manual_seed_all(123)
    assert lucid.randn(3).tolist() == expected
    with pytest.raises(ValueError):
        lucid.cuda.manual_seed("not a seed")


def test_accelerator_is_reported_absent():
    assert lucid.accelerator.is_available() is False
    assert lucid.accelerator.device_count() == 0
    assert lucid.accelerator.current_accelerator() is None
    use_accel = lucid.accelerator.is_available()
    device = lucid.accelerator.current_accelerator() if use_accel else lucid.device("cpu")
    assert lucid.zeros(2).to(device).device == device


def test_float32_matmul_precision_is_validated_and_remembered():
    saved = lucid.get_float32_matmul_precision()  # "highest" unless a script set it
    assert saved in ("highest", "high", "medium")
    try:
        lucid.set_float32_matmul_precision("high")
        assert lucid.get_float32_matmul_precision() == "high"
        with pytest.raises(ValueError, match="expected one of"):
            lucid.set_float32_matmul_precision("tf32")
        assert lucid.get_float32_matmul_precision() == "high"
    finally:
        lucid.set_float32_matmul_precision(saved)


def test_is_tensor():
    assert lucid.is_tensor(lucid.zeros(1))
    assert lucid.is_tensor(lucid.nn.Parameter(lucid.zeros(1)))
    assert not lucid.is_tensor([0.0])
