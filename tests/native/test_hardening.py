"""Regression tests of issue 15 (items 5-7): malformed programs the validator used to accept
(or crash on), size arithmetic that wrapped, byte-swapped feeds, and interrupting long runs."""

import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from lucid import _native


def fused_two_outputs(**extra):
    """exp(x) and -exp(x) as one fused instruction with two output slots."""
    attrs = {
        "sub_ops": ["exp", "neg"],
        "sub_args": [0, 1],
        "sub_dtypes": ["f32", "f32"],
        "sub_floats": [0.0, 0.0],
        **extra,
    }
    return {
        "slots": [((4,), "f32"), ((4,), "f32"), ((4,), "f32")],
        "instrs": [("fused", [0], [1, 2], attrs)],
        "feeds": [0],
        "results": [1, 2],
    }


def test_multi_output_fused_without_sub_outputs_is_refused():
    desc = fused_two_outputs()
    with pytest.raises(ValueError, match="2 output slots need sub_outputs"):
        _native.validate(desc)
    with pytest.raises(ValueError, match="2 output slots need sub_outputs"):
        _native.compile(desc, cache=False)


def test_sub_outputs_naming_one_node_twice_is_refused():
    with pytest.raises(ValueError, match="sub_outputs names node 1 twice"):
        _native.compile(fused_two_outputs(sub_outputs=[1, 1]), cache=False)
    x = np.linspace(-1, 1, 4, dtype=np.float32)
    e, ne = _native.compile(fused_two_outputs(sub_outputs=[0, 1]), cache=False).run([x])
    np.testing.assert_allclose(e, np.exp(x), rtol=1e-6)
    np.testing.assert_allclose(ne, -np.exp(x), rtol=1e-6)


def test_byte_swapped_feed_is_refused_and_native_order_accepted():
    desc = {
        "slots": [((3,), "f32"), ((3,), "f32")],
        "instrs": [("neg", [0], [1], {})],
        "feeds": [0],
        "results": [1],
    }
    ex = _native.compile(desc, cache=False)
    swapped = np.arange(3, dtype=np.float32).astype(np.dtype(np.float32).newbyteorder())
    with pytest.raises(ValueError, match="feed 0 has non-native byte order"):
        ex.run([swapped])
    explicit_native = np.arange(3, dtype=np.dtype(np.float32).newbyteorder("="))
    np.testing.assert_array_equal(ex.run([explicit_native])[0], -np.arange(3, dtype=np.float32))


def pool_program(kernel, dilation, out_hw=1, padding=0, stride=1):
    return {
        "slots": [((1, 1, 8, 8), "f32"), ((1, 1, out_hw, out_hw), "f32")],
        "instrs": [
            (
                "max_pool2d",
                [0],
                [1],
                {
                    "kernel": [kernel, kernel],
                    "strides": [stride, stride],
                    "padding": [padding] * 4,
                    "dilation": [dilation, dilation],
                },
            )
        ],
        "feeds": [0],
        "results": [1],
    }


def conv_program(dilation=1, groups=1, weight=(1, 1, 2, 2), out=(1, 1, 7, 7), padding=0):
    return {
        "slots": [((1, 1, 8, 8), "f32"), (weight, "f32"), (out, "f32")],
        "instrs": [
            (
                "conv2d",
                [0, 1],
                [2],
                {
                    "strides": [1, 1],
                    "padding": [padding] * 4,
                    "dilation": [dilation, dilation],
                    "groups": groups,
                },
            )
        ],
        "feeds": [0, 1],
        "results": [2],
    }


@pytest.mark.parametrize(
    "desc, message",
    [
        # dilation * (kernel - 1) wrapped to 0: the window looked like one tap.
        (pool_program(2**62 + 1, 4), "dilation \\* \\(kernel - 1\\) overflows"),
        (pool_program(2**62 + 1, 4, out_hw=8), "dilation \\* \\(kernel - 1\\) overflows"),
        (conv_program(dilation=2**62), "larger than padded size"),
        (conv_program(dilation=2**62 + 1, weight=(1, 1, 5, 5)), "overflows"),
        (pool_program(3, 1, padding=2**62 + 7), "padded size overflows"),
        # weight channels * groups wrapped to the input's channel count.
        (conv_program(groups=2**63 - 1, weight=(0, 2, 2, 2), out=(1, 0, 7, 7)), "overflows"),
        # Within 64 bits, but 2^40 taps is hours of work.
        (pool_program(2**20, 1, padding=2**20, stride=2**22), "more than 2\\^42 units of work"),
    ],
)
def test_geometry_overflow_and_unbounded_work_are_refused(desc, message):
    with pytest.raises(ValueError, match=message):
        _native.validate(desc)


def test_pad_and_slice_sizes_do_not_wrap():
    def pad(low, high, out):
        return {
            "slots": [((4,), "f32"), ((out,), "f32")],
            "instrs": [("pad", [0], [1], {"low": [low], "high": [high], "value": 0.0})],
            "feeds": [0],
            "results": [1],
        }

    # (2^63 - 1) * 2 wraps to -2: the output looked like 4 - 2 = 2 elements.
    with pytest.raises(ValueError, match="pad widths overflows"):
        _native.validate(pad(2**63 - 1, 2**63 - 1, 2))
    _native.validate(pad(1, 2, 7))

    def sliced(stride, out):
        return {
            "slots": [((10,), "f32"), ((out,), "f32")],
            "instrs": [("slice", [0], [1], {"starts": [1], "ends": [10], "strides": [stride]})],
            "feeds": [0],
            "results": [1],
        }

    _native.validate(sliced(2**63 - 1, 1))  # one element: start 1
    with pytest.raises(ValueError, match="declared"):
        _native.validate(sliced(2**63 - 1, 0))
    ex = _native.compile(sliced(4, 3), cache=False)
    np.testing.assert_array_equal(ex.run([np.arange(10, dtype=np.float32)])[0], [1, 5, 9])


def test_huge_dimension_behind_an_empty_one_is_refused():
    desc = {
        "slots": [((0, 2**50), "f32"), ((0,), "f32")],
        "instrs": [("reduce_sum", [0], [1], {"axes": [1], "keepdims": False})],
        "feeds": [0],
        "results": [1],
    }
    with pytest.raises(ValueError, match="exceeds 2\\^40 elements"):
        _native.validate(desc)


def test_blas_sizes_above_32_bits_are_refused():
    desc = {
        "slots": [((1, 2**32), "f32"), ((2**32, 1), "f32"), ((1, 1), "f32")],
        "instrs": [("matmul", [0, 1], [2], {"transpose_a": False, "transpose_b": False})],
        "feeds": [0, 1],
        "results": [2],
    }
    with pytest.raises(ValueError, match="matmul contraction size 4294967296 exceeds the BLAS"):
        _native.validate(desc)


def chain_program(steps, n=64):
    """x <- x + (w @ ... @ w) with `steps` matmuls: long, and x is updated in place at the end."""
    slots = [((n, n), "f32"), ((n, n), "f32")]
    instrs, cur = [], 0
    for _ in range(steps):
        slots.append(((n, n), "f32"))
        instrs.append(
            ("matmul", [cur, 1], [len(slots) - 1], {"transpose_a": False, "transpose_b": False})
        )
        cur = len(slots) - 1
    slots.append(((n, n), "f32"))
    instrs.append(("add", [0, cur], [len(slots) - 1], {}))
    return {
        "slots": slots,
        "instrs": instrs,
        "feeds": [0, 1],
        "results": [len(slots) - 1],
        "inplace": {0: 0},
    }


INTERRUPT_SCRIPT = textwrap.dedent(
    """
    import os, signal, sys, threading, time
    import numpy as np
    from lucid import _native
    from tests.native.test_hardening import chain_program
    ex = _native.compile(chain_program(4000, n=512), cache=False)
    assert ex.direct_inplace_results == [0]  # the last step writes into feed 0
    x = np.ones((512, 512), np.float32)
    w = np.eye(512, dtype=np.float32)
    threading.Timer(0.5, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
    start = time.perf_counter()
    try:
        ex.run([x, w])
        print("finished")
    except KeyboardInterrupt:
        print("interrupted", time.perf_counter() - start, bool((x == 1).all()))
    """
)


@pytest.mark.slow  # starts Python processes: CI runs it after the main suite
def test_long_run_on_the_main_thread_is_interrupted_by_ctrl_c_with_feeds_intact():
    # 4,000 GEMMs of 512x512 take seconds to minutes; SIGINT after 0.5 s must stop the run.
    proc = subprocess.run(
        [sys.executable, "-c", INTERRUPT_SCRIPT],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))),
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    word, seconds, intact = proc.stdout.split()
    assert word == "interrupted"
    assert float(seconds) < 10
    assert intact == "True"


def test_handler_that_does_not_raise_lets_the_run_finish():
    calls = []
    previous = signal.signal(signal.SIGUSR1, lambda *_: calls.append(1))
    try:
        ex = _native.compile(chain_program(300, n=32), cache=False)
        x = np.ones((32, 32), np.float32)
        os.kill(os.getpid(), signal.SIGUSR1)  # pending until the next check
        (out,) = ex.run([x, np.eye(32, dtype=np.float32)])
    finally:
        signal.signal(signal.SIGUSR1, previous)
    assert out is x
    np.testing.assert_array_equal(x, np.full((32, 32), 2.0, np.float32))
    assert calls == [1]
