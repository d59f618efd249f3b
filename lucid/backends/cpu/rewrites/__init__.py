"""fuse-kernels: fold small passes over memory into the CPU runtime's larger kernels.

Runs on a native :class:`Program` before ``fuse-elementwise``. Each rewrite replaces a few prim
instructions by one CPU-only instruction that computes the same values in fewer passes:

- ``add(matmul(a, b), bias)`` with ``bias`` of shape ``[N]`` becomes ``gemm(a, b, bias)``: the
  runtime writes the bias rows into the output and lets BLAS accumulate onto them (``beta = 1``),
  which costs what BLAS's own zeroing of the output did, so the separate bias pass is gone (a
  transformer's QKV projection, whose bias add fuses with nothing);
- ``add(gemm(...), r)`` with ``r`` of the output's shape (a residual) becomes ``gemm(..., r)``:
  ``r`` (plus the bias) is written into the output before BLAS accumulates, one pass fewer;
- ``mul(matmul(a, b), c)`` with ``c`` a 0-d constant becomes ``gemm{alpha = c}(a, b)``: the
  attention's ``1/sqrt(d)`` scale and its gradient's, applied by BLAS's ``alpha``;
- attention's per-head operands ``transpose{0,2,1,3}(reshape(slice(qkv)))`` become head views
  of the projection (``a_view``/``b_view`` = [H, D, col0]: BLAS reads each head's [L, D] block
  in place, rows W apart), and a per-head product transposed back and reshaped to [B, L, H*D]
  is written in that order (``c_view``): the slices and transposes, a copy of the activation
  each, are gone;
- a sum of zero pads that tile one axis (plus zero constants) becomes a ``concat`` of the
  padded values (the gradient of a fused QKV projection);
- ``attention(q, k, v)`` (a composite prim op that lowering emits whole) gets the same head
  views (``q_view``, ``k_view``, ``v_view``, ``out_view``): per (batch, head) and block of query
  rows the scores stay in cache between the two products and the softmax. The weights its
  gradient recomputes (``softmax(gemm{alpha}(q, k, transpose_b))`` of the same operands) become
  its second output; attention written out by hand, ``gemm(softmax(gemm{alpha}(q, k,
  transpose_b)), v)``, becomes that instruction too (weights read after the product as its
  second output);
- ``attention_grad(dO, q, k, v, P)`` (a composite prim op too) gets head views of its operands,
  and when its three results, merged back to [B, L, H*D], are concatenated as the fused QKV
  projection's gradient, it writes them into that concatenation's columns (``grad_cols``);
- ``relu`` or ``gelu`` of a gemm's (or float matmul's) product that nothing else reads becomes
  that gemm with ``activation``: Lucid's sgemm applies it to each output tile in registers after
  the bias and addend (OpenBLAS products get it as a pass after the call);
- a ``gelu_grad(dy, x)`` or ``layer_norm_grad(dy, x, gamma)`` (composite prim ops that lowering
  emits whole) takes the column sums of its ``dx``, the bias gradient of the layer before, as a
  further output, in the same pass over the rows.

A rewrite applies only when the values it removes are used nowhere else (not read by another
instruction, not a program result), so the program computes the same values (up to float
rounding).

The rewrites come in families, one module each over the shared queries (``match``): ``gemm``
(epilogues), ``attention`` (head views, padded sums, attention written by hand, the forward's
weights, the gradient's fused write), ``rows`` (the column sums of GELU's and layer norm's
gradients) and ``conv``; their numpy semantics are in ``lucid.backends.cpu.reference``. GELU,
layer norm, attention and their gradients need no matcher: they are composite prim ops
(``lucid.ir.prim.composite``), emitted whole by lowering and run by their kernels.
``half`` folds a half model's casts (and a ReLU/GELU between its roundings) into the gemm, which
reads and writes f16/bf16 itself; ``gemm.mark_shared_operands`` lets products reading one
operand B share its packing within a run.
"""

from __future__ import annotations

from lucid.backends.cpu.program import Instr, Program
from lucid.backends.cpu.rewrites import attention, conv, gemm, half, rows
from lucid.backends.cpu.rewrites.match import Graph

# In order: each entry's comment says why it runs where it does.
REWRITES = (
    gemm.fold_gemm_scale,  # first: a scaled product is then one gemm for the head views
    attention.fold_head_views,
    rows.layer_norm_grad_column_sums,
    rows.gelu_grad_column_sums,
    gemm.fold_gemm_bias,
    gemm.fold_gemm_addend,
    attention.fold_padded_sums,
    attention.fold_attention_grad,  # after fold_padded_sums, whose concat it absorbs
    attention.fold_attention_weights,
    attention.fold_attention,
    gemm.fold_gemm_activation,  # last of the gemm folds: the attention folds match plain gemms
    half.fold_half_activation,  # the half folds match the float32 epilogues' gemms
    half.fold_half_output,
    half.fold_half_operands,  # after the output folds: the next layer reads their half values
    gemm.mark_shared_operands,  # after every fold that changes a product's operands
    conv.fold_conv_bias_relu,
    conv.fold_conv_affine,  # after fold_conv_bias_relu: a folded bias is its chain's first step
    conv.fold_max_pool_relu_grad,
)


def fuse_kernels(program: Program) -> Program:
    """A new program with GEMM epilogues and row kernels folded; the input is left unchanged."""
    out = Program()
    out.slots = list(program.slots)
    out.feeds = list(program.feeds)
    out.results = list(program.results)
    out.inplace = dict(program.inplace)
    instrs: list[Instr | None] = list(program.instrs)
    graph = Graph(out, instrs)
    for rewrite in REWRITES:
        rewrite(graph)
    # Constants the rewrites stopped reading (a folded scale, a zero addend) go.
    for k, ins in graph.each("constant"):
        if not graph.uses[ins.outputs[0]]:
            graph.set(k, None)
    out.instrs = [ins for ins in instrs if ins is not None]
    return out


__all__ = ["REWRITES", "fuse_kernels"]
