"""Module bookkeeping: registration, naming, state_dict, modes, conversions, containers."""

import copy
from collections import OrderedDict

import numpy as np
import pytest

import lucid
import lucid.nn as nn
from lucid.nn import Parameter


def _param(*shape, value=None):
    data = np.arange(np.prod(shape), dtype=np.float32).reshape(shape) if value is None else value
    return Parameter(lucid.tensor(data))


class Affine(nn.Module):
    """A module built from ops that exist in the core (mul, add), with one buffer."""

    def __init__(self, n=3):
        super().__init__()
        self.scale = _param(n)
        self.shift = _param(n)
        self.register_buffer("count", lucid.tensor(0))
        self.register_buffer("scratch", lucid.tensor([0.0] * n), persistent=False)

    def forward(self, x):
        return x * self.scale + self.shift


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = Affine()
        self.b = Affine()
        self.head = _param(3)

    def forward(self, x):
        return (self.b(self.a(x)) * self.head).sum()


# --- Parameter -----------------------------------------------------------------------------------
def test_parameter_requires_grad_and_shares_memory():
    t = lucid.tensor([1.0, 2.0])
    p = Parameter(t)
    assert p.requires_grad and p.is_leaf
    assert isinstance(p, lucid.Tensor)
    t._data[0] = 5.0
    assert p.tolist() == [5.0, 2.0]
    assert not Parameter(t, requires_grad=False).requires_grad


def test_parameter_repr_and_integer_rejection():
    p = Parameter(lucid.tensor([1.0, 2.0]))
    assert repr(p).startswith("Parameter containing:\ntensor(")
    assert "requires_grad=True" in repr(p)
    with pytest.raises(RuntimeError, match="floating point"):
        Parameter(lucid.tensor([1, 2]))


def test_parameter_ops_return_plain_tensors():
    p = Parameter(lucid.tensor([1.0, 2.0]))
    assert type(p * 2) is lucid.Tensor
    assert type(p.detach()) is lucid.Tensor


# --- registration
def test_setattr_registers_parameters_buffers_and_modules_in_order():
    m = Affine()
    assert list(m._parameters) == ["scale", "shift"]
    assert list(m._buffers) == ["count", "scratch"]
    net = Net()
    assert list(net._modules) == ["a", "b"]
    assert net.a is net._modules["a"]
    assert "a" not in net.__dict__  # stored only in the table


def test_assigning_a_plain_tensor_to_a_parameter_name_raises():
    m = Affine()
    with pytest.raises(TypeError, match="parameter 'scale'"):
        m.scale = lucid.tensor([1.0, 2.0, 3.0])
    m.scale = None
    assert m.scale is None
    assert [n for n, _ in m.named_parameters()] == ["shift"]


def test_assigning_before_init_raises():
    class Bad(nn.Module):
        def __init__(self):
            self.w = _param(2)

    with pytest.raises(AttributeError, match="before Module.__init__"):
        Bad()


def test_register_validation():
    m = nn.Module()
    with pytest.raises(KeyError, match="contain"):
        m.register_buffer("a.b", lucid.tensor([1.0]))
    with pytest.raises(KeyError, match="empty"):
        m.register_parameter("", None)
    with pytest.raises(TypeError, match="buffer 'x'"):
        m.register_buffer("x", [1.0])
    with pytest.raises(TypeError, match="parameter 'w'"):
        m.register_parameter("w", lucid.tensor([1.0]))
    m.some_attr = 3
    with pytest.raises(KeyError, match="already exists"):
        m.register_buffer("some_attr", lucid.tensor([1.0]))
    with pytest.raises(TypeError, match="not a Module"):
        m.add_module("sub", 3)


def test_non_leaf_parameter_rejected():
    m = nn.Module()
    x = lucid.tensor([1.0], requires_grad=True)
    p = Parameter(x)
    p._node = (x * 2)._node  # simulate a parameter with history
    with pytest.raises(ValueError, match="non-leaf"):
        m.register_parameter("w", p)


def test_missing_attribute_error_names_class_and_attribute():
    with pytest.raises(AttributeError, match="'Affine' object has no attribute 'nope'"):
        _ = Affine().nope


def test_reassigning_kind_moves_between_tables_and_delattr():
    m = Affine()
    m.count = nn.Module()
    assert "count" in m._modules and "count" not in m._buffers
    m.shift = Parameter(lucid.tensor([0.0]))  # a new Parameter replaces the old one
    assert m.shift.shape == (1,)
    del m.scratch
    assert "scratch" not in m._buffers
    with pytest.raises(AttributeError):
        _ = m.scratch


# --- naming and iteration
def test_named_parameters_are_dotted_and_ordered():
    net = Net()
    names = [n for n, _ in net.named_parameters()]
    assert names == ["head", "a.scale", "a.shift", "b.scale", "b.shift"]
    assert [n for n, _ in net.named_parameters(recurse=False)] == ["head"]
    assert [n for n, _ in net.named_parameters(prefix="model")][0] == "model.head"
    assert len(list(net.parameters())) == 5


def test_shared_parameters_and_modules_are_deduplicated():
    net = Net()
    net.b.scale = net.a.scale  # tied weight
    names = [n for n, _ in net.named_parameters()]
    assert names == ["head", "a.scale", "a.shift", "b.shift"]
    assert len(list(net.named_parameters(remove_duplicate=False))) == 5
    shared = Affine()
    seq = nn.Sequential(shared, shared)
    assert len(list(seq.modules())) == 2
    assert len(list(seq.parameters())) == 2
    assert len(list(seq.children())) == 1


def test_named_modules_buffers_children():
    net = Net()
    assert [n for n, _ in net.named_modules()] == ["", "a", "b"]
    assert [n for n, _ in net.named_children()] == ["a", "b"]
    assert [n for n, _ in net.named_buffers()] == ["a.count", "a.scratch", "b.count", "b.scratch"]
    assert net.get_submodule("a") is net.a
    assert net.get_parameter("a.scale") is net.a.scale
    assert net.get_buffer("b.count") is net.b.count
    with pytest.raises(AttributeError, match="no submodule"):
        net.get_submodule("c")


# --- state_dict
def test_state_dict_has_params_and_persistent_buffers_detached_in_order():
    net = Net()
    sd = net.state_dict()
    assert list(sd) == ["head", "a.scale", "a.shift", "a.count", "b.scale", "b.shift", "b.count"]
    assert all(not v.requires_grad for v in sd.values())
    assert all(type(v) is lucid.Tensor for v in sd.values())
    # Detached values share memory with the module's tensors, as in torch.
    net.head._data[0] = 42.0
    assert sd["head"].tolist()[0] == 42.0
    kept = net.state_dict(keep_vars=True)
    assert kept["head"] is net.head


def test_load_state_dict_round_trip_keeps_parameter_identity():
    src, dst = Net(), Net()
    with lucid.no_grad():
        for p in src.parameters():
            p._data[...] = np.random.default_rng(1).standard_normal(p.shape)
    src.a.count._data[...] = 7
    ids = {n: id(p) for n, p in dst.named_parameters()}
    result = dst.load_state_dict(src.state_dict())
    assert result.missing_keys == [] and result.unexpected_keys == []
    assert repr(result) == "<All keys matched successfully>"
    for (n, p), (_, q) in zip(dst.named_parameters(), src.named_parameters(), strict=True):
        assert id(p) == ids[n]
        np.testing.assert_array_equal(p._data, q._data)
        assert p._data is not q._data
    assert dst.a.count.item() == 7


def test_load_state_dict_strict_reports_missing_and_unexpected_keys():
    net = Net()
    sd = net.state_dict()
    del sd["a.shift"]
    sd["extra.weight"] = lucid.tensor([1.0])
    with pytest.raises(RuntimeError) as err:
        Net().load_state_dict(sd)
    msg = str(err.value)
    assert 'Missing key(s) in state_dict: "a.shift"' in msg
    assert 'Unexpected key(s) in state_dict: "extra.weight"' in msg
    result = Net().load_state_dict(sd, strict=False)
    assert result.missing_keys == ["a.shift"]
    assert result.unexpected_keys == ["extra.weight"]


def test_load_state_dict_shape_mismatch_names_key_and_shapes():
    sd = Net().state_dict()
    sd["b.scale"] = lucid.tensor([1.0, 2.0])
    for strict in (True, False):
        with pytest.raises(RuntimeError, match=r"b\.scale.*\(2,\).*\(3,\)"):
            Net().load_state_dict(sd, strict=strict)


def test_load_state_dict_rejects_non_tensors():
    sd = Net().state_dict()
    sd["head"] = [1.0, 2.0, 3.0]
    with pytest.raises(RuntimeError, match="head"):
        Net().load_state_dict(sd)


def test_load_state_dict_assign_replaces_tensors():
    net = Net()
    net.a.shift.requires_grad_(False)
    sd = {k: lucid.tensor(v) for k, v in Net().state_dict().items()}
    old = net.a.scale
    net.load_state_dict(sd, assign=True)
    assert net.a.scale is not old
    assert isinstance(net.a.scale, Parameter)
    assert net.a.scale._data is sd["a.scale"]._data
    assert net.a.scale.requires_grad and not net.a.shift.requires_grad
    assert net.a.count is sd["a.count"]


# --- modes and conversions
def test_train_eval_propagate():
    net = nn.Sequential(Net(), nn.Sequential(Affine()))
    assert all(m.training for m in net.modules())
    assert net.eval() is net
    assert not any(m.training for m in net.modules())
    net.train()
    assert all(m.training for m in net.modules())
    net.train(False)
    assert not net[1][0].training
    with pytest.raises(ValueError, match="boolean"):
        net.train("yes")


def test_to_dtype_casts_in_place_keeping_identity():
    net = Net()
    before = {n: p for n, p in net.named_parameters()}
    assert net.to(lucid.float64) is net
    for n, p in net.named_parameters():
        assert p is before[n]
        assert p.dtype == lucid.float64 and p.requires_grad
    assert net.a.scratch.dtype == lucid.float64
    assert net.a.count.dtype == lucid.int64  # integer buffers are left alone
    net.head.grad = lucid.tensor([1.0, 2.0, 3.0], dtype=lucid.float64)
    net.float()
    assert net.head.dtype == lucid.float32
    assert net.head.grad.dtype == lucid.float32  # gradients follow their parameter
    net.double()
    assert net.head.dtype == lucid.float64
    net.to("cpu", dtype=lucid.float32)
    assert net.head.dtype == lucid.float32
    net.to(lucid.tensor([1.0], dtype=lucid.float64))
    assert net.head.dtype == lucid.float64


def test_to_validates_device_and_dtype():
    with pytest.raises(ValueError, match="unknown device"):
        Net().to("cuda")
    with pytest.raises(TypeError, match="floating point"):
        Net().to(lucid.int64)


def test_apply_visits_children_first():
    net = Net()
    seen = []
    assert net.apply(lambda m: seen.append(type(m).__name__)) is net
    assert seen == ["Affine", "Affine", "Net"]


def test_backward_fills_grads_and_zero_grad_resets_them():
    net = Net()
    net(lucid.tensor([1.0, 2.0, 3.0])).backward()
    assert all(p.grad is not None for p in net.parameters())
    # d/d head of sum(b(a(x)) * head) = b(a(x))
    a_out = np.array([1.0, 2.0, 3.0]) * np.arange(3) + np.arange(3)
    np.testing.assert_allclose(net.head.grad._data, a_out * np.arange(3) + np.arange(3))
    grad = net.head.grad
    net.zero_grad(set_to_none=False)
    assert net.head.grad is grad
    assert not grad._data.any()
    net.zero_grad()
    assert all(p.grad is None for p in net.parameters())


def test_requires_grad_toggle():
    net = Net()
    net.requires_grad_(False)
    assert not any(p.requires_grad for p in net.parameters())
    net.requires_grad_()
    assert all(p.requires_grad for p in net.parameters())


def test_forward_hooks():
    m = Affine()
    calls = []
    h = m.register_forward_hook(lambda mod, args, out: out * 2)
    pre = m.register_forward_pre_hook(lambda mod, args: calls.append(len(args)))
    x = lucid.tensor([1.0, 1.0, 1.0])
    np.testing.assert_allclose(m(x)._data, 2 * (np.arange(3) + np.arange(3)))
    assert calls == [1]
    h.remove()
    pre.remove()
    np.testing.assert_allclose(m(x)._data, np.arange(3) + np.arange(3))
    assert calls == [1]


def test_missing_forward_raises():
    with pytest.raises(NotImplementedError, match="forward"):
        nn.Module()(1)


def test_repr_nests_children_with_extra_repr():
    net = nn.Sequential(OrderedDict(fc=nn.Linear(2, 3, bias=False), act=nn.ReLU()))
    assert repr(net) == (
        "Sequential(\n  (fc): Linear(in_features=2, out_features=3, bias=False)\n  (act): ReLU()\n)"
    )


def test_deepcopy_is_independent():
    net = Net()
    net.b.scale = net.a.scale
    twin = copy.deepcopy(net)
    assert twin.a.scale is not net.a.scale
    assert twin.b.scale is twin.a.scale  # sharing survives the copy
    twin.head._data[0] = 100.0
    assert net.head._data[0] != 100.0
    assert isinstance(twin.head, Parameter) and twin.head.requires_grad


# --- containers
def test_sequential_indexing_slicing_and_mutation():
    a, b, c = Affine(), Affine(), Affine()
    seq = nn.Sequential(a, b)
    assert len(seq) == 2 and seq[0] is a and seq[-1] is b
    assert list(seq) == [a, b]
    seq.append(c)
    assert seq[2] is c
    sliced = seq[1:]
    assert isinstance(sliced, nn.Sequential) and list(sliced) == [b, c]
    assert sliced[0] is b  # same objects, not copies
    del seq[0]
    assert list(seq) == [b, c] and list(seq._modules) == ["0", "1"]
    seq.insert(0, a)
    assert list(seq) == [a, b, c]
    seq[1] = c
    assert seq[1] is c
    with pytest.raises(IndexError, match="out of range"):
        seq[3]
    x = lucid.tensor([1.0, 2.0, 3.0])
    expected = x._data
    for m in (a, c, c):
        expected = expected * m.scale._data + m.shift._data
    np.testing.assert_allclose(seq(x)._data, expected)


def test_sequential_from_ordered_dict_and_names():
    seq = nn.Sequential(OrderedDict([("first", Affine()), ("second", Affine())]))
    assert [n for n, _ in seq.named_parameters()][:2] == ["first.scale", "first.shift"]
    assert seq.first is seq[0]


def test_module_list():
    ml = nn.ModuleList([Affine(), Affine()])
    ml.append(Affine())
    ml.extend([Affine()])
    ml += [Affine()]
    assert len(ml) == 5
    assert [n for n, _ in ml.named_parameters()][-1] == "4.shift"
    first = ml[0]
    del ml[0]
    assert ml[0] is not first and len(ml) == 4 and list(ml._modules) == ["0", "1", "2", "3"]
    ml.insert(1, first)
    assert ml[1] is first
    assert isinstance(ml[1:3], nn.ModuleList) and len(ml[1:3]) == 2
    with pytest.raises(NotImplementedError):
        ml(1)


def test_module_dict():
    md = nn.ModuleDict({"x": Affine(), "y": Affine()})
    md["z"] = Affine()
    assert list(md) == ["x", "y", "z"] and "y" in md and len(md) == 3
    assert list(md.keys()) == ["x", "y", "z"]
    assert [n for n, _ in md.named_parameters()][0] == "x.scale"
    popped = md.pop("y")
    assert isinstance(popped, Affine) and "y" not in md
    md.update([("w", Affine())])
    assert list(md) == ["x", "z", "w"]
    with pytest.raises(ValueError, match="pair"):
        md.update([Affine()])


def test_parameter_list_and_dict():
    pl = nn.ParameterList([lucid.tensor([1.0]), lucid.tensor([2.0])])
    assert len(pl) == 2 and all(isinstance(p, Parameter) for p in pl)
    pd = nn.ParameterDict({"a": lucid.tensor([1.0])})
    holder = nn.Module()
    holder.pl, holder.pd = pl, pd
    assert [n for n, _ in holder.named_parameters()] == ["pl.0", "pl.1", "pd.a"]


def test_pickle_round_trip_keeps_values_and_types():
    import pickle

    net = Net()
    net.head.grad = lucid.tensor([1.0, 1.0, 1.0])
    twin = pickle.loads(pickle.dumps(net))
    assert isinstance(twin.head, Parameter) and twin.head.requires_grad
    np.testing.assert_array_equal(twin.a.scale._data, net.a.scale._data)
    assert twin.a.count.item() == 0
    x = lucid.tensor([0.5, -1.0, 2.0])
    np.testing.assert_allclose(twin(x)._data, net(x)._data)
