"""A small GPT (nanoGPT's model and sampling loop), trained on a toy corpus and sampled from.

Written as PyTorch code and ported by renaming ``torch`` to ``lucid``: this file with every
``lucid`` renamed ``torch`` is the PyTorch original, and tests/acceptance runs both.

    python examples/gpt.py
"""

import math
from dataclasses import dataclass

import lucid
import lucid.nn as nn
from lucid.nn import functional as F


@dataclass
class GPTConfig:
    block_size: int = 16
    vocab_size: int = 27
    n_layer: int = 2
    n_head: int = 2
    n_embd: int = 32
    dropout: float = 0.0
    bias: bool = True
    flash: bool = True  # F.scaled_dot_product_attention, or the masked softmax written out


class CausalSelfAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        assert config.n_embd % config.n_head == 0
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.attn_dropout = nn.Dropout(config.dropout)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.n_head = config.n_head
        self.n_embd = config.n_embd
        self.dropout = config.dropout
        self.flash = config.flash
        if not self.flash:
            mask = lucid.tril(lucid.ones(config.block_size, config.block_size))
            self.register_buffer("bias", mask.view(1, 1, config.block_size, config.block_size))

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        if self.flash:
            y = F.scaled_dot_product_attention(
                q,
                k,
                v,
                attn_mask=None,
                dropout_p=self.dropout if self.training else 0,
                is_causal=True,
            )
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
            att = F.softmax(att, dim=-1)
            att = self.attn_dropout(att)
            y = att @ v
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        x = x + self.mlp(self.ln_2(x))
        return x


class GPT(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(
            dict(
                wte=nn.Embedding(config.vocab_size, config.n_embd),
                wpe=nn.Embedding(config.block_size, config.n_embd),
                drop=nn.Dropout(config.dropout),
                h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
                ln_f=nn.LayerNorm(config.n_embd, bias=config.bias),
            )
        )
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying
        self.apply(self._init_weights)
        for pn, p in self.named_parameters():
            if pn.endswith("c_proj.weight"):
                lucid.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    def _init_weights(self, module):
        if isinstance(module, nn.Linear):
            lucid.nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                lucid.nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            lucid.nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def get_num_params(self):
        return sum(p.numel() for p in self.parameters())

    def forward(self, idx, targets=None):
        b, t = idx.size()
        assert t <= self.config.block_size, f"sequence of {t} > block size {self.config.block_size}"
        pos = lucid.arange(0, t, dtype=lucid.long, device=idx.device)
        tok_emb = self.transformer.wte(idx)
        pos_emb = self.transformer.wpe(pos)
        x = self.transformer.drop(tok_emb + pos_emb)
        for block in self.transformer.h:
            x = block(x)
        x = self.transformer.ln_f(x)
        if targets is not None:
            logits = self.lm_head(x)
            loss = F.cross_entropy(
                logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1
            )
        else:
            logits = self.lm_head(x[:, [-1], :])  # only the last position is needed to sample
            loss = None
        return logits, loss

    def configure_optimizers(self, weight_decay, learning_rate, betas):
        param_dict = {pn: p for pn, p in self.named_parameters() if p.requires_grad}
        decay_params = [p for n, p in param_dict.items() if p.dim() >= 2]
        nodecay_params = [p for n, p in param_dict.items() if p.dim() < 2]
        optim_groups = [
            {"params": decay_params, "weight_decay": weight_decay},
            {"params": nodecay_params, "weight_decay": 0.0},
        ]
        return lucid.optim.AdamW(optim_groups, lr=learning_rate, betas=betas)


def next_token_probs(model, idx, temperature=1.0, top_k=None):
    """The distribution of the next token: last logits, temperature, top-k filter, softmax."""
    logits, _ = model(idx)
    logits = logits[:, -1, :] / temperature
    if top_k is not None:
        v, _ = lucid.topk(logits, min(top_k, logits.size(-1)))
        logits[logits < v[:, [-1]]] = -float("Inf")
    return F.softmax(logits, dim=-1)


@lucid.no_grad()
def generate(probs_fn, idx, max_new_tokens, block_size):
    """nanoGPT's sampling loop; ``probs_fn(idx)`` gives the next token's distribution."""
    for _ in range(max_new_tokens):
        idx_cond = idx if idx.size(1) <= block_size else idx[:, -block_size:]
        probs = probs_fn(idx_cond)
        idx_next = lucid.multinomial(probs, num_samples=1)
        idx = lucid.cat((idx, idx_next), dim=1)
    return idx


def get_batch(data, block_size, batch_size, generator=None):
    """Random windows of the corpus and the same windows shifted by one (the targets)."""
    ix = lucid.randint(len(data) - block_size, (batch_size,), generator=generator)
    x = lucid.stack([data[i : i + block_size] for i in ix.tolist()])
    y = lucid.stack([data[i + 1 : i + 1 + block_size] for i in ix.tolist()])
    return x, y


def get_lr(it, learning_rate=3e-3, warmup_iters=2, lr_decay_iters=50, min_lr=3e-4):
    """nanoGPT's schedule: linear warmup, then cosine decay down to ``min_lr``."""
    if it < warmup_iters:
        return learning_rate * (it + 1) / (warmup_iters + 1)
    if it > lr_decay_iters:
        return min_lr
    decay_ratio = (it - warmup_iters) / (lr_decay_iters - warmup_iters)
    coeff = 0.5 * (1.0 + math.cos(math.pi * decay_ratio))
    return min_lr + coeff * (learning_rate - min_lr)


def train(model, optimizer, batches, grad_clip=1.0, decay_lr=True):
    """AdamW steps with nanoGPT's learning-rate schedule and gradient clipping; returns the
    losses (floats)."""
    model.train()
    losses = []
    for it, (x, y) in enumerate(batches):
        if decay_lr:
            for param_group in optimizer.param_groups:
                param_group["lr"] = get_lr(it)
        _, loss = model(x, y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        lucid.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        optimizer.step()
        losses.append(loss.item())
    return losses


def encode(text, alphabet=" abcdefghijklmnopqrstuvwxyz"):
    return lucid.tensor([alphabet.index(c) for c in text], dtype=lucid.long)


def decode(tokens, alphabet=" abcdefghijklmnopqrstuvwxyz"):
    return "".join(alphabet[i] for i in tokens)


CORPUS = "the quick brown fox jumps over the lazy dog " * 20


def main(steps=60, compile=True, seed=1337):
    device = "cuda" if lucid.cuda.is_available() else "cpu"
    lucid.manual_seed(seed)
    lucid.set_float32_matmul_precision("high")
    config = GPTConfig()
    model = GPT(config).to(device)
    print(f"{model.get_num_params()} parameters")
    forward = lucid.compile(model) if compile else model
    optimizer = model.configure_optimizers(weight_decay=0.1, learning_rate=3e-3, betas=(0.9, 0.95))
    data = encode(CORPUS).to(device)
    g = lucid.Generator().manual_seed(seed)
    batches = (get_batch(data, config.block_size, 8, generator=g) for _ in range(steps))
    losses = train(forward, optimizer, batches)
    print(f"loss {losses[0]:.3f} -> {losses[-1]:.3f}")
    model.eval()
    prompt = encode(CORPUS[: config.block_size]).view(1, -1).to(device)

    def probs_fn(idx):
        return next_token_probs(forward, idx, temperature=0.8, top_k=5)

    out = generate(lucid.compile(probs_fn) if compile else probs_fn, prompt, 40, config.block_size)
    print(decode(out[0].tolist()))
    return model, losses, out


if __name__ == "__main__":
    main()
