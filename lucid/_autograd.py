"""Reverse-mode autograd over the op registry's VJP rules."""

from __future__ import annotations

import threading
import weakref
from collections.abc import Sequence
from typing import Any

from lucid._state import autocast_suspended, state
from lucid.ops._registry import OpDef, VJPContext


class Node:
    """One recorded op application: the backward graph's vertex (``tensor.grad_fn``)."""

    __slots__ = (
        "op",
        "operands",
        "attrs",
        "inputs",
        "edges",
        "versions",
        "outputs",
        "out_meta",
        "released",
    )

    def __init__(self, op: OpDef, operands: tuple, attrs: dict, inputs: list):
        self.op = op
        self.operands = operands
        self.attrs = attrs
        self.inputs = inputs  # flat list of operands (Tensors or scalars)
        # Per input, its (grad_fn, output index, requires_grad) when this op ran: an in-place op
        # later rebases the tensor's own history, but gradients of this op must still reach the
        # history the value had when it was read (``y[0] = y[1] * 3``).
        self.edges = [
            (x._node, x._out_idx, x._requires_grad) if hasattr(x, "_node") else (None, 0, False)
            for x in inputs
        ]
        self.versions: list = []
        self.outputs: list = []
        self.out_meta: list = []
        self.released = False

    @property
    def name(self) -> str:
        return "".join(p.capitalize() for p in self.op.name.split("_")) + "Backward"

    def __repr__(self) -> str:
        return f"<{self.name}>"

    @classmethod
    def attach(cls, op: OpDef, operands: tuple, attrs: dict, outs: list) -> None:
        if not op.differentiable:
            return
        flat = [*operands[:-1], *operands[-1]] if op.variadic else list(operands)
        node = cls(op, operands, attrs, flat)
        if op.saves_inputs:
            node.versions = [(x, x._version[0]) for x in flat if hasattr(x, "_version")]
        for i, t in enumerate(outs):
            node.out_meta.append((t._data, t._version))
            node.outputs.append(weakref.ref(t))
            if t.dtype.is_floating_point:
                t._node, t._out_idx, t._requires_grad = node, i, True
        if op.saves_outputs:
            node.versions += [(t, t._version[0]) for t in outs]

    def saves(self, tensor) -> bool:
        return self.op.saves_inputs and any(x is tensor for x in self.inputs)

    def resave(self, tensor) -> None:
        self.versions = [(x, x._version[0] if x is tensor else v) for x, v in self.versions]

    def set_output(self, idx: int, tensor) -> None:
        self.outputs[idx] = weakref.ref(tensor)
        self.out_meta[idx] = (tensor._data, tensor._version)

    def output_tensors(self) -> list:
        from lucid._tensor import Tensor

        outs = []
        for ref, (data, version) in zip(self.outputs, self.out_meta, strict=True):
            t = ref()
            if t is None:
                t = Tensor._wrap(data)
                t._version = version
            outs.append(t)
        return outs

    def check_versions(self) -> None:
        for t, v in self.versions:
            if t._version[0] != v:
                raise RuntimeError(
                    f"one of the tensors needed for gradient computation has been modified by an "
                    f"in-place operation: {self.op.name}'s saved tensor of shape {tuple(t.shape)} "
                    f"is at version {t._version[0]}, expected version {v}"
                )


class _GradMode:
    """Base of the grad-mode switches: a context manager, and a decorator running the function
    (or each resumption of a generator function) under the mode.

    ``with lucid.no_grad():`` sits on hot inference paths, so entering and leaving is kept to a
    few attribute accesses: ``__slots__``, no ``__init__``, and the saved modes kept as a linked
    tuple (one allocation per ``__enter__``) so that one instance can still be entered again
    while it is active."""

    __slots__ = ("_saved",)

    def clone(self) -> _GradMode:
        """A fresh switch with the same mode (each decorated call enters its own)."""
        return type(self)()

    def __call__(self, fn):
        import functools
        import inspect

        if not callable(fn):
            raise TypeError(f"{type(self).__name__} decorates a callable, got {type(fn).__name__}")
        if inspect.isgeneratorfunction(fn):

            @functools.wraps(fn)
            def generator(*a, **k):
                gen = fn(*a, **k)
                sent = None
                while True:
                    try:
                        with self.clone():
                            item = gen.send(sent)
                    except StopIteration as stop:
                        return stop.value
                    sent = yield item

            return generator

        @functools.wraps(fn)
        def wrapper(*a, **k):
            with self.clone():
                return fn(*a, **k)

        return wrapper


class _BareDecoratable(_GradMode):
    """A switch that also works as a bare decorator: ``@no_grad`` as well as ``@no_grad()``.

    Subclasses set gradient recording to their fixed ``_grad_mode`` and leave the inference flag
    alone (a block that nests properly leaves it as it found it), so only ``grad_enabled`` is
    saved."""

    __slots__ = ()
    _grad_mode: bool

    def __enter__(self):
        self._saved = (state.grad_enabled, self._saved)
        state.grad_enabled = self._grad_mode
        return self

    def __exit__(self, exc_type, exc, tb):
        state.grad_enabled, self._saved = self._saved

    def __new__(cls, orig_func=None):
        if orig_func is None:
            switch = object.__new__(cls)
            switch._saved = None
            return switch
        if not callable(orig_func):
            raise TypeError(
                f"{cls.__name__}() takes no arguments (or a function to decorate), "
                f"got {type(orig_func).__name__}"
            )
        return cls()(orig_func)


class no_grad(_BareDecoratable):  # noqa: N801  (torch.no_grad)
    """Disable gradient recording on this thread: ``with lucid.no_grad():``, ``@lucid.no_grad``
    or ``@lucid.no_grad()``."""

    __slots__ = ()
    _grad_mode = False


class enable_grad(_BareDecoratable):  # noqa: N801  (torch.enable_grad)
    """Enable gradient recording on this thread (inside a ``no_grad`` block, say); a context
    manager and a decorator, bare or called."""

    __slots__ = ()
    _grad_mode = True


class inference_mode(_GradMode):  # noqa: N801  (torch.inference_mode)
    """``no_grad`` for inference code: ``with lucid.inference_mode():``, ``@lucid.inference_mode``
    or ``@lucid.inference_mode()``. ``inference_mode(False)`` switches it off again (and enables
    gradients, as torch's). ``lucid.is_inference_mode_enabled()`` tells whether it is on.

    Lucid tensors carry no inference flag: the mode disables gradient recording, like torch's,
    and nothing else.
    """

    __slots__ = ("_mode",)

    def __new__(cls, mode=True):
        if not isinstance(mode, bool):
            if not callable(mode):
                raise TypeError(f"inference_mode: mode must be a bool, got {type(mode).__name__}")
            return cls()(mode)
        switch = object.__new__(cls)
        switch._mode = mode
        switch._saved = None
        return switch

    def __enter__(self):
        self._saved = (state.grad_enabled, state.inference_mode, self._saved)
        state.grad_enabled = not self._mode
        state.inference_mode = self._mode
        return self

    def __exit__(self, exc_type, exc, tb):
        state.grad_enabled, state.inference_mode, self._saved = self._saved

    def clone(self) -> inference_mode:
        return type(self)(self._mode)


class set_grad_enabled(_GradMode):  # noqa: N801  (torch.set_grad_enabled)
    """Set gradient recording on this thread to ``mode``, at once (as a plain call) and until the
    end of the ``with`` block when used as a context manager; also a decorator."""

    __slots__ = ("_mode",)

    def __init__(self, mode: bool) -> None:
        if not isinstance(mode, bool):
            raise TypeError(f"set_grad_enabled: mode must be a bool, got {type(mode).__name__}")
        self._mode = mode
        self._saved = (state.grad_enabled, state.inference_mode)
        state.grad_enabled = mode

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        state.grad_enabled, state.inference_mode = self._saved

    def clone(self) -> _GradMode:
        return enable_grad() if self._mode else no_grad()

    def __call__(self, fn):
        # Used as a decorator the call above already switched the mode: undo it, as torch does.
        state.grad_enabled, state.inference_mode = self._saved
        return super().__call__(fn)


def _topo_order(roots: list[Node]) -> list[Node]:
    """Nodes reachable from ``roots``, every node before the nodes of its inputs."""
    order: list[Node] = []
    seen: set[int] = set()
    for root in roots:
        if id(root) in seen:
            continue
        seen.add(id(root))
        stack = [(root, iter(root.edges))]
        while stack:
            node, it = stack[-1]
            for child, _, _ in it:
                if child is not None and id(child) not in seen:
                    seen.add(id(child))
                    stack.append((child, iter(child.edges)))
                    break
            else:
                stack.pop()
                order.append(node)
    order.reverse()
    return order


def _accumulate(a, b):
    return b if a is None else a + b


def _reduce_to(g, tensor):
    shape = tuple(tensor.shape)
    if tuple(g.shape) != shape:
        from lucid._dispatch import apply

        g = apply("sum_to_size", g, shape=shape)
    if g.dtype is not tensor.dtype:
        g = g.type(tensor.dtype)
    return g


def run_backward(
    roots: Sequence,
    grads: Sequence,
    retain_graph: bool,
    create_graph: bool,
    capture: list | None = None,
    accumulate: bool = True,
) -> list | None:
    """The engine. ``capture``: tensors whose gradients are returned instead of accumulated."""
    captured: dict[Any, Any] = {}
    cap_leaf = {id(t): i for i, t in enumerate(capture or []) if t._node is None}
    cap_out = {
        (id(t._node), t._out_idx): i for i, t in enumerate(capture or []) if t._node is not None
    }
    pending: dict[int, list] = {}
    root_nodes = []

    def deliver_leaf(t, g):
        if capture is not None:
            i = cap_leaf.get(id(t))
            if i is not None:
                captured[i] = _accumulate(captured.get(i), g)
            return
        if not t._requires_grad:
            return
        if not create_graph:
            g = g.detach()
        t._grad = (
            g if t._grad is None else (t._grad + g if create_graph else (t._grad + g).detach())
        )
        if hook_uses is not None and _POST_ACCUMULATE_HOOKS in t.__dict__:
            _count_down_hooks(t, hook_uses, fired)

    hook_uses = None
    for r, g in zip(roots, grads, strict=True):
        if r._node is None:
            deliver_leaf(r, _reduce_to(g, r))
        else:
            slot = pending.setdefault(id(r._node), [None] * len(r._node.outputs))
            slot[r._out_idx] = _accumulate(slot[r._out_idx], g)
            root_nodes.append(r._node)

    order = _topo_order(root_nodes)
    # Post-accumulate-grad hooks fire once per leaf, after its last gradient of this backward.
    hook_uses = _leaf_hook_uses(order) if _hooked_tensors[0] and capture is None else None
    fired: dict[int, Any] = {}
    with set_grad_enabled(bool(create_graph)), autocast_suspended():
        for node in order:
            gouts = pending.pop(id(node), None)
            if gouts is None:
                continue
            if node.released:
                raise RuntimeError(
                    "trying to backward through the graph a second time (or to use saved tensors "
                    "after they were freed); pass retain_graph=True to the first backward"
                )
            if capture is not None:
                for i, g in enumerate(gouts):
                    j = cap_out.get((id(node), i))
                    if j is not None and g is not None:
                        captured[j] = _accumulate(captured.get(j), g)
            outs = node.output_tensors()
            for i in range(len(outs)):
                ref = node.outputs[i]()
                if (
                    ref is not None
                    and ref._retains_grad
                    and gouts[i] is not None
                    and capture is None
                ):
                    ref._grad = _accumulate(ref._grad, gouts[i].detach())
            if node.op.vjp is None:
                raise RuntimeError(
                    f"op {node.op.name!r} has no VJP rule; its gradient cannot be computed"
                )
            node.check_versions()
            if any(g is None for g in gouts):
                from lucid._dispatch import apply

                gouts = [
                    apply("zeros_like", o) if g is None else g
                    for g, o in zip(gouts, outs, strict=True)
                ]
            needs = tuple(need for _, _, need in node.edges)
            ctx = VJPContext(node.operands, outs, node.attrs, needs)
            gins = node.op.vjp(ctx, *gouts)
            if node.op.variadic:
                gins = [*gins[:-1], *gins[-1]]
            if len(gins) != len(node.inputs):
                raise RuntimeError(
                    f"VJP rule of {node.op.name!r} returned {len(gins)} gradients for "
                    f"{len(node.inputs)} operands"
                )
            for i, (x, g, (child, out_idx, need)) in enumerate(
                zip(node.inputs, gins, node.edges, strict=True)
            ):
                if g is None or not need:
                    if need:
                        _check_no_grad(node.op, i)
                    continue
                g = _reduce_to(g, x)
                if child is None:
                    deliver_leaf(x, g)
                else:
                    slot = pending.setdefault(id(child), [None] * len(child.outputs))
                    slot[out_idx] = _accumulate(slot[out_idx], g)
            if not retain_graph:
                node.released = True
    if hook_uses is not None:
        _finish_hooks(hook_uses, fired)
    if capture is not None:
        return [captured.get(i) for i in range(len(capture))]
    return None


# --- hooks: Tensor.register_post_accumulate_grad_hook and queue_callback (what DDP needs) ---

_POST_ACCUMULATE_HOOKS = "_post_accumulate_grad_hooks"
_hooked_tensors = [0]  # how many tensors ever got a hook: the engine skips the bookkeeping at 0
_final_callbacks = threading.local()  # per thread: backward runs on the caller's thread


def register_post_accumulate_grad_hook(tensor, hook) -> Any:
    """``hook(tensor)`` runs once per backward, after ``tensor.grad`` received its last
    gradient of that backward (a leaf only). Returns a handle with ``remove()``."""
    if tensor._node is not None:
        raise RuntimeError("post accumulate grad hooks cannot be registered on non-leaf tensors")
    if not callable(hook):
        raise TypeError(f"hook must be callable, got {type(hook).__name__}")
    hooks = tensor.__dict__.setdefault(_POST_ACCUMULATE_HOOKS, {})
    key = object()
    hooks[key] = hook
    _hooked_tensors[0] += 1
    return _HookHandle(hooks, key)


class _HookHandle:
    def __init__(self, hooks: dict, key: object):
        self._hooks, self._key = hooks, key

    def remove(self) -> None:
        self._hooks.pop(self._key, None)


def queue_callback(callback) -> None:
    """Run ``callback()`` when the current backward has delivered every gradient (PyTorch's
    ``Variable._execution_engine.queue_callback``); only callable from a hook."""
    _final_callbacks.__dict__.setdefault("queue", []).append(callback)


def _leaf_hook_uses(order: list[Node]) -> dict[int, list]:
    """Per hooked leaf: [tensor, how many gradients this backward will deliver to it]."""
    uses: dict[int, list] = {}
    for node in order:
        for x, (child, _, need) in zip(node.inputs, node.edges, strict=True):
            if child is None and need and x.__dict__.get(_POST_ACCUMULATE_HOOKS):
                uses.setdefault(id(x), [x, 0])[1] += 1
    return uses


def _count_down_hooks(t, hook_uses: dict, fired: dict) -> None:
    entry = hook_uses.get(id(t))
    if entry is None:
        return
    entry[1] -= 1
    fired.setdefault(id(t), False)
    if entry[1] <= 0:
        fired[id(t)] = True
        for hook in list(t.__dict__[_POST_ACCUMULATE_HOOKS].values()):
            hook(t)


def _finish_hooks(hook_uses: dict, fired: dict) -> None:
    """Fire the hooks of leaves whose expected gradients did not all arrive (a branch whose
    output gradient was never produced), then the queued callbacks."""
    for key, done in list(fired.items()):
        if not done:
            t = hook_uses[key][0]
            for hook in list(t.__dict__[_POST_ACCUMULATE_HOOKS].values()):
                hook(t)
    for callback in _final_callbacks.__dict__.pop("queue", []):
        callback()


def _check_no_grad(op, i: int) -> None:
    """A registry op's VJP gave no gradient for operand ``i``, which requires grad: allowed only
    when the op declares it (``OpDef.no_grad_operands``). Custom ops (autograd.Function, compiled
    calls) may return None, as torch allows."""
    from lucid.ops import REGISTRY

    if REGISTRY.get(op.name) is not op:
        return
    name = op.operand_name(i)
    if name not in op.no_grad_operands:
        raise RuntimeError(
            f"op {op.name!r} computes no gradient for its operand {name!r}, which requires grad"
        )


def _default_grads(roots, grads):
    from lucid._tensor import Tensor

    if grads is None:
        grads = [None] * len(roots)
    out = []
    for r, g in zip(roots, grads, strict=True):
        if not isinstance(r, Tensor):
            raise TypeError(f"backward needs Tensors, got {type(r).__name__}")
        if not r._requires_grad:
            raise RuntimeError(
                "element 0 of tensors does not require grad and does not have a grad_fn"
            )
        if g is None:
            if r.ndim != 0 and r.numel() != 1:
                raise RuntimeError(
                    f"grad can be implicitly created only for scalar outputs; got shape "
                    f"{tuple(r.shape)}: pass gradient= with the same shape"
                )
            from lucid._dispatch import apply

            g = apply("ones_like", r)
        elif not isinstance(g, Tensor):
            g = Tensor(g, dtype=r.dtype)
        elif tuple(g.shape) != tuple(r.shape):
            raise RuntimeError(
                f"gradient has shape {tuple(g.shape)} but the output has {tuple(r.shape)}"
            )
        out.append(g)
    return out


def backward(tensors, grad_tensors=None, retain_graph=None, create_graph=False, inputs=None):
    """Accumulate gradients of ``tensors`` into the ``.grad`` of the leaves."""
    from lucid._tensor import Tensor

    if isinstance(tensors, Tensor):
        tensors = [tensors]
    if isinstance(grad_tensors, Tensor):
        grad_tensors = [grad_tensors]
    grads = _default_grads(list(tensors), grad_tensors)
    if retain_graph is None:
        retain_graph = create_graph
    if inputs is not None:
        inputs = [inputs] if isinstance(inputs, Tensor) else list(inputs)
        got = run_backward(list(tensors), grads, retain_graph, create_graph, capture=inputs)
        for t, g in zip(inputs, got, strict=True):
            if g is not None:
                t._grad = g if t._grad is None else t._grad + g
        return
    run_backward(list(tensors), grads, retain_graph, create_graph)


def grad(
    outputs, inputs, grad_outputs=None, retain_graph=None, create_graph=False, allow_unused=False
):
    """Gradients of ``outputs`` with respect to ``inputs``, returned (not accumulated)."""
    from lucid._tensor import Tensor

    outputs = [outputs] if isinstance(outputs, Tensor) else list(outputs)
    single = isinstance(inputs, Tensor)
    inputs = [inputs] if single else list(inputs)
    if isinstance(grad_outputs, Tensor):
        grad_outputs = [grad_outputs]
    for t in inputs:
        if not t._requires_grad:
            raise RuntimeError("one of the inputs does not require grad")
    grads = _default_grads(outputs, grad_outputs)
    if retain_graph is None:
        retain_graph = create_graph
    got = run_backward(outputs, grads, retain_graph, create_graph, capture=inputs)
    for i, g in enumerate(got):
        if g is None and not allow_unused:
            raise RuntimeError(
                f"input {i} was not used in the graph; pass allow_unused=True to get None for it"
            )
    return tuple(got)


class FunctionCtx:
    """The ``ctx`` of a custom ``autograd.Function``."""

    def __init__(self):
        self.saved_tensors: tuple = ()
        self.needs_input_grad: tuple = ()
        self._non_differentiable: set[int] = set()

    def save_for_backward(self, *tensors) -> None:
        self.saved_tensors = tensors

    def mark_non_differentiable(self, *tensors) -> None:
        self._non_differentiable.update(id(t) for t in tensors)


class Function:
    """A custom differentiable function, as ``torch.autograd.Function``.

    >>> class Square(lucid.autograd.Function):
    ...     @staticmethod
    ...     def forward(ctx, x): ctx.save_for_backward(x); return x * x
    ...     @staticmethod
    ...     def backward(ctx, g): (x,) = ctx.saved_tensors; return 2 * x * g
    """

    @staticmethod
    def forward(ctx, *args, **kwargs):
        raise NotImplementedError("a Function subclass must define forward")

    @staticmethod
    def backward(ctx, *grads):
        raise NotImplementedError("a Function subclass must define backward")

    @classmethod
    def apply(cls, *args):
        from lucid._tensor import Tensor

        if state.tracer is not None:
            return state.tracer.graph_break(f"custom autograd.Function {cls.__name__}", None)
        ctx = FunctionCtx()
        tensor_args = [a for a in args if isinstance(a, Tensor)]
        ctx.needs_input_grad = tuple(isinstance(a, Tensor) and a._requires_grad for a in args)
        with no_grad():
            result = cls.forward(ctx, *args)
        single = isinstance(result, Tensor)
        outs = [result] if single else list(result)
        if state.grad_enabled and any(t._requires_grad for t in tensor_args):
            saved = [t for t in ctx.saved_tensors if isinstance(t, Tensor)]
            versions = [(t, t._version[0]) for t in saved]

            def vjp(vctx, *gs):
                grads = cls.backward(ctx, *gs)
                if not isinstance(grads, tuple):
                    grads = (grads,)
                if len(grads) != len(args):
                    raise RuntimeError(
                        f"{cls.__name__}.backward returned {len(grads)} gradients for "
                        f"{len(args)} inputs"
                    )
                return [g for g, a in zip(grads, args, strict=True) if isinstance(a, Tensor)]

            op = OpDef(
                name=cls.__name__,
                operands=tuple(f"x{i}" for i in range(len(tensor_args))),
                infer=lambda *a: None,
                kernel=lambda *a: None,
                vjp=vjp,
                n_outputs=len(outs),
                saves_inputs=False,
                saves_outputs=False,
            )
            new_outs = []
            for t in outs:
                if id(t) in ctx._non_differentiable or not t.dtype.is_floating_point:
                    new_outs.append(t)
                    continue
                if t._node is not None or any(t is a for a in tensor_args):
                    t = Tensor._wrap(t._data)
                new_outs.append(t)
            Node.attach(op, tuple(tensor_args), {}, new_outs)
            node = new_outs[0]._node if new_outs else None
            if node is not None:
                node.versions = versions
            for t in new_outs:
                if id(t) in ctx._non_differentiable:
                    t._node, t._requires_grad = None, False
            outs = new_outs
        return outs[0] if single else tuple(outs)
