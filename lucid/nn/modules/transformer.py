"""``MultiheadAttention``, the Transformer encoder and decoder stacks and ``Transformer``."""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from typing import Any

import numpy as np

import lucid
from lucid._tensor import Tensor
from lucid.nn import functional as F
from lucid.nn import init
from lucid.nn.modules._utils import (
    check_positive_int,
    empty_parameter,
    factory_dtype,
    optional_parameter,
)
from lucid.nn.modules.container import ModuleList
from lucid.nn.modules.dropout import Dropout
from lucid.nn.modules.linear import Linear
from lucid.nn.modules.module import Module
from lucid.nn.modules.normalization import LayerNorm

__all__ = [
    "MultiheadAttention",
    "TransformerEncoderLayer",
    "TransformerEncoder",
    "TransformerDecoderLayer",
    "TransformerDecoder",
    "Transformer",
]


def _additive(mask: Tensor | None, dtype: Any, name: str) -> Tensor | None:
    """A boolean mask (True = masked out, torch's MHA convention) as a float mask of 0 / -inf."""
    if mask is None:
        return None
    if not isinstance(mask, Tensor):
        raise TypeError(f"MultiheadAttention: {name} must be a Tensor, got {type(mask).__name__}")
    if mask.dtype.name == "bool":
        return lucid.where(mask, float("-inf"), 0.0).type(dtype)
    if not mask.dtype.is_floating_point:
        raise TypeError(
            f"MultiheadAttention: only bool and floating {name} are supported, got {mask.dtype}"
        )
    return mask.type(dtype)


def _causal_mask(n_query: int, n_key: int) -> Tensor:
    return Tensor._wrap(np.triu(np.ones((n_query, n_key), dtype=np.bool_), 1))


class MultiheadAttention(Module):
    """Multi-head attention as ``torch.nn.MultiheadAttention`` (same parameter names and packed
    ``in_proj_weight`` layout: rows [0:E] project queries, [E:2E] keys, [2E:3E] values).

    ``forward`` returns ``(output, weights)``; ``weights`` is None unless ``need_weights``, and is
    averaged over heads when ``average_attn_weights``. Boolean masks use torch's MHA convention:
    True marks a position that may NOT be attended. ``is_causal=True`` with no ``attn_mask``
    builds the causal mask.
    """

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        dropout: float = 0.0,
        bias: bool = True,
        add_bias_kv: bool = False,
        add_zero_attn: bool = False,
        kdim: int | None = None,
        vdim: int | None = None,
        batch_first: bool = False,
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        super().__init__()
        check_positive_int(embed_dim, "embed_dim", "MultiheadAttention")
        check_positive_int(num_heads, "num_heads", "MultiheadAttention")
        if embed_dim % num_heads:
            raise ValueError(
                f"MultiheadAttention: embed_dim ({embed_dim}) must be divisible by "
                f"num_heads ({num_heads})"
            )
        if add_bias_kv or add_zero_attn:
            raise ValueError("MultiheadAttention: add_bias_kv and add_zero_attn are not supported")
        if not 0.0 <= dropout <= 1.0:
            raise ValueError(f"dropout probability has to be between 0 and 1, but got {dropout}")
        dt = factory_dtype(device, dtype)
        self.embed_dim, self.num_heads = embed_dim, num_heads
        self.kdim = kdim if kdim is not None else embed_dim
        self.vdim = vdim if vdim is not None else embed_dim
        self._qkv_same_embed_dim = self.kdim == embed_dim and self.vdim == embed_dim
        self.head_dim = embed_dim // num_heads
        self.dropout, self.batch_first = dropout, batch_first
        if self._qkv_same_embed_dim:
            self.in_proj_weight = empty_parameter((3 * embed_dim, embed_dim), dt)
            self.register_parameter("q_proj_weight", None)
            self.register_parameter("k_proj_weight", None)
            self.register_parameter("v_proj_weight", None)
        else:
            self.q_proj_weight = empty_parameter((embed_dim, embed_dim), dt)
            self.k_proj_weight = empty_parameter((embed_dim, self.kdim), dt)
            self.v_proj_weight = empty_parameter((embed_dim, self.vdim), dt)
            self.register_parameter("in_proj_weight", None)
        self.register_parameter("in_proj_bias", optional_parameter((3 * embed_dim,), dt, bias))
        self.out_proj = Linear(embed_dim, embed_dim, bias=bias, dtype=dt)
        self._reset_parameters()

    def _reset_parameters(self) -> None:
        if self._qkv_same_embed_dim:
            init.xavier_uniform_(self.in_proj_weight)
        else:
            init.xavier_uniform_(self.q_proj_weight)
            init.xavier_uniform_(self.k_proj_weight)
            init.xavier_uniform_(self.v_proj_weight)
        if self.in_proj_bias is not None:
            init.zeros_(self.in_proj_bias)
            init.zeros_(self.out_proj.bias)

    def _project(self, query: Tensor, key: Tensor, value: Tensor) -> tuple[Tensor, ...]:
        biases: tuple = (None, None, None)
        if self.in_proj_bias is not None:
            biases = tuple(self.in_proj_bias.chunk(3))
        if self._qkv_same_embed_dim:
            if query is key and key is value:
                qkv = F.linear(query, self.in_proj_weight, self.in_proj_bias)
                return tuple(qkv.chunk(3, -1))
            weights = tuple(self.in_proj_weight.chunk(3))
        else:
            weights = (self.q_proj_weight, self.k_proj_weight, self.v_proj_weight)
        return tuple(
            F.linear(x, w, b) for x, w, b in zip((query, key, value), weights, biases, strict=True)
        )

    def forward(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        key_padding_mask: Tensor | None = None,
        need_weights: bool = True,
        attn_mask: Tensor | None = None,
        average_attn_weights: bool = True,
        is_causal: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        batched = query.ndim == 3
        if query.ndim not in (2, 3) or key.ndim != query.ndim or value.ndim != query.ndim:
            raise ValueError(
                "MultiheadAttention: query, key and value must all be 3-D (batched) or 2-D "
                f"(unbatched), got {query.ndim}-D, {key.ndim}-D and {value.ndim}-D"
            )
        if query.shape[-1] != self.embed_dim:
            raise ValueError(
                f"MultiheadAttention: query's last dim is {query.shape[-1]}, "
                f"expected embed_dim={self.embed_dim}"
            )
        if not batched and key_padding_mask is not None:
            key_padding_mask = key_padding_mask.unsqueeze(0)

        def batch_first(x: Tensor) -> Tensor:
            if not batched:
                return x.unsqueeze(0)
            return x if self.batch_first else x.transpose(0, 1)

        # Work batch-first internally; keep q/k/v identity so self-attention packs one projection.
        q_b = batch_first(query)
        k_b = q_b if key is query else batch_first(key)
        v_b = k_b if value is key else q_b if value is query else batch_first(value)
        query, key, value = q_b, k_b, v_b
        n, n_query, _ = query.shape
        n_key = key.shape[1]
        if key.shape[0] != n or value.shape[0] != n or value.shape[1] != n_key:
            raise ValueError(
                f"MultiheadAttention: key {tuple(key.shape)} and value {tuple(value.shape)} do not "
                f"match query {tuple(query.shape)} (batch-first view)"
            )
        h, hd = self.num_heads, self.head_dim
        q, k, v = self._project(query, key, value)

        def heads(x: Tensor, length: int) -> Tensor:
            return x.reshape(n, length, h, hd).transpose(1, 2)

        q, k, v = heads(q, n_query), heads(k, n_key), heads(v, n_key)
        # With no other mask and no weights wanted, the fused attention applies causality itself.
        sdpa_causal = is_causal and attn_mask is None and key_padding_mask is None
        sdpa_causal = sdpa_causal and not need_weights
        if is_causal and attn_mask is None and not sdpa_causal:
            attn_mask = _causal_mask(n_query, n_key)
        mask = _additive(attn_mask, q.dtype, "attn_mask")
        if mask is not None:
            if mask.ndim == 3:
                mask = mask.reshape(n, h, n_query, n_key)
            elif mask.ndim != 2:
                raise ValueError(
                    f"MultiheadAttention: attn_mask must be 2-D (L, S) or 3-D (N*num_heads, L, S), "
                    f"got shape {tuple(attn_mask.shape)}"
                )
        kpm = _additive(key_padding_mask, q.dtype, "key_padding_mask")
        if kpm is not None:
            if tuple(kpm.shape) != (n, n_key):
                raise ValueError(
                    f"MultiheadAttention: key_padding_mask has shape {tuple(kpm.shape)}, expected "
                    f"{(n, n_key)}"
                )
            kpm = kpm.reshape(n, 1, 1, n_key)
            mask = kpm if mask is None else mask + kpm
        dropout_p = self.dropout if self.training else 0.0
        if need_weights:
            scores = q.matmul(k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
            if mask is not None:
                scores = scores + mask
            weights = F.softmax(scores, -1)
            if dropout_p > 0:
                weights = F.dropout(weights, dropout_p, True)
            out = weights.matmul(v)
        else:
            out = F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=sdpa_causal
            )
            weights = None
        out = self.out_proj(out.transpose(1, 2).reshape(n, n_query, self.embed_dim))
        if not batched:
            out = out.squeeze(0)
        elif not self.batch_first:
            out = out.transpose(0, 1)
        if weights is not None:
            if average_attn_weights:
                weights = weights.mean(1)
            if not batched:
                weights = weights.squeeze(0)
        return out, weights


def _activation(activation: str | Callable) -> Callable:
    if activation == "relu":
        return F.relu
    if activation == "gelu":
        return F.gelu
    if isinstance(activation, str):
        raise ValueError(f"activation should be relu/gelu, not {activation}")
    if not callable(activation):
        raise TypeError(f"activation must be 'relu', 'gelu' or a callable, got {activation!r}")
    return activation


class TransformerEncoderLayer(Module):
    """Self-attention + feed-forward block with residuals and LayerNorm (post-norm by default,
    pre-norm with ``norm_first=True``), parameter names as torch."""

    def __init__(
        self,
        d_model: int,
        nhead: int,
        dim_feedforward: int = 2048,
        dropout: float = 0.1,
        activation: str | Callable = "relu",
        layer_norm_eps: float = 1e-5,
        batch_first: bool = False,
        norm_first: bool = False,
        bias: bool = True,
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        super().__init__()
        kw = {"device": device, "dtype": dtype}
        self.self_attn = MultiheadAttention(
            d_model, nhead, dropout=dropout, bias=bias, batch_first=batch_first, **kw
        )
        self.linear1 = Linear(d_model, dim_feedforward, bias=bias, **kw)
        self.dropout = Dropout(dropout)
        self.linear2 = Linear(dim_feedforward, d_model, bias=bias, **kw)
        self.norm_first = norm_first
        self.norm1 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias, **kw)
        self.norm2 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias, **kw)
        self.dropout1 = Dropout(dropout)
        self.dropout2 = Dropout(dropout)
        self.activation = _activation(activation)

    def _sa_block(
        self, x: Tensor, attn_mask: Tensor | None, key_padding_mask: Tensor | None, is_causal: bool
    ) -> Tensor:
        x = self.self_attn(
            x,
            x,
            x,
            attn_mask=attn_mask,
            key_padding_mask=key_padding_mask,
            need_weights=False,
            is_causal=is_causal,
        )[0]
        return self.dropout1(x)

    def _ff_block(self, x: Tensor) -> Tensor:
        return self.dropout2(self.linear2(self.dropout(self.activation(self.linear1(x)))))

    def forward(
        self,
        src: Tensor,
        src_mask: Tensor | None = None,
        src_key_padding_mask: Tensor | None = None,
        is_causal: bool = False,
    ) -> Tensor:
        x = src
        if self.norm_first:
            x = x + self._sa_block(self.norm1(x), src_mask, src_key_padding_mask, is_causal)
            x = x + self._ff_block(self.norm2(x))
        else:
            x = self.norm1(x + self._sa_block(x, src_mask, src_key_padding_mask, is_causal))
            x = self.norm2(x + self._ff_block(x))
        return x


class TransformerEncoder(Module):
    """A stack of ``num_layers`` deep copies of ``encoder_layer``, then an optional ``norm``."""

    def __init__(
        self,
        encoder_layer: TransformerEncoderLayer,
        num_layers: int,
        norm: Module | None = None,
        enable_nested_tensor: bool = True,
        mask_check: bool = True,
    ) -> None:
        # enable_nested_tensor and mask_check only steer torch's nested-tensor fast path, which
        # Lucid does not have; they are accepted so torch programs construct unchanged.
        super().__init__()
        check_positive_int(num_layers, "num_layers", "TransformerEncoder")
        self.layers = ModuleList([copy.deepcopy(encoder_layer) for _ in range(num_layers)])
        self.num_layers = num_layers
        self.norm = norm

    def forward(
        self,
        src: Tensor,
        mask: Tensor | None = None,
        src_key_padding_mask: Tensor | None = None,
        is_causal: bool = False,
    ) -> Tensor:
        x = src
        for layer in self.layers:
            x = layer(
                x, src_mask=mask, src_key_padding_mask=src_key_padding_mask, is_causal=is_causal
            )
        if self.norm is not None:
            x = self.norm(x)
        return x


class TransformerDecoderLayer(Module):
    """Self-attention, cross-attention over ``memory`` and feed-forward, each with a residual and
    LayerNorm (post-norm by default, pre-norm with ``norm_first=True``), parameter names as
    torch."""

    def __init__(
        self,
        d_model: int,
        nhead: int,
        dim_feedforward: int = 2048,
        dropout: float = 0.1,
        activation: str | Callable = "relu",
        layer_norm_eps: float = 1e-5,
        batch_first: bool = False,
        norm_first: bool = False,
        bias: bool = True,
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        super().__init__()
        kw = {"device": device, "dtype": dtype}
        attn_kw = {"dropout": dropout, "bias": bias, "batch_first": batch_first, **kw}
        self.self_attn = MultiheadAttention(d_model, nhead, **attn_kw)
        self.multihead_attn = MultiheadAttention(d_model, nhead, **attn_kw)
        self.linear1 = Linear(d_model, dim_feedforward, bias=bias, **kw)
        self.dropout = Dropout(dropout)
        self.linear2 = Linear(dim_feedforward, d_model, bias=bias, **kw)
        self.norm_first = norm_first
        self.norm1 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias, **kw)
        self.norm2 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias, **kw)
        self.norm3 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias, **kw)
        self.dropout1 = Dropout(dropout)
        self.dropout2 = Dropout(dropout)
        self.dropout3 = Dropout(dropout)
        self.activation = _activation(activation)

    # The same attribute names as the encoder layer's (self_attn, dropout1), as in PyTorch.
    _sa_block = TransformerEncoderLayer._sa_block

    def _mha_block(
        self,
        x: Tensor,
        memory: Tensor,
        attn_mask: Tensor | None,
        key_padding_mask: Tensor | None,
        is_causal: bool,
    ) -> Tensor:
        x = self.multihead_attn(
            x,
            memory,
            memory,
            attn_mask=attn_mask,
            key_padding_mask=key_padding_mask,
            need_weights=False,
            is_causal=is_causal,
        )[0]
        return self.dropout2(x)

    def _ff_block(self, x: Tensor) -> Tensor:
        return self.dropout3(self.linear2(self.dropout(self.activation(self.linear1(x)))))

    def forward(
        self,
        tgt: Tensor,
        memory: Tensor,
        tgt_mask: Tensor | None = None,
        memory_mask: Tensor | None = None,
        tgt_key_padding_mask: Tensor | None = None,
        memory_key_padding_mask: Tensor | None = None,
        tgt_is_causal: bool = False,
        memory_is_causal: bool = False,
    ) -> Tensor:
        x = tgt
        if self.norm_first:
            x = x + self._sa_block(self.norm1(x), tgt_mask, tgt_key_padding_mask, tgt_is_causal)
            x = x + self._mha_block(
                self.norm2(x), memory, memory_mask, memory_key_padding_mask, memory_is_causal
            )
            x = x + self._ff_block(self.norm3(x))
        else:
            x = self.norm1(x + self._sa_block(x, tgt_mask, tgt_key_padding_mask, tgt_is_causal))
            cross = self._mha_block(
                x, memory, memory_mask, memory_key_padding_mask, memory_is_causal
            )
            x = self.norm2(x + cross)
            x = self.norm3(x + self._ff_block(x))
        return x


class TransformerDecoder(Module):
    """A stack of ``num_layers`` deep copies of ``decoder_layer``, then an optional ``norm``."""

    def __init__(
        self, decoder_layer: TransformerDecoderLayer, num_layers: int, norm: Module | None = None
    ) -> None:
        super().__init__()
        check_positive_int(num_layers, "num_layers", "TransformerDecoder")
        self.layers = ModuleList([copy.deepcopy(decoder_layer) for _ in range(num_layers)])
        self.num_layers = num_layers
        self.norm = norm

    def forward(
        self,
        tgt: Tensor,
        memory: Tensor,
        tgt_mask: Tensor | None = None,
        memory_mask: Tensor | None = None,
        tgt_key_padding_mask: Tensor | None = None,
        memory_key_padding_mask: Tensor | None = None,
        tgt_is_causal: bool | None = None,
        memory_is_causal: bool = False,
    ) -> Tensor:
        x = tgt
        for layer in self.layers:
            x = layer(
                x,
                memory,
                tgt_mask=tgt_mask,
                memory_mask=memory_mask,
                tgt_key_padding_mask=tgt_key_padding_mask,
                memory_key_padding_mask=memory_key_padding_mask,
                tgt_is_causal=bool(tgt_is_causal),
                memory_is_causal=memory_is_causal,
            )
        if self.norm is not None:
            x = self.norm(x)
        return x


class Transformer(Module):
    """The encoder-decoder model of "Attention Is All You Need", as ``torch.nn.Transformer``:
    ``num_encoder_layers`` encoder layers and ``num_decoder_layers`` decoder layers, each stack
    closed by a LayerNorm; matrices are Xavier-uniform initialised."""

    def __init__(
        self,
        d_model: int = 512,
        nhead: int = 8,
        num_encoder_layers: int = 6,
        num_decoder_layers: int = 6,
        dim_feedforward: int = 2048,
        dropout: float = 0.1,
        activation: str | Callable = "relu",
        custom_encoder: Module | None = None,
        custom_decoder: Module | None = None,
        layer_norm_eps: float = 1e-5,
        batch_first: bool = False,
        norm_first: bool = False,
        bias: bool = True,
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        super().__init__()
        kw = {"device": device, "dtype": dtype}
        layer_kw = {
            "dim_feedforward": dim_feedforward,
            "dropout": dropout,
            "activation": activation,
            "layer_norm_eps": layer_norm_eps,
            "batch_first": batch_first,
            "norm_first": norm_first,
            "bias": bias,
            **kw,
        }
        if custom_encoder is not None:
            self.encoder = custom_encoder
        else:
            self.encoder = TransformerEncoder(
                TransformerEncoderLayer(d_model, nhead, **layer_kw),
                num_encoder_layers,
                LayerNorm(d_model, eps=layer_norm_eps, bias=bias, **kw),
            )
        if custom_decoder is not None:
            self.decoder = custom_decoder
        else:
            self.decoder = TransformerDecoder(
                TransformerDecoderLayer(d_model, nhead, **layer_kw),
                num_decoder_layers,
                LayerNorm(d_model, eps=layer_norm_eps, bias=bias, **kw),
            )
        self.d_model, self.nhead, self.batch_first = d_model, nhead, batch_first
        self._reset_parameters()

    def _reset_parameters(self) -> None:
        for p in self.parameters():
            if p.ndim > 1:
                init.xavier_uniform_(p)

    @staticmethod
    def generate_square_subsequent_mask(sz: int, device: Any = None, dtype: Any = None) -> Tensor:
        """A float (sz, sz) causal mask: 0 on and below the diagonal, -inf above it."""
        mask = np.triu(np.full((sz, sz), -np.inf, dtype=np.float64), 1)
        return lucid.tensor(mask, dtype=dtype if dtype is not None else lucid.float32)

    def forward(
        self,
        src: Tensor,
        tgt: Tensor,
        src_mask: Tensor | None = None,
        tgt_mask: Tensor | None = None,
        memory_mask: Tensor | None = None,
        src_key_padding_mask: Tensor | None = None,
        tgt_key_padding_mask: Tensor | None = None,
        memory_key_padding_mask: Tensor | None = None,
        src_is_causal: bool | None = None,
        tgt_is_causal: bool | None = None,
        memory_is_causal: bool = False,
    ) -> Tensor:
        batch_dim = 0 if self.batch_first else 1
        if src.ndim == 3 and tgt.ndim == 3 and src.shape[batch_dim] != tgt.shape[batch_dim]:
            raise RuntimeError("the batch number of src and tgt must be equal")
        if src.shape[-1] != self.d_model or tgt.shape[-1] != self.d_model:
            raise RuntimeError("the feature number of src and tgt must be equal to d_model")
        memory = self.encoder(
            src,
            mask=src_mask,
            src_key_padding_mask=src_key_padding_mask,
            is_causal=bool(src_is_causal),
        )
        return self.decoder(
            tgt,
            memory,
            tgt_mask=tgt_mask,
            memory_mask=memory_mask,
            tgt_key_padding_mask=tgt_key_padding_mask,
            memory_key_padding_mask=memory_key_padding_mask,
            tgt_is_causal=tgt_is_causal,
            memory_is_causal=memory_is_causal,
        )
