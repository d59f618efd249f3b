"""The tracer: feeds and roles, no numpy work, graph breaks with source lines, in-place updates,
nesting and threads, JSON round trip."""

from __future__ import annotations

import sys
import threading

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import lucid
from lucid._dispatch import apply
from lucid.ops._registry import DATA_DEPENDENT, AVal, OpDef
from lucid.trace import GraphBreak, Trace, _tracing, trace
from lucid.trace._trace import Const


class TinyModel:
    """Enough of an nn.Module for the tracer's naming: named_parameters / named_buffers."""

    def __init__(self):
        rng = np.random.default_rng(0)
        self.weight = lucid.tensor(rng.standard_normal((3, 4)).astype(np.float32))
        self.running = lucid.tensor(np.zeros(4, np.float32))

    def named_parameters(self):
        return [("fc.weight", self.weight)]

    def named_buffers(self):
        return [("bn.running_mean", self.running)]

    def __call__(self, x):
        self.running.add_(x.sum(0))
        return (x * self.weight).exp().sum(1)


def test_trace_records_ops_and_feeds_without_computing():
    x = lucid.tensor(np.ones((2, 3), np.float32))
    w = lucid.tensor(np.full((2, 3), 2.0, np.float32))
    with _tracing() as tracer:
        xt = tracer.input_like(x)
        y = (xt * w + 1).sum(1)
        assert y._data is None and y.is_traced
        assert y.shape == (2,) and y.dtype is lucid.float32
        tr = tracer.finish(y)
    assert [op.name for op in tr.ops] == ["mul", "add", "sum"]
    assert [f.role for f in tr.feeds] == ["input:0", "capture:0"]
    assert tr.ops[1].inputs[1] == Const(1)
    assert tr.ops[2].attrs == {"dim": 1, "keepdim": False, "dtype": None}
    assert tr.outputs == [("output:0", tr.ops[2].outputs[0])]


def test_captured_tensor_is_one_feed_bound_by_identity():
    w = lucid.tensor(np.ones(3, np.float32))
    other = lucid.tensor(np.ones(3, np.float32))  # equal values, different tensor
    tr = trace(lambda x: x * w + w * other, lucid.tensor(np.ones(3, np.float32)))
    assert [f.role for f in tr.feeds] == ["input:0", "capture:0", "capture:1"]


def test_model_parameters_and_buffers_are_named_and_buffer_writes_are_outputs():
    model = TinyModel()
    before = model.running.numpy().copy()
    x = lucid.tensor(np.ones((3, 4), np.float32))
    tr = trace(model, x, model=model)
    roles = [f.role for f in tr.feeds]
    assert roles == ["input:0", "buffer:bn.running_mean", "param:fc.weight"]
    assert [r for r, _ in tr.outputs] == ["output:0", "update:buffer:bn.running_mean"]
    # the update output is the value written by add_, not the feed itself
    update = tr.outputs[1][1]
    assert update is tr.ops[1].outputs[0] and tr.ops[1].name == "add"
    np.testing.assert_array_equal(model.running.numpy(), before)  # nothing was computed


def test_inplace_write_is_seen_by_later_reads():
    buf = lucid.tensor(np.zeros(2, np.float32))

    def f(x):
        buf.mul_(2)
        return buf + x

    tr = trace(f, lucid.tensor(np.ones(2, np.float32)))
    last = tr.ops[-1]
    assert last.name == "add" and last.inputs[0] is tr.ops[0].outputs[0]


def _line_of(marker: str) -> int:
    src = open(__file__).read().splitlines()
    return next(i + 1 for i, line in enumerate(src) if line.endswith("# " + marker))


@pytest.mark.parametrize("marker", ["MARK-item", "MARK-numpy", "MARK-tolist", "MARK-bool"])
def test_graph_break_names_the_read_and_the_user_line(marker):
    fns = {
        "MARK-item": lambda t: t.sum().item(),  # MARK-item
        "MARK-numpy": lambda t: t.numpy(),  # MARK-numpy
        "MARK-tolist": lambda t: t.tolist(),  # MARK-tolist
        "MARK-bool": lambda t: bool(t.sum()),  # MARK-bool
    }
    with pytest.raises(GraphBreak) as e:
        trace(fns[marker], lucid.tensor(np.ones(2, np.float32)))
    assert e.value.filename == __file__
    assert e.value.lineno == _line_of(marker)
    assert f"{__file__}:{e.value.lineno}" in str(e.value)


def test_python_control_flow_on_a_tensor_breaks():
    def forward(x):
        if x.sum():  # MARK-if
            return x
        return -x

    with pytest.raises(GraphBreak, match="control flow") as e:
        trace(forward, lucid.tensor(np.ones(2, np.float32)))
    assert e.value.lineno == _line_of("MARK-if")


def test_data_dependent_op_breaks_at_record_time():
    nonzero = OpDef(
        "test_nonzero",
        ("x",),
        lambda x: AVal((None,), lucid.int64),
        lambda x: np.flatnonzero(x),
        props=frozenset({DATA_DEPENDENT}),
    )
    with pytest.raises(GraphBreak, match="test_nonzero"):
        trace(lambda x: apply(nonzero, x), lucid.tensor(np.ones(2, np.float32)))


def test_shape_errors_under_trace_match_eager():
    a, b = lucid.tensor(np.ones((2, 3))), lucid.tensor(np.ones((4, 3)))
    with pytest.raises(ValueError) as eager:
        a + b
    with pytest.raises(ValueError) as traced:
        trace(lambda p, q: p + q, a, b)
    assert str(eager.value) == str(traced.value)


def test_tracer_is_removed_after_an_exception_and_nested_traces_restore():
    from lucid._state import state

    with pytest.raises(GraphBreak):
        trace(lambda t: t.item(), lucid.tensor(1.0))
    assert state.tracer is None
    with _tracing() as outer:
        with _tracing() as inner:
            assert state.tracer is inner
        assert state.tracer is outer
    assert state.tracer is None


def test_outer_trace_tensor_is_a_feed_of_the_inner_trace():
    with _tracing() as outer:
        xo = outer.input((2,))
        with _tracing() as inner:
            y = inner.input((2,)) + xo
            tr = inner.finish(y)
        assert not outer.trace.ops  # the inner add went to the inner trace only
    assert [f.role for f in tr.feeds] == ["input:0", "capture:0"]


def test_traces_on_other_threads_do_not_interfere():
    results = {}

    def worker(i):
        x = lucid.tensor(np.ones((i + 1, 2), np.float32))
        tr = trace(lambda t: (t * 2).exp() if i % 2 else t.sum(0), x)
        results[i] = [op.name for op in tr.ops], tr.feeds[0].value.shape

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i in range(6):
        assert results[i] == ((["mul", "exp"] if i % 2 else ["sum"]), (i + 1, 2))


def test_eager_ops_still_run_outside_the_trace_on_this_thread():
    with _tracing() as tracer:
        tracer.input((2,))
    y = lucid.tensor([1.0, 2.0]) * 2
    np.testing.assert_array_equal(y.numpy(), [2.0, 4.0])


def test_symbolic_dims_flow_through_inference():
    with _tracing() as tracer:
        x = tracer.input((None, 3))
        y = (x * 2).sum(1)
        tr = tracer.finish(y)
    assert y.shape == (None,)
    assert tr.feeds[0].value.shape == (None, 3)


_attr_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**62), 2**62)
    | st.floats(allow_nan=False)
    | st.text(max_size=5)
    | st.sampled_from([lucid.float32, lucid.int64, lucid.bool_, lucid.float16]),
    lambda inner: st.lists(inner, max_size=3).map(tuple),
    max_leaves=6,
)


@given(attrs=st.dictionaries(st.sampled_from(["a", "dim", "shape"]), _attr_values, max_size=3))
def test_trace_json_round_trip(attrs):
    tr = trace(lambda t: (t * 2.5 + True).sum(1), lucid.tensor(np.ones((2, 3), np.float32)))
    tr.ops[0].attrs = attrs
    text = tr.to_json()
    back = Trace.from_json(text)
    assert back.to_json() == text
    assert back.ops[0].attrs == attrs
    assert back.ops[1].inputs[1] == Const(True) and type(back.ops[1].inputs[1].value) is bool
    assert back.outputs[0][1] is back.ops[-1].outputs[0]


def test_trace_json_has_the_documented_layout():
    import json

    tr = trace(lambda t: t.reshape(6), lucid.tensor(np.ones((2, 3), np.float32)))
    d = json.loads(tr.to_json())
    assert d["format"] == "lucid.compile.trace/v1"
    op = d["ops"][0]
    assert op["name"] == "reshape" and op["inputs"] == [{"id": 0}]
    assert op["outputs"] == [{"id": 1, "shape": [6], "dtype": "float32", "device": "cpu"}]
    assert op["attrs"] == {"shape": {"tuple": [6]}}


def test_loading_bad_json_is_a_clear_error():
    with pytest.raises(ValueError, match="format"):
        Trace.from_json('{"format": "something/v9"}')
    with pytest.raises(ValueError, match="before defining"):
        Trace.from_dict(
            {
                "format": "lucid.compile.trace/v1",
                "feeds": [],
                "ops": [],
                "outputs": [{"role": "output:0", "id": 3}],
            }
        )


def test_graph_break_message_includes_source_text():
    with pytest.raises(GraphBreak) as e:
        trace(lambda t: t.item(), lucid.tensor(1.0))  # MARK-src
    assert "MARK-src" in str(e.value)
    assert sys.modules[__name__] is not None


def test_repeated_inplace_writes_give_one_update_with_the_last_value():
    buf = lucid.tensor(np.zeros(2, np.float32))

    def f(x):
        buf.add_(x)
        buf.mul_(3)
        x.add_(1)
        x.mul_(2)
        return x * 1

    tr = trace(f, lucid.tensor(np.ones(2, np.float32)))
    outs = dict(tr.outputs)
    assert sorted(outs) == ["output:0", "update:capture:0", "update:input:0"]
    assert outs["update:capture:0"] is tr.ops[1].outputs[0]  # the mul_ result
    assert outs["update:input:0"] is tr.ops[3].outputs[0]


def test_trace_tensor_from_a_finished_trace_is_a_clear_error():
    with _tracing() as first:
        stale = first.input((2,)) * 2
        first.finish(stale)
    with pytest.raises(RuntimeError, match="finished trace"):
        trace(lambda t: t + stale, lucid.tensor(np.ones(2, np.float32)))


def test_feed_tensors_map_roles_to_the_captured_tensors():
    model = TinyModel()
    with _tracing(model) as tracer:
        tracer.finish(model(tracer.input((3, 4))))
    feeds = tracer.feed_tensors()
    assert feeds["param:fc.weight"] is model.weight
    assert feeds["buffer:bn.running_mean"] is model.running
    assert "input:0" not in feeds


def test_numpy_integer_dims_from_inference_become_python_ints():
    op = OpDef(
        "test_np_dims",
        ("x",),
        lambda x: AVal((np.int64(2), np.int32(3)), x.dtype),
        lambda x: np.zeros((2, 3), x.dtype),
    )
    tr = trace(lambda t: apply(op, t), lucid.tensor(np.ones(2, np.float32)))
    assert all(type(d) is int for d in tr.ops[0].outputs[0].shape)
    Trace.from_json(tr.to_json())  # serialisable


def test_duplicate_roles_and_double_finish_are_errors():
    with _tracing() as tracer:
        tracer.input((2,), role="scalar:lr")
        with pytest.raises(ValueError, match="scalar:lr"):
            tracer.input((2,), role="scalar:lr")
        x = tracer.input((2,))
        tracer.finish(x * 2)
        with pytest.raises(RuntimeError, match="already"):
            tracer.finish(x)


def test_custom_autograd_function_breaks_naming_it():
    from lucid.autograd import Function

    class Double(Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, g):
            return g * 2

    with pytest.raises(GraphBreak, match="custom autograd.Function Double") as e:
        trace(lambda t: Double.apply(t), lucid.tensor(np.ones(2, np.float32)))  # MARK-fn
    assert e.value.lineno == _line_of("MARK-fn")
