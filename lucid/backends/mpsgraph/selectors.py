"""Every MPSGraph method the emitter can call, every descriptor it fills, and the enum constants.

This table is the contract between the Python emitter and the native replay
(``native/mpsgraph``): the native side replays exactly these selectors, no more and no less, and a
test checks each entry against Apple's SDK metadata (PyObjC's ``arm64-26.5.fwinfo``, kept
outside the repository; see docs/backend-mpsgraph-native.md): that the method exists on its class
with these argument types and that it was introduced on or before macOS 14.0 (the backend's
deployment target, so the native side needs no ``@available`` guard for any entry; an entry newer
than 14.0 would carry ``guarded=True`` and a fallback).

Argument kinds (``ArgSpec.kind``) are the keys of the recorded program's argument encoding (see
``lucid/backends/mpsgraph/program.py``): ``tensor``, ``tensors``, ``int``, ``double``, ``bool``,
``shape``, ``ints``, ``dtype``, ``enum``, ``descriptor``, ``constant``, ``nil``. ``objc_type`` is
the exact Objective-C type of the parameter (``NSUInteger`` vs ``NSInteger``, ``float`` vs
``double``, the enum type, the descriptor class), so the native side converts the JSON value
exactly.

Descriptors are built by the class-method ``constructor`` with the fields named in
``constructor_fields`` (in order), then every other field present in the recorded descriptor is set
through its setter (``set<Field>:``). Enum-valued fields and arguments carry the constant's name;
``ENUMS`` gives its integer value.
"""

from __future__ import annotations

from dataclasses import dataclass

MACOS_FLOOR = "14.0"


@dataclass(frozen=True)
class ArgSpec:
    """One argument of a selector: its encoding kind and exact Objective-C type."""

    kind: str
    objc_type: str


@dataclass(frozen=True)
class SelectorSpec:
    """One MPSGraph method the emitter may call."""

    selector: str
    receiver: str
    args: tuple[ArgSpec, ...]
    returns: str  # "tensor" (MPSGraphTensor *) or "tensors" (NSArray<MPSGraphTensor *> *)
    introduced: str
    guarded: bool = False  # newer than MACOS_FLOOR: native calls it behind @available

    @property
    def arity(self) -> int:
        return len(self.args)


@dataclass(frozen=True)
class FieldSpec:
    """One settable property of a descriptor class."""

    kind: str  # int, bool, double, enum, dtype
    objc_type: str
    introduced: str


@dataclass(frozen=True)
class DescriptorSpec:
    """A descriptor class: how to construct it and which fields the emitter may set."""

    name: str
    constructor: str
    constructor_fields: tuple[str, ...]
    fields: dict[str, FieldSpec]
    introduced: str


# Short spellings for the table below: kind and Objective-C type of each argument.
_ARG_KINDS: dict[str, ArgSpec] = {
    "T": ArgSpec("tensor", "MPSGraphTensor *"),
    "Ts": ArgSpec("tensors", "NSArray<MPSGraphTensor *> *"),
    "name": ArgSpec("nil", "NSString *"),
    "i": ArgSpec("int", "NSInteger"),
    "u": ArgSpec("int", "NSUInteger"),
    "d": ArgSpec("double", "double"),
    "f": ArgSpec("double", "float"),
    "shape": ArgSpec("shape", "MPSShape *"),
    "ints": ArgSpec("ints", "NSArray<NSNumber *> *"),
    "dtype": ArgSpec("dtype", "MPSDataType"),
    "data": ArgSpec("constant", "NSData *"),
    "padmode": ArgSpec("enum", "MPSGraphPaddingMode"),
    "scatter": ArgSpec("enum", "MPSGraphScatterMode"),
    "conv2d": ArgSpec("descriptor", "MPSGraphConvolution2DOpDescriptor *"),
    "pool2d": ArgSpec("descriptor", "MPSGraphPooling2DOpDescriptor *"),
    "bool": ArgSpec("bool", "BOOL"),
    "u32": ArgSpec("int", "uint32_t"),
}

SELECTORS: dict[str, SelectorSpec] = {}


def _sel(selector: str, *kinds: str, returns: str = "tensor", introduced: str = "11.0") -> None:
    assert selector not in SELECTORS, selector
    assert selector.count(":") == len(kinds), selector
    SELECTORS[selector] = SelectorSpec(
        selector, "MPSGraph", tuple(_ARG_KINDS[k] for k in kinds), returns, introduced
    )


# --- tensors from nothing
_sel("placeholderWithShape:dataType:name:", "shape", "dtype", "name")
_sel("constantWithScalar:shape:dataType:", "d", "shape", "dtype")
_sel("constantWithData:shape:dataType:", "data", "shape", "dtype")
_sel("coordinateAlongAxis:withShape:name:", "i", "shape", "name", introduced="12.3")

# --- unary
for _name in (
    "identity", "negative", "absolute", "sign", "square", "exponent", "logarithm",
    "squareRoot", "reverseSquareRoot", "reciprocal", "sin", "cos", "tan", "tanh", "sigmoid",
    "erf", "floor", "ceil", "rint", "not", "isNaN", "isInfinite", "isFinite",
):  # fmt: skip
    _sel(f"{_name}WithTensor:name:", "T", "name")
_sel("truncateWithTensor:name:", "T", "name", introduced="13.0")

# --- binary
for _name in (
    "addition", "subtraction", "multiplication", "division", "power", "atan2", "maximum",
    "minimum", "equal", "notEqual", "lessThan", "lessThanOrEqualTo",
    "greaterThan", "greaterThanOrEqualTo", "logicalAND", "logicalOR", "logicalXOR",
):  # fmt: skip
    _sel(f"{_name}WithPrimaryTensor:secondaryTensor:name:", "T", "T", "name")
for _name in ("maximumWithNaNPropagation", "minimumWithNaNPropagation"):
    _sel(f"{_name}WithPrimaryTensor:secondaryTensor:name:", "T", "T", "name", introduced="12.0")
for _name in ("bitwiseAND", "bitwiseXOR", "bitwiseRightShift"):
    _sel(f"{_name}WithPrimaryTensor:secondaryTensor:name:", "T", "T", "name", introduced="13.0")

# --- ternary, cast, normalization, matmul
_sel("selectWithPredicateTensor:truePredicateTensor:falsePredicateTensor:name:", "T", "T", "T",
     "name")  # fmt: skip
_sel("clampWithTensor:minValueTensor:maxValueTensor:name:", "T", "T", "T", "name")
_sel("castTensor:toType:name:", "T", "dtype", "name", introduced="12.0")
_sel(
    "normalizationWithTensor:meanTensor:varianceTensor:gammaTensor:betaTensor:epsilon:name:",
    "T", "T", "T", "T", "T", "f", "name",
)  # fmt: skip
_sel("matrixMultiplicationWithPrimaryTensor:secondaryTensor:name:", "T", "T", "name")

# --- reductions (MPSGraph keeps every reduced axis with size 1)
for _name in (
    "reductionSum", "reductionMaximum", "reductionMinimum", "reductionMaximumPropagateNaN",
    "reductionMinimumPropagateNaN", "reductionProduct",
):  # fmt: skip
    _sel(f"{_name}WithTensor:axes:name:", "T", "ints", "name")
_sel("reductionAndWithTensor:axes:name:", "T", "ints", "name", introduced="12.2")
_sel("meanOfTensor:axes:name:", "T", "ints", "name")
_sel("varianceOfTensor:axes:name:", "T", "ints", "name")
_sel("reductionArgMaximumWithTensor:axis:name:", "T", "i", "name", introduced="12.0")
_sel("reductionArgMinimumWithTensor:axis:name:", "T", "i", "name", introduced="12.0")
_sel("softMaxWithTensor:axis:name:", "T", "i", "name")
_sel("argSortWithTensor:axis:descending:name:", "T", "i", "bool", "name", introduced="13.0")
_sel("cumulativeSumWithTensor:axis:exclusive:reverse:name:", "T", "i", "bool", "bool", "name",
     introduced="13.0")  # fmt: skip

# --- shape
_sel("reshapeTensor:withShape:name:", "T", "shape", "name")
_sel("transposeTensor:dimension:withDimension:name:", "T", "u", "u", "name")
_sel("transposeTensor:permutation:name:", "T", "ints", "name", introduced="13.0")
_sel("broadcastTensor:toShape:name:", "T", "shape", "name", introduced="12.0")
_sel(
    "sliceTensor:starts:ends:strides:startMask:endMask:squeezeMask:name:",
    "T", "ints", "ints", "ints", "u32", "u32", "u32", "name",
)  # fmt: skip
_sel("concatTensors:dimension:name:", "Ts", "i", "name")
_sel("stackTensors:axis:name:", "Ts", "i", "name", introduced="12.3")
_sel("padTensor:withPaddingMode:leftPadding:rightPadding:constantValue:name:", "T", "padmode",
     "shape", "shape", "d", "name")  # fmt: skip

# --- gather / scatter / one-hot
_sel("gatherWithUpdatesTensor:indicesTensor:axis:batchDimensions:name:", "T", "T", "u", "u",
     "name")  # fmt: skip
_sel("gatherAlongAxis:withUpdatesTensor:indicesTensor:name:", "i", "T", "T", "name",
     introduced="12.3")  # fmt: skip
_sel("scatterWithDataTensor:updatesTensor:indicesTensor:axis:mode:name:", "T", "T", "T", "i",
     "scatter", "name", introduced="12.0")  # fmt: skip
_sel("scatterAlongAxis:withDataTensor:updatesTensor:indicesTensor:mode:name:", "i", "T", "T",
     "T", "scatter", "name", introduced="12.3")  # fmt: skip
_sel("oneHotWithIndicesTensor:depth:axis:dataType:onValue:offValue:name:", "T", "u", "u", "dtype",
     "d", "d", "name")  # fmt: skip

# --- convolution and pooling (NCHW sources, OIHW weights)
_sel("convolution2DWithSourceTensor:weightsTensor:descriptor:name:", "T", "T", "conv2d", "name")
_sel(
    "convolution2DDataGradientWithIncomingGradientTensor:weightsTensor:outputShape:"
    "forwardConvolutionDescriptor:name:",
    "T", "T", "shape", "conv2d", "name",
)  # fmt: skip
_sel(
    "convolution2DWeightsGradientWithIncomingGradientTensor:sourceTensor:outputShape:"
    "forwardConvolutionDescriptor:name:",
    "T", "T", "shape", "conv2d", "name",
)  # fmt: skip
_sel("maxPooling2DWithSourceTensor:descriptor:name:", "T", "pool2d", "name")
_sel("maxPooling2DGradientWithGradientTensor:sourceTensor:descriptor:name:", "T", "T", "pool2d",
     "name")  # fmt: skip
_sel("avgPooling2DWithSourceTensor:descriptor:name:", "T", "pool2d", "name")
_sel("avgPooling2DGradientWithGradientTensor:sourceTensor:descriptor:name:", "T", "T", "pool2d",
     "name")  # fmt: skip


def _field(kind: str, objc_type: str, introduced: str = "11.0") -> FieldSpec:
    return FieldSpec(kind, objc_type, introduced)


_U = _field("int", "NSUInteger")
_PADDING_FIELDS = ("paddingLeft", "paddingRight", "paddingTop", "paddingBottom")

DESCRIPTORS: dict[str, DescriptorSpec] = {
    "MPSGraphConvolution2DOpDescriptor": DescriptorSpec(
        "MPSGraphConvolution2DOpDescriptor",
        "descriptorWithStrideInX:strideInY:dilationRateInX:dilationRateInY:groups:paddingLeft:"
        "paddingRight:paddingTop:paddingBottom:paddingStyle:dataLayout:weightsLayout:",
        (
            "strideInX",
            "strideInY",
            "dilationRateInX",
            "dilationRateInY",
            "groups",
            *_PADDING_FIELDS,
            "paddingStyle",
            "dataLayout",
            "weightsLayout",
        ),  # fmt: skip
        {
            "strideInX": _U,
            "strideInY": _U,
            "dilationRateInX": _U,
            "dilationRateInY": _U,
            "groups": _U,
            "paddingLeft": _U,
            "paddingRight": _U,
            "paddingTop": _U,
            "paddingBottom": _U,
            "paddingStyle": _field("enum", "MPSGraphPaddingStyle"),
            "dataLayout": _field("enum", "MPSGraphTensorNamedDataLayout"),
            "weightsLayout": _field("enum", "MPSGraphTensorNamedDataLayout"),
        },  # fmt: skip
        "11.0",
    ),
    "MPSGraphPooling2DOpDescriptor": DescriptorSpec(
        "MPSGraphPooling2DOpDescriptor",
        "descriptorWithKernelWidth:kernelHeight:strideInX:strideInY:dilationRateInX:"
        "dilationRateInY:paddingLeft:paddingRight:paddingTop:paddingBottom:paddingStyle:"
        "dataLayout:",
        (
            "kernelWidth",
            "kernelHeight",
            "strideInX",
            "strideInY",
            "dilationRateInX",
            "dilationRateInY",
            *_PADDING_FIELDS,
            "paddingStyle",
            "dataLayout",
        ),  # fmt: skip
        {
            "kernelWidth": _U,
            "kernelHeight": _U,
            "strideInX": _U,
            "strideInY": _U,
            "dilationRateInX": _U,
            "dilationRateInY": _U,
            "paddingLeft": _U,
            "paddingRight": _U,
            "paddingTop": _U,
            "paddingBottom": _U,
            "paddingStyle": _field("enum", "MPSGraphPaddingStyle"),
            "dataLayout": _field("enum", "MPSGraphTensorNamedDataLayout"),
            "includeZeroPadToAverage": _field("bool", "BOOL", "12.0"),
            "ceilMode": _field("bool", "BOOL", "12.0"),
        },  # fmt: skip
        "11.0",
    ),
}

# The enum constants the emitter writes (name -> value, from the SDK metadata).
ENUMS: dict[str, tuple[str, int]] = {
    "MPSGraphPaddingStyleExplicit": ("MPSGraphPaddingStyle", 0),
    "MPSGraphTensorNamedDataLayoutNCHW": ("MPSGraphTensorNamedDataLayout", 0),
    "MPSGraphTensorNamedDataLayoutOIHW": ("MPSGraphTensorNamedDataLayout", 2),
    "MPSGraphPaddingModeConstant": ("MPSGraphPaddingMode", 0),
    "MPSGraphScatterModeAdd": ("MPSGraphScatterMode", 0),
}

# prim dtype -> MPSDataType name (and value). MPSGraph has no float64: mpsgraph-legalize refuses it.
MPS_DTYPES: dict[str, tuple[str, int]] = {
    "f32": ("MPSDataTypeFloat32", 0x10000020),
    "f16": ("MPSDataTypeFloat16", 0x10000010),
    "bf16": ("MPSDataTypeBFloat16", 0x90000010),  # AlternateEncoding | Float16
    "i32": ("MPSDataTypeInt32", 0x20000020),
    "i64": ("MPSDataTypeInt64", 0x20000040),
    "bool": ("MPSDataTypeBool", 0x80000008),
}
MPS_DTYPE_VALUES: dict[str, int] = dict(MPS_DTYPES.values())
# The macOS release that introduced each data type, where later than MPSGraph itself (11.0):
# MPSDataTypeBFloat16 is API_AVAILABLE(macos(14.0)) (Apple's MPSCoreTypes.h; PyTorch's
# MPSGraphSonomaOps.h defines the constant itself for older SDKs). mpsgraph-legalize refuses a
# type the running macOS lacks, with this version in the reason.
MPS_DTYPE_INTRODUCED: dict[str, str] = {"MPSDataTypeBFloat16": "14.0"}
# The half-precision types: stored and computed in 16 bits; the emitter widens them to Float32
# only where accumulation needs it (see emit.py, "Half precision").
HALF_DTYPES = frozenset({"f16", "bf16"})


def dtype_introduced(prim_dtype: str) -> str:
    """The macOS version that introduced the MPSDataType of ``prim_dtype``."""
    return MPS_DTYPE_INTRODUCED.get(MPS_DTYPES[prim_dtype][0], "11.0")


PRIM_OF_MPS_DTYPE: dict[str, str] = {name: prim for prim, (name, _) in MPS_DTYPES.items()}


def macos_key(version: str) -> tuple[int, ...]:
    """A version string as a comparable tuple ("12.3" -> (12, 3))."""
    return tuple(int(p) for p in version.split("."))


__all__ = [
    "DESCRIPTORS",
    "ENUMS",
    "HALF_DTYPES",
    "MACOS_FLOOR",
    "MPS_DTYPES",
    "MPS_DTYPE_INTRODUCED",
    "MPS_DTYPE_VALUES",
    "PRIM_OF_MPS_DTYPE",
    "SELECTORS",
    "ArgSpec",
    "DescriptorSpec",
    "FieldSpec",
    "SelectorSpec",
    "dtype_introduced",
    "macos_key",
]


# --- the emission table: prim op -> every selector its emission may call (the main one first) ----
# The emitter (lucid/backends/mpsgraph/emit.py) is tested to call only these for each op, the union
# over all ops (plus the placeholders of the inputs) is exactly SELECTORS, and docs/prim.md's
# MPSGraph column and docs/backend-mpsgraph.md's table are generated from it.
_C = "constantWithScalar:shape:dataType:"
_BIN = "WithPrimaryTensor:secondaryTensor:name:"
_INDEX_CHECK = (
    _C, f"lessThan{_BIN}", f"greaterThanOrEqualTo{_BIN}", f"logicalAND{_BIN}",
    "reductionAndWithTensor:axes:name:", f"addition{_BIN}", "selectWithPredicateTensor:"
    "truePredicateTensor:falsePredicateTensor:name:", "castTensor:toType:name:",
)  # fmt: skip
_SELECT = "selectWithPredicateTensor:truePredicateTensor:falsePredicateTensor:name:"
# Half operands of the ops that accumulate are cast to Float32 and the result back (emit.py,
# _widened).
_WIDEN = "castTensor:toType:name:"
_INT_DIVISION = (
    f"division{_BIN}", f"multiplication{_BIN}", f"subtraction{_BIN}", f"minimum{_BIN}",
    f"maximum{_BIN}", f"equal{_BIN}", f"notEqual{_BIN}", f"lessThan{_BIN}", f"logicalAND{_BIN}",
    f"logicalXOR{_BIN}", _SELECT, _C, "castTensor:toType:name:", "floorWithTensor:name:",
    f"lessThanOrEqualTo{_BIN}",
)  # fmt: skip
# Float32 floor_divide and remainder (eager's divmod from an exact fmod) add these.
_FLOAT_DIVISION = (
    "absoluteWithTensor:name:", "negativeWithTensor:name:", "isFiniteWithTensor:name:",
    "isNaNWithTensor:name:", "notWithTensor:name:", f"addition{_BIN}", f"greaterThan{_BIN}",
)  # fmt: skip
_PHILOX = (
    f"bitwiseXOR{_BIN}",
    "coordinateAlongAxis:withShape:name:", "castTensor:toType:name:", _C,
    "constantWithData:shape:dataType:",
    "sliceTensor:starts:ends:strides:startMask:endMask:squeezeMask:name:",
    "reshapeTensor:withShape:name:",
    f"bitwiseAND{_BIN}", f"bitwiseRightShift{_BIN}",
    f"multiplication{_BIN}", f"addition{_BIN}", "stackTensors:axis:name:",
)  # fmt: skip

# What argmax/argmin call besides their reduction: the Int64 cast, the keepdims reshape and the
# first-NaN selection.
_ARG_REDUCTION = (
    "castTensor:toType:name:",
    "reshapeTensor:withShape:name:",
    "isNaNWithTensor:name:",
    "cumulativeSumWithTensor:axis:exclusive:reverse:name:",
    f"equal{_BIN}",
    f"greaterThan{_BIN}",
    "reductionSumWithTensor:axes:name:",
    "reductionMaximumWithTensor:axes:name:",
    _SELECT,
    _C,
)

EMISSIONS: dict[str, tuple[str, ...]] = {
    **{
        op: (f"{name}WithTensor:name:",)
        for op, name in {
            "neg": "negative",
            "abs": "absolute",
            "square": "square",
            "exp": "exponent",
            "log": "logarithm",
            "sqrt": "squareRoot",
            "rsqrt": "reverseSquareRoot",
            "reciprocal": "reciprocal",
            "sin": "sin",
            "cos": "cos",
            "tan": "tan",
            "tanh": "tanh",
            "sigmoid": "sigmoid",
            "erf": "erf",
            "floor": "floor",
            "ceil": "ceil",
            "round": "rint",
            "logical_not": "not",
            "isnan": "isNaN",
            "isinf": "isInfinite",
            "isfinite": "isFinite",
        }.items()  # fmt: skip
    },
    "relu": (f"maximumWithNaNPropagation{_BIN}", f"maximum{_BIN}", _C),
    "sign": ("signWithTensor:name:", "clampWithTensor:minValueTensor:maxValueTensor:name:", _C),
    "expm1": (
        "exponentWithTensor:name:",
        "tanhWithTensor:name:",
        "absoluteWithTensor:name:",
        f"lessThan{_BIN}",
        f"multiplication{_BIN}",
        f"subtraction{_BIN}",
        f"division{_BIN}",
        _SELECT,
        _C,
    ),  # fmt: skip
    "log1p": (
        "logarithmWithTensor:name:",
        f"addition{_BIN}",
        f"subtraction{_BIN}",
        f"multiplication{_BIN}",
        f"division{_BIN}",
        f"equal{_BIN}",
        _SELECT,
        _C,
    ),  # fmt: skip
    **{
        op: (f"{name}{_BIN}",)
        for op, name in {
            "add": "addition",
            "sub": "subtraction",
            "mul": "multiplication",
            "div": "division",
            "pow": "power",
            "atan2": "atan2",
            "eq": "equal",
            "ne": "notEqual",
            "lt": "lessThan",
            "le": "lessThanOrEqualTo",
            "gt": "greaterThan",
            "ge": "greaterThanOrEqualTo",
            "logical_and": "logicalAND",
            "logical_or": "logicalOR",
            "logical_xor": "logicalXOR",
        }.items()  # fmt: skip
    },
    "maximum": (f"maximumWithNaNPropagation{_BIN}", f"maximum{_BIN}"),
    "minimum": (f"minimumWithNaNPropagation{_BIN}", f"minimum{_BIN}"),
    "floor_divide": (*_INT_DIVISION, *_FLOAT_DIVISION),
    "remainder": (*_INT_DIVISION, *_FLOAT_DIVISION),
    "select": (_SELECT,),
    "cast": (
        "castTensor:toType:name:",
        "truncateWithTensor:name:",
        "clampWithTensor:minValueTensor:maxValueTensor:name:",
        "isNaNWithTensor:name:",
        f"greaterThanOrEqualTo{_BIN}",
        "constantWithData:shape:dataType:",
        f"notEqual{_BIN}",
        _SELECT,
        _C,
    ),  # fmt: skip
    "normalize": (
        "normalizationWithTensor:meanTensor:varianceTensor:gammaTensor:betaTensor:epsilon:name:",
        _WIDEN,
    ),
    "matmul": (
        "matrixMultiplicationWithPrimaryTensor:secondaryTensor:name:",
        "transposeTensor:dimension:withDimension:name:",
    ),
    "matmul_accumulate": (
        "matrixMultiplicationWithPrimaryTensor:secondaryTensor:name:",
        "transposeTensor:dimension:withDimension:name:",
        f"multiplication{_BIN}",
        f"addition{_BIN}",
    ),  # fmt: skip
    "reduce_sum": (
        "reductionSumWithTensor:axes:name:",
        _WIDEN,
        "reshapeTensor:withShape:name:",
        "identityWithTensor:name:",
    ),  # fmt: skip
    "reduce_mean": (
        "meanOfTensor:axes:name:",
        _WIDEN,
        "reshapeTensor:withShape:name:",
        "identityWithTensor:name:",
    ),  # fmt: skip
    "reduce_max": (
        "reductionMaximumPropagateNaNWithTensor:axes:name:",
        "reductionMaximumWithTensor:axes:name:",
        "reshapeTensor:withShape:name:",
        "identityWithTensor:name:",
    ),  # fmt: skip
    "reduce_min": (
        "reductionMinimumPropagateNaNWithTensor:axes:name:",
        "reductionMinimumWithTensor:axes:name:",
        "reshapeTensor:withShape:name:",
        "identityWithTensor:name:",
    ),  # fmt: skip
    "reduce_prod": (
        "reductionProductWithTensor:axes:name:",
        _WIDEN,
        "reshapeTensor:withShape:name:",
        "identityWithTensor:name:",
    ),  # fmt: skip
    "variance": (
        "varianceOfTensor:axes:name:",
        _WIDEN,
        "reshapeTensor:withShape:name:",
        f"subtraction{_BIN}",
    ),  # fmt: skip
    "argmax": ("reductionArgMaximumWithTensor:axis:name:", *_ARG_REDUCTION),
    "argmin": ("reductionArgMinimumWithTensor:axis:name:", *_ARG_REDUCTION),
    "argsort": (
        "argSortWithTensor:axis:descending:name:",
        "castTensor:toType:name:",
        "gatherAlongAxis:withUpdatesTensor:indicesTensor:name:",
        "sliceTensor:starts:ends:strides:startMask:endMask:squeezeMask:name:",
        f"notEqual{_BIN}",
        "concatTensors:dimension:name:",
        "cumulativeSumWithTensor:axis:exclusive:reverse:name:",
        "scatterAlongAxis:withDataTensor:updatesTensor:indicesTensor:mode:name:",
        f"bitwiseAND{_BIN}",
        f"bitwiseRightShift{_BIN}",
        f"greaterThanOrEqualTo{_BIN}",
        f"subtraction{_BIN}",
        f"addition{_BIN}",
        f"multiplication{_BIN}",
        "isNaNWithTensor:name:",
        "coordinateAlongAxis:withShape:name:",
        _SELECT,
        _C,
    ),  # fmt: skip
    "softmax": ("softMaxWithTensor:axis:name:", _WIDEN),
    "log_softmax": (
        "reductionMaximumWithTensor:axes:name:",
        _WIDEN,
        f"subtraction{_BIN}",
        "exponentWithTensor:name:",
        "reductionSumWithTensor:axes:name:",
        "logarithmWithTensor:name:",
    ),  # fmt: skip
    "cumsum": ("cumulativeSumWithTensor:axis:exclusive:reverse:name:", _WIDEN),
    "reshape": ("reshapeTensor:withShape:name:",),
    "transpose": ("transposeTensor:permutation:name:", "identityWithTensor:name:"),
    "broadcast_to": ("broadcastTensor:toShape:name:",),
    "slice": ("sliceTensor:starts:ends:strides:startMask:endMask:squeezeMask:name:",),
    "concat": ("concatTensors:dimension:name:",),
    "pad": (
        "padTensor:withPaddingMode:leftPadding:rightPadding:constantValue:name:",
        "identityWithTensor:name:",
    ),
    "gather": (
        "gatherWithUpdatesTensor:indicesTensor:axis:batchDimensions:name:",
        *_INDEX_CHECK,
        "reshapeTensor:withShape:name:",
    ),  # fmt: skip
    "gather_along_axis": (
        "gatherAlongAxis:withUpdatesTensor:indicesTensor:name:",
        *_INDEX_CHECK,
    ),  # fmt: skip
    "scatter_add": (
        "scatterWithDataTensor:updatesTensor:indicesTensor:axis:mode:name:",
        "reshapeTensor:withShape:name:",
        *_INDEX_CHECK,
        _WIDEN,
    ),  # fmt: skip
    "scatter_add_along_axis": (
        "scatterAlongAxis:withDataTensor:updatesTensor:indicesTensor:mode:name:",
        *_INDEX_CHECK,
        _WIDEN,
    ),
    "one_hot": (
        "oneHotWithIndicesTensor:depth:axis:dataType:onValue:offValue:name:",
        f"lessThan{_BIN}",
        f"greaterThanOrEqualTo{_BIN}",
        f"logicalAND{_BIN}",
        _SELECT,
        _C,
        "castTensor:toType:name:",
        "reshapeTensor:withShape:name:",
    ),  # fmt: skip
    "check_index": (
        f"greaterThanOrEqualTo{_BIN}",
        _C,
        f"lessThan{_BIN}",
        f"logicalAND{_BIN}",
        "identityWithTensor:name:",
    ),  # fmt: skip
    "conv2d": ("convolution2DWithSourceTensor:weightsTensor:descriptor:name:",),
    "conv2d_data_grad": (
        "convolution2DDataGradientWithIncomingGradientTensor:weightsTensor:outputShape:"
        "forwardConvolutionDescriptor:name:",
    ),
    "conv2d_weights_grad": (
        "convolution2DWeightsGradientWithIncomingGradientTensor:sourceTensor:outputShape:"
        "forwardConvolutionDescriptor:name:",
    ),
    "max_pool2d": ("maxPooling2DWithSourceTensor:descriptor:name:",),
    "max_pool2d_grad": ("maxPooling2DGradientWithGradientTensor:sourceTensor:descriptor:name:",),
    "avg_pool2d": ("avgPooling2DWithSourceTensor:descriptor:name:",),
    "avg_pool2d_grad": (
        "avgPooling2DGradientWithGradientTensor:sourceTensor:descriptor:name:",
        "constantWithScalar:shape:dataType:",
    ),  # fmt: skip
    "constant": ("constantWithScalar:shape:dataType:", "constantWithData:shape:dataType:"),
    "fill": ("broadcastTensor:toShape:name:", "identityWithTensor:name:"),
    "random_uniform": _PHILOX,  # a half result: the Float32 draw cast once
    "random_normal": (
        *_PHILOX,
        "logarithmWithTensor:name:",
        "squareRootWithTensor:name:",
        "cosWithTensor:name:",
        "sinWithTensor:name:",
        f"subtraction{_BIN}",
    ),  # fmt: skip
}
# Called for the program's inputs, not for any op.
INPUT_SELECTORS = ("placeholderWithShape:dataType:name:",)

# Composite emissions (several calls for one prim op), described for the docs.
EMISSION_NOTES: dict[str, str] = {
    "argsort": "exact and stable on every OS: keys ranked through Int32/Float32 argSorts "
    "(Int64 as two Int32 halves, NaN ranked last), then one argSort of the unique rank·n + "
    "position; rows up to 46339",
    "relu": "floats: NaN-propagating maximum with 0 (Apple leaves reLU's NaN unspecified); "
    "integers: maximum with 0",
    "sign": "integers: clamp to [−1, 1] (no integer sign kernel)",
    "expm1": "exp(x) − 1, and 2·tanh(x/2)/(1−tanh(x/2)) where abs(x) < 0.5 (no cancellation)",
    "log1p": "u = 1 + x; log(u)·x/(u − 1), x where u = 1, u where u = +inf (Goldberg's trick)",
    "maximum": "NaN-propagating variant for floats, plain for integers",
    "minimum": "NaN-propagating variant for floats, plain for integers",
    "floor_divide": "floats: eager's (numpy's) divmod from an exact fmod (12 rounds of "
    "Dekker products on Veltkamp splits), so 1.0 // 0.1 is 9; integers: exact over the whole "
    "range, in the operand type with no wrapping step: Float32 quotient estimates (2 rounds "
    "for int32, 4 for int64) on −|a| and −|b|, one exact step, signs; INT_MIN // −1 gives "
    "INT_MIN, a zero divisor 0; halves: the Float32 divmod rounded once (as eager)",
    "remainder": "floats: floor_divide's divmod (b's sign, NaN for a zero divisor); integers: "
    "the remainder of floor_divide's exact steps, a zero divisor gives 0; halves: the Float32 "
    "divmod rounded once (as eager)",
    "cast": "float → int: truncate, clamp, NaN → 0, ≥ 2^(bits−1) → the integer maximum "
    "(halves through Float32); → bool: x ≠ 0",
    "matmul": "transposeTensor on the last two axes for transpose_a/transpose_b",
    "matmul_accumulate": "matmul, × alpha, + c (mpsgraph-legalize rewrites it first)",
    "reduce_sum": "MPSGraph keeps reduced axes: reshape when keepdims is false; half "
    "operands summed in Float32",
    "reduce_mean": "half operands averaged in Float32",
    "reduce_prod": "half operands multiplied in Float32",
    "variance": "half operands in Float32",
    "softmax": "half operands in Float32",
    "cumsum": "half operands in Float32",
    "normalize": "half operands in Float32",
    "reduce_max": "NaN-propagating variant for floats",
    "reduce_min": "NaN-propagating variant for floats",
    "argmax": "floats: the first NaN's index where a row has one (MPSGraph skips NaN); Int32 "
    "result cast to Int64, reshape when keepdims is false",
    "argmin": "floats: the first NaN's index where a row has one (MPSGraph skips NaN); Int32 "
    "result cast to Int64, reshape when keepdims is false",
    "log_softmax": "x − max − log Σ exp(x − max); half operands in Float32",
    "gather": "negative indices wrapped, indices cast to Int32, an all-in-range check target "
    "(IndexError after the run)",
    "gather_along_axis": "as gather",
    "scatter_add": "indices flattened to 1-D (updates reshaped to match), checked as gather; "
    "half operands added in Float32",
    "scatter_add_along_axis": "as gather; half operands added in Float32",
    "one_hot": "indices outside [0, depth) mapped to −1 before the Int32 cast (all-zero row)",
    "check_index": "the low <= i < high mask and the values as targets: IndexError with the "
    "user op's message naming the first bad value, after the run and before any write-back; "
    "the values pass through (identity)",
    "avg_pool2d_grad": "a zero source tensor of the input shape (the method reads only its shape)",
    "fill": "broadcast of the 0-d value",
    "random_uniform": "Philox-4x32-10 on 16-bit limbs in Int32 (nothing wraps): the same "
    "stream as eager and the CPU",
    "random_normal": "Philox-4x32-10 uniforms (16-bit limbs in Int32), then Box–Muller (same "
    "stream as eager)",
}


def emission_macos(op: str) -> str:
    """The newest macOS version among the selectors op's emission may call."""
    return max((SELECTORS[s].introduced for s in EMISSIONS[op]), key=macos_key)


__all__ += ["EMISSIONS", "EMISSION_NOTES", "INPUT_SELECTORS", "emission_macos"]


def emission_markdown() -> str:
    """The emission table as markdown: prim op -> every MPSGraph method its emission may call ->
    the newest macOS version among them (docs/backend-mpsgraph.md embeds it; a test keeps the
    two equal)."""
    lines = [
        "| prim op | MPSGraph methods (main first) | macOS | how |",
        "|---|---|---|---|",
    ]
    for op in sorted(EMISSIONS):
        methods = "<br>".join(
            f"`{s}` ({SELECTORS[s].introduced})" for s in dict.fromkeys(EMISSIONS[op])
        )
        lines.append(
            f"| `{op}` | {methods} | {emission_macos(op)} | {EMISSION_NOTES.get(op, '')} |"
        )
    return "\n".join(lines) + "\n"


__all__ += ["emission_markdown"]
