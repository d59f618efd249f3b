"""examples/gpt.py: nanoGPT's model, AdamW training with gradient clipping and the top-k sampling
loop run with Lucid, compiled (no graph break, not even at ``logits[mask] = -inf``) as eager, and
as PyTorch runs the same text with ``lucid`` renamed ``torch``."""

import numpy as np
import pytest

import lucid

BLOCK = 16
STEPS = 4


def _batches(module, framework_module, n_steps, seed=0):
    """The same windows of the corpus for every framework (indices drawn by numpy)."""
    data = np.array(module.encode(module.CORPUS).tolist(), dtype=np.int64)
    rng = np.random.default_rng(seed)
    batches = []
    for _ in range(n_steps):
        ix = rng.integers(0, len(data) - BLOCK, size=8)
        x = np.stack([data[i : i + BLOCK] for i in ix])
        y = np.stack([data[i + 1 : i + 1 + BLOCK] for i in ix])
        batches.append((framework_module.tensor(x), framework_module.tensor(y)))
    return batches


def _state(model):
    return {k: np.array(v.detach().numpy()) for k, v in model.state_dict().items()}


def _assert_same_weights(ours, reference, atol):
    """Every weight within ``atol``, except the key projection's bias: attention is invariant
    to it, so its true gradient is 0 and Adam turns rounding-level gradients into updates of
    either sign (bounded by lr * steps)."""
    n_embd = ours["transformer.wte.weight"].shape[1]
    for name, value in ours.items():
        if name.endswith("attn.c_attn.bias"):
            key_bias = slice(n_embd, 2 * n_embd)
            np.testing.assert_allclose(
                value[key_bias], reference[name][key_bias], atol=3e-3 * STEPS
            )
            value, ref = np.delete(value, key_bias), np.delete(reference[name], key_bias)
        else:
            ref = reference[name]
        np.testing.assert_allclose(value, ref, atol=atol, err_msg=name)


def _new_model(gpt, seed=0, **config):
    lucid.manual_seed(seed)
    return gpt.GPT(gpt.GPTConfig(**config))


def _train(gpt, model, forward, n_steps=STEPS):
    opt = model.configure_optimizers(weight_decay=0.1, learning_rate=3e-3, betas=(0.9, 0.95))
    return gpt.train(forward, opt, _batches(gpt, gpt.lucid, n_steps))


@pytest.fixture(scope="module")
def gpt(load_example):
    return load_example("gpt")


@pytest.mark.parametrize("flash", [True, False])
def test_compiled_training_and_sampling_match_eager(gpt, flash):
    eager = _new_model(gpt, flash=flash)
    model = _new_model(gpt, flash=flash)
    forward = lucid.compile(model)
    eager_losses = _train(gpt, eager, eager)
    losses = _train(gpt, model, forward)

    info = forward.cache_info()
    assert info["entries"] == 1 and not info["eager_only"] and not info["reasons"]
    assert list(info["n_calls"].values()) == [STEPS]  # forward and backward compiled each step
    np.testing.assert_allclose(losses, eager_losses, rtol=1e-5)
    assert losses[-1] < losses[0]
    _assert_same_weights(_state(model), _state(eager), atol=1e-5)

    eager.eval()
    model.eval()
    prompt = gpt.encode(gpt.CORPUS[:BLOCK]).view(1, -1)
    probs_fn = lucid.compile(lambda idx: gpt.next_token_probs(forward, idx, 0.8, 5))
    lucid.manual_seed(5)
    out = gpt.generate(probs_fn, prompt, 8, BLOCK)
    lucid.manual_seed(5)
    ref = gpt.generate(lambda idx: gpt.next_token_probs(eager, idx, 0.8, 5), prompt, 8, BLOCK)
    assert out.tolist() == ref.tolist()
    assert out.shape == (1, BLOCK + 8)

    # The top-k filter `logits[logits < v[:, [-1]]] = -inf` compiled: one entry, no fallback.
    info = probs_fn.cache_info()
    assert info["entries"] == 1 and not info["eager_only"] and not info["reasons"]
    assert list(info["n_calls"].values()) == [8]
    probs = probs_fn(prompt)
    assert int((probs > 0).sum()) == 5
    np.testing.assert_allclose(probs.sum().item(), 1.0, rtol=1e-6)


def test_script_main_runs(gpt):
    model, losses, out = gpt.main(steps=6)
    assert len(losses) == 6 and all(np.isfinite(losses))
    assert out.shape == (1, model.config.block_size + 40)
    assert set(gpt.decode(out[0].tolist())) <= set(" abcdefghijklmnopqrstuvwxyz")


def test_tied_weights_survive_training(gpt):
    model = _new_model(gpt)
    assert model.lm_head.weight is model.transformer.wte.weight
    assert model.get_num_params() == sum(p.numel() for p in model.parameters())
    _train(gpt, model, lucid.compile(model), n_steps=1)
    assert model.lm_head.weight is model.transformer.wte.weight


@pytest.mark.parametrize("flash", [True, False])
def test_matches_pytorch(gpt, load_example, flash):
    tgpt = load_example("gpt", "torch")
    torch = tgpt.torch
    ours = _new_model(gpt, flash=flash)
    theirs = tgpt.GPT(tgpt.GPTConfig(flash=flash))
    theirs.load_state_dict({k: torch.from_numpy(v) for k, v in _state(ours).items()})

    losses = _train(gpt, ours, ours)
    opt = theirs.configure_optimizers(weight_decay=0.1, learning_rate=3e-3, betas=(0.9, 0.95))
    ref_losses = tgpt.train(theirs, opt, _batches(tgpt, torch, STEPS))
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-5)
    _assert_same_weights(_state(ours), _state(theirs), atol=1e-5)

    ours.eval()
    theirs.eval()
    prompt = gpt.CORPUS[:BLOCK]
    for temperature, top_k in [(0.8, 5), (1.0, None)]:
        with lucid.no_grad():
            probs = gpt.next_token_probs(ours, gpt.encode(prompt).view(1, -1), temperature, top_k)
        with torch.no_grad():
            ref = tgpt.next_token_probs(theirs, tgpt.encode(prompt).view(1, -1), temperature, top_k)
        np.testing.assert_allclose(probs.numpy(), ref.numpy(), atol=1e-6)
    # top_k=1 leaves one token with probability 1: multinomial then draws it in both frameworks.
    out = gpt.generate(
        lambda idx: gpt.next_token_probs(ours, idx, 1.0, 1),
        gpt.encode(prompt).view(1, -1),
        12,
        BLOCK,
    )
    ref = tgpt.generate(
        lambda idx: tgpt.next_token_probs(theirs, idx, 1.0, 1),
        tgpt.encode(prompt).view(1, -1),
        12,
        BLOCK,
    )
    assert out.tolist() == ref.tolist()


def test_the_renamed_script_is_a_working_pytorch_script(load_example):
    tgpt = load_example("gpt", "torch")
    model, losses, out = tgpt.main(steps=6, compile=False)
    assert len(losses) == 6 and losses[-1] < losses[0]
    assert tuple(out.shape) == (1, model.config.block_size + 40)
