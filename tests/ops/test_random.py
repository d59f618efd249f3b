"""Randomness: the counter-based global state, reproducibility under manual_seed, the random ops'
purity in their (key, counter) operand, distribution sanity, dropout."""

import numpy as np
import pytest

import lucid
from lucid import _random
from lucid._dispatch import apply
from lucid.ops import REGISTRY
from lucid.ops._registry import RANDOM


@pytest.fixture(autouse=True)
def _restore_rng_state():
    saved, seed = lucid.get_rng_state(), lucid.initial_seed()
    yield
    lucid.manual_seed(seed)
    lucid.set_rng_state(saved)


def _draw_all():
    return [
        lucid.rand(3, 2),
        lucid.randn(4),
        lucid.randint(0, 10, (5,)),
        lucid.randperm(6),
        lucid.bernoulli(lucid.full((4,), 0.5)),
        lucid.rand_like(lucid.zeros(2, dtype=lucid.float64)),
        lucid.randn_like(lucid.zeros(2)),
        lucid.ops.random.dropout(lucid.ones(8), 0.5),
        lucid.normal(2.0, 3.0, size=(3,)),
    ]


def test_manual_seed_reproduces_every_front():
    lucid.manual_seed(123)
    first = _draw_all()
    lucid.manual_seed(123)
    second = _draw_all()
    for a, b in zip(first, second, strict=True):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    lucid.manual_seed(124)
    assert not np.array_equal(lucid.rand(10).numpy(), first[0].numpy().ravel()[:10])


def test_consecutive_calls_differ_and_advance_the_counter():
    lucid.manual_seed(0)
    before = lucid.get_rng_state().numpy().copy()
    a, b = lucid.rand(100), lucid.rand(100)
    after = lucid.get_rng_state().numpy()
    assert not np.array_equal(a.numpy(), b.numpy())
    assert after[0] == before[0] and after[1] == before[1] + 2


def test_get_and_set_rng_state_replay():
    lucid.manual_seed(7)
    lucid.randn(3)
    state = lucid.get_rng_state()
    a = lucid.randn(5)
    lucid.set_rng_state(state)
    np.testing.assert_array_equal(lucid.randn(5).numpy(), a.numpy())
    with pytest.raises(ValueError, match="shape"):
        lucid.set_rng_state(lucid.tensor([1, 2, 3]))


def test_seed_and_initial_seed():
    lucid.manual_seed(99)
    assert lucid.initial_seed() == 99
    s = lucid.seed()
    assert lucid.initial_seed() == s and isinstance(s, int)
    lucid.manual_seed(2**64 - 1)  # the full unsigned range is accepted, as torch
    assert lucid.initial_seed() == 2**64 - 1
    with pytest.raises(ValueError, match="64 bits"):
        lucid.manual_seed(2**64)


def test_random_ops_are_pure_functions_of_the_rng_operand():
    rng = lucid.tensor([5, 17])
    a = apply("uniform", rng, shape=(4,), dtype=lucid.float32, low=0.0, high=1.0)
    b = apply("uniform", rng, shape=(4,), dtype=lucid.float32, low=0.0, high=1.0)
    np.testing.assert_array_equal(a.numpy(), b.numpy())
    c = apply("uniform", lucid.tensor([5, 18]), shape=(4,), dtype=lucid.float32)
    d = apply("uniform", lucid.tensor([6, 17]), shape=(4,), dtype=lucid.float32)
    assert not np.array_equal(a.numpy(), c.numpy()) and not np.array_equal(a.numpy(), d.numpy())


def test_random_ops_carry_the_random_property_and_check_the_rng_operand():
    for name in ("uniform", "normal", "randint", "randperm", "bernoulli_mask"):
        assert RANDOM in REGISTRY[name].props
    with pytest.raises(TypeError, match="int64 tensor of shape"):
        apply("uniform", lucid.tensor([1.0, 2.0]), shape=(2,))


def test_fronts_take_the_state_from_a_tracer_that_offers_one():
    class FakeTracer:
        def next_rng(self):
            return lucid.tensor([11, 22])

    from lucid._state import state

    state.tracer = FakeTracer()
    try:
        got = _random.next_rng()
    finally:
        state.tracer = None
    np.testing.assert_array_equal(got.numpy(), [11, 22])


@pytest.mark.parametrize("dtype", [lucid.float32, lucid.float64, lucid.float16])
def test_rand_distribution_and_range(dtype):
    lucid.manual_seed(1)
    x = lucid.rand(100_000, dtype=dtype).numpy().astype(np.float64)
    assert x.min() >= 0.0 and x.max() < 1.0
    assert abs(x.mean() - 0.5) < 0.01 and abs(x.std() - np.sqrt(1 / 12)) < 0.01
    assert lucid.rand(2, dtype=dtype).dtype == dtype


def test_randn_distribution():
    lucid.manual_seed(2)
    x = lucid.randn(100_000).numpy()
    assert x.dtype == np.float32
    assert abs(x.mean()) < 0.02 and abs(x.std() - 1) < 0.02
    y = lucid.normal(3.0, 0.5, size=(100_000,)).numpy()
    assert abs(y.mean() - 3.0) < 0.01 and abs(y.std() - 0.5) < 0.01


def test_randint_bounds_and_coverage():
    lucid.manual_seed(3)
    x = lucid.randint(-3, 4, (100_000,))
    assert x.dtype == lucid.int64
    values = x.numpy()
    assert values.min() == -3 and values.max() == 3
    counts = np.bincount(values + 3)
    assert np.all(np.abs(counts / values.size - 1 / 7) < 0.01)
    assert lucid.randint(5, (2, 3)).shape == (2, 3)
    assert lucid.randint(5, size=(4,)).numpy().max() < 5
    assert lucid.randint(0, 2, (3,), dtype=lucid.float32).dtype == lucid.float32
    with pytest.raises(ValueError, match="low < high"):
        lucid.randint(5, 5, (2,))


def test_randperm_is_a_permutation():
    lucid.manual_seed(4)
    p = lucid.randperm(50)
    assert p.dtype == lucid.int64
    np.testing.assert_array_equal(np.sort(p.numpy()), np.arange(50))
    assert lucid.randperm(0).shape == (0,)


def test_bernoulli_with_tensor_and_scalar_probabilities():
    lucid.manual_seed(5)
    probs = lucid.tensor(np.array([0.0, 1.0, 0.3] * 30_000), dtype=lucid.float32)
    draws = lucid.bernoulli(probs).numpy().reshape(-1, 3)
    assert draws.dtype == np.float32 and set(np.unique(draws)) <= {0.0, 1.0}
    assert draws[:, 0].sum() == 0 and draws[:, 1].min() == 1
    assert abs(draws[:, 2].mean() - 0.3) < 0.01
    assert abs(lucid.bernoulli(lucid.zeros(100_000), p=0.8).numpy().mean() - 0.8) < 0.01


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_bernoulli_mask_keep_rate_and_scale(p):
    x = lucid.zeros(100_000)
    mask = apply("bernoulli_mask", lucid.tensor([1, 2]), x, p=p).numpy()
    kept = mask != 0
    np.testing.assert_allclose(mask[kept], 1 / (1 - p), rtol=1e-6)
    assert abs(kept.mean() - (1 - p)) < 0.01
    assert abs(mask.mean() - 1.0) < 0.03  # the scaling keeps the expectation


def test_dropout_training_and_eval():
    dropout = lucid.ops.random.dropout
    x = lucid.ones(10_000)
    assert dropout(x, 0.3, training=False) is x
    assert dropout(x, 0.0) is x
    np.testing.assert_array_equal(dropout(x, 1.0).numpy(), np.zeros(10_000))
    y = dropout(x, 0.3).numpy()
    np.testing.assert_allclose(np.unique(y), [0.0, 1 / 0.7], rtol=1e-6)
    for bad in (-0.1, 1.5):
        with pytest.raises(ValueError, match="between 0 and 1"):
            dropout(x, bad)
    assert "dropout" in lucid.ops.random.__all__


def test_dropout_gradient_uses_the_same_mask():
    x = lucid.tensor(np.linspace(1, 2, 50), dtype=lucid.float64, requires_grad=True)
    y = lucid.ops.random.dropout(x, 0.4)
    y.sum().backward()
    mask = y.detach().numpy() / x.detach().numpy()
    np.testing.assert_allclose(x.grad.numpy(), mask)


def test_dropout_inplace():
    x = lucid.ones(1000)
    ident = id(x)
    out = lucid.ops.random.dropout(x, 0.5, inplace=True)
    assert out is x and id(x) == ident
    assert 0 < (x.numpy() == 0).sum() < 1000


def test_inplace_random_fills():
    lucid.manual_seed(6)
    t = lucid.zeros(50_000)
    version = t._version_count
    assert t.normal_(2.0, 0.5) is t and t._version_count == version + 1
    assert abs(t.numpy().mean() - 2.0) < 0.02
    t.uniform_(-1.0, 3.0)
    assert t.numpy().min() >= -1.0 and t.numpy().max() < 3.0
    assert abs(t.numpy().mean() - 1.0) < 0.03
    t.bernoulli_(0.25)
    assert abs(t.numpy().mean() - 0.25) < 0.01
    t.random_(0, 4)
    assert set(np.unique(t.numpy())) == {0.0, 1.0, 2.0, 3.0}
    with pytest.raises(TypeError, match="floating point"):
        lucid.zeros(3, dtype=lucid.int64).normal_()


def test_inplace_random_fill_on_non_leaf_gives_zero_gradient_to_old_value():
    x = lucid.tensor([1.0, 2.0], dtype=lucid.float64, requires_grad=True)
    y = x * 2.0
    y.uniform_()
    (y + x).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [1.0, 1.0])


def test_random_factories_options():
    assert lucid.rand(2, requires_grad=True).requires_grad
    assert lucid.randn((2, 3), dtype=lucid.float64).dtype == lucid.float64
    assert lucid.rand(size=(4,)).shape == (4,)
    with pytest.raises(TypeError, match="floating point"):
        lucid.rand(2, dtype=lucid.int64)
    with pytest.raises(ValueError, match="unknown device"):
        lucid.randn(2, device="gpu")


# Known-answer vectors of Philox-4x32-10 (Random123's kat_vectors): counter words c0..c3, key words
# k0, k1 -> output words.
PHILOX_KAT = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((2**32 - 1,) * 4, (2**32 - 1,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    (
        (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344),
        (0xA4093822, 0x299F31D0),
        (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1),
    ),
]


@pytest.mark.parametrize("counter,key,expected", PHILOX_KAT)
def test_philox_matches_known_answers(counter, key, expected):
    block = counter[1] << 32 | counter[0]
    ctr = counter[3] << 32 | counter[2]
    got = _random.philox4x32(np.array([block], dtype=np.uint64), key[1] << 32 | key[0], ctr)
    assert tuple(int(w) for w in got[0]) == expected


def test_stream_layout_word_i_is_lane_i_mod_4_of_block_i_div_4():
    rng = np.array([99, -3], dtype=np.int64)
    words = _random.random_words(rng, 10)
    key, ctr = 99, (-3) & (2**64 - 1)
    blocks = _random.philox4x32(np.arange(3, dtype=np.uint64), key, ctr)
    np.testing.assert_array_equal(words, blocks.reshape(-1)[:10])


def test_float32_uniforms_use_24_bits_and_float64_use_53():
    rng = np.array([1, 2], dtype=np.int64)
    u32 = _random.uniform01(rng, 1000, double=False)
    np.testing.assert_array_equal(u32 * 2**24, np.floor(u32 * 2**24))
    u64 = _random.uniform01(rng, 1000, double=True)
    assert np.mean(u64 * 2**24 != np.floor(u64 * 2**24)) > 0.99


@pytest.mark.parametrize("dtype,prim_dtype", [(lucid.float32, "f32"), (lucid.float64, "f64")])
def test_eager_draws_equal_the_backend_reference_stream(dtype, prim_dtype):
    prim_ops = pytest.importorskip("lucid.ir.prim")
    state = np.array([2024, 5], dtype=np.int64)
    attrs = {"shape": (3, 5), "dtype": prim_dtype, "low": -1.0, "high": 2.0}
    eager = apply("uniform", lucid.tensor(state), shape=(3, 5), dtype=dtype, low=-1.0, high=2.0)
    ref = prim_ops._random_uniform_ref([state], attrs)[0].astype(dtype.numpy)
    np.testing.assert_array_equal(eager.numpy(), ref)
    attrs = {"shape": (7,), "dtype": prim_dtype, "mean": 1.0, "std": 2.0}
    eager = apply("normal", lucid.tensor(state), shape=(7,), dtype=dtype, mean=1.0, std=2.0)
    ref = prim_ops._random_normal_ref([state], attrs)[0].astype(dtype.numpy)
    np.testing.assert_allclose(eager.numpy(), ref, rtol=1e-12)


def test_randint_over_a_range_wider_than_float64_precision():
    x = apply("randint", lucid.tensor([8, 9]), shape=(50_000,), low=-(2**62), high=2**62)
    values = x.numpy()
    assert values.min() >= -(2**62) and values.max() < 2**62
    assert values.min() < -(2**61) and values.max() > 2**61  # spread over the whole range


_GENERATOR_DRAWS = {
    "rand": lambda g: lucid.rand(3, 2, generator=g),
    "randn": lambda g: lucid.randn(4, generator=g, dtype=lucid.float64),
    "randint": lambda g: lucid.randint(0, 10, (5,), generator=g),
    "randint_high_only": lambda g: lucid.randint(7, (6,), generator=g),
    "randperm": lambda g: lucid.randperm(6, generator=g),
    "normal": lambda g: lucid.normal(2.0, 3.0, size=(3,), generator=g),
    "bernoulli": lambda g: lucid.bernoulli(lucid.full((4,), 0.5), generator=g),
    "multinomial": lambda g: lucid.multinomial(lucid.ones(2, 5), 3, generator=g),
    "normal_": lambda g: lucid.zeros(3).normal_(1.0, 2.0, generator=g),
    "uniform_": lambda g: lucid.zeros(3).uniform_(-1.0, 1.0, generator=g),
    "random_": lambda g: lucid.zeros(4).random_(0, 9, generator=g),
    "bernoulli_": lambda g: lucid.zeros(4).bernoulli_(0.3, generator=g),
    "init.normal_": lambda g: lucid.nn.init.normal_(lucid.zeros(3), 0.0, 1.0, generator=g),
    "init.uniform_": lambda g: lucid.nn.init.uniform_(lucid.zeros(3), generator=g),
    "init.kaiming_uniform_": lambda g: lucid.nn.init.kaiming_uniform_(
        lucid.zeros(3, 4), generator=g
    ),
    "init.trunc_normal_": lambda g: lucid.nn.init.trunc_normal_(lucid.zeros(5), generator=g),
    "init.orthogonal_": lambda g: lucid.nn.init.orthogonal_(lucid.zeros(3, 3), generator=g),
}


@pytest.mark.parametrize("name", sorted(_GENERATOR_DRAWS))
def test_generator_argument_draws_from_that_generator_alone(name):
    """``generator=`` as in torch: the draw comes from the generator's stream (the same numbers
    as the global stream after ``manual_seed`` with its seed), and the global stream stays put."""
    draw = _GENERATOR_DRAWS[name]
    lucid.manual_seed(11)
    expected = draw(None).tolist()
    lucid.manual_seed(99)
    global_state = lucid.get_rng_state().tolist()
    g = lucid.Generator().manual_seed(11)
    assert draw(g).tolist() == expected
    assert lucid.get_rng_state().tolist() == global_state
    assert draw(g).tolist() != expected or name.startswith(("bernoulli", "multinomial"))


def test_generator_argument_must_be_a_lucid_generator():
    with pytest.raises(TypeError, match=r"randn\(\): generator must be a lucid.Generator"):
        lucid.randn(3, generator=np.random.default_rng(0))
    with pytest.raises(TypeError, match=r"normal_\(\): generator must be a lucid.Generator"):
        lucid.zeros(3).normal_(generator=0)
