"""The ``SparsegenLin`` ONNX op of our own domain, and its definition as an ONNX function of standard ops.

In an SSAF graph every attention layer's probability function is one node ``bertzoo.SparsegenLin(scores, mask)``
with a float attribute ``lambda``:

- ``scores``: float [..., keys] attention scores (any float type; computed in float32 inside).
- ``mask``: bool, broadcastable to ``scores``; False keys get exactly zero probability.
- output: same shape and type as ``scores``, each row summing to 1: ``max(0, (z - tau) / (1 - lambda))``.

The model carries the op's definition as a model-local ONNX function (the sort-based algorithm of
``trainer/sparsegen.py``: TopK, CumSum, support size, threshold), so ONNX Runtime, ``onnx.checker`` and any other
runtime can execute it without knowing our domain. A runtime with a faster implementation registers its own: the
TensorRT plugin in ``export/tensorrt.py``; for ONNX Runtime on CPU the native kernel of ``export/ort_kernel``, and
where that cannot be built a sort-free formulation of the same function (:func:`ort_function_proto`) that the
server's ONNX Runtime backend swaps in when it loads a graph.

Why the node is attached after export: the torch.onnx (dynamo) exporter inlines onnxscript functions, so the
translation below emits a bare ``SparsegenLin`` node and :func:`attach_function` adds the definition afterwards, with
the function's default-domain opset set to the model's own (ONNX requires them to agree).
"""

from __future__ import annotations

import onnx
import onnx.parser

DOMAIN = "bertzoo"
DOMAIN_VERSION = 1
OP_TYPE = "SparsegenLin"


def _schema() -> onnx.defs.OpSchema:
    # The exporter builds nodes from schemas, so the exporting process registers one. The saved model does not need
    # it: it carries the function definition, and is checked in a process without this schema (tests/test_export.py).
    T = onnx.defs.OpSchema.FormalParameter
    return onnx.defs.OpSchema(
        OP_TYPE, DOMAIN, DOMAIN_VERSION, doc="sparsegen-lin over the last axis; False mask keys get zero weight.",
        inputs=[T("scores", "T"), T("mask", "tensor(bool)")], outputs=[T("probs", "T")],
        type_constraints=[("T", ["tensor(float)", "tensor(float16)", "tensor(bfloat16)"], "score types")],
        attributes=[onnx.defs.OpSchema.Attribute("lambda", onnx.defs.OpSchema.AttrType.FLOAT, "lambda < 1")],
    )


def _registered_op():
    import onnxscript  # only the exporting process needs it; serving imports this module for the ORT formulation

    if not onnx.defs.has(OP_TYPE, DOMAIN):
        onnx.defs.register_schema(_schema())
    return onnxscript.values.Opset(DOMAIN, DOMAIN_VERSION)[OP_TYPE]


# The function body in ONNX's text syntax (one op per line: the syntax has no nested calls); ``@lambda`` refers to the
# node's attribute, Log(0) is -inf. It follows _prepare and _threshold_sort in trainer/sparsegen.py step by step.
_FUNCTION_TEXT = """
<domain: "bertzoo", opset_import: ["": {opset}]>
SparsegenLin <lambda> (scores, mask) => (probs) {{
    lam = Constant <value_float: float = @lambda> ()
    one = Constant <value_float = 1.0> ()
    zero = Constant <value_float = 0.0> ()
    neg_inf = Log (zero)
    last = Constant <value_ints = [-1]> ()
    axis = Constant <value_int = -1> ()
    one_i = Constant <value_int = 1> ()
    x = Cast <to = 1> (scores)
    scale = Sub (one, lam)
    z_scaled = Div (x, scale)
    mask_b = Cast <to = 9> (mask)
    z_shape = Shape (z_scaled)
    valid = Expand (mask_b, z_shape)
    z_masked = Where (valid, z_scaled, neg_inf)
    row_max = ReduceMax <keepdims = 1> (z_masked, last)
    all_masked = IsInf (row_max)
    safe_max = Where (all_masked, zero, row_max)
    z = Sub (z_masked, safe_max)
    n_keys = Shape <start = -1> (z)
    z_sorted, unused_idx = TopK <axis = -1, largest = 1, sorted = 1> (z, n_keys)
    is_inf = IsInf (z_sorted)
    finite = Not (is_inf)
    z_sorted0 = Where (finite, z_sorted, zero)
    cumsum = CumSum (z_sorted0, axis)
    n_scalar = Squeeze (n_keys)
    n_end = Add (n_scalar, one_i)
    k_int = Range (one_i, n_end, one_i)
    k = Cast <to = 1> (k_int)
    k_z = Mul (k, z_sorted0)
    lhs = Add (one, k_z)
    above = Greater (lhs, cumsum)
    in_support = And (finite, above)
    in_support_f = Cast <to = 1> (in_support)
    count = ReduceSum <keepdims = 1> (in_support_f, last)
    size = Max (count, one)
    size_m1 = Sub (size, one)
    index = Cast <to = 7> (size_m1)
    cumsum_k = GatherElements <axis = -1> (cumsum, index)
    mass_m1 = Sub (cumsum_k, one)
    tau = Div (mass_m1, size)
    shifted = Sub (z, tau)
    p_all = Relu (shifted)
    p = Where (valid, p_all, zero)
    probs = CastLike (p, scores)
}}
"""


# The ONNX Runtime formulation: no TopK. ORT's TopK sorts each row with per-row allocations and is by far the slowest
# part of the generic body. Instead (as in trainer/sparsegen.py's "bisect"): a few bisection steps bracket tau from
# below, then a Loop runs Michelot's step ``tau = (sum of z over {z > tau} - 1) / |{z > tau}|`` until no row's support
# changes. Michelot's step from a lower bound only moves up and stops exactly at tau, so the result is exact. The loop
# starts at the bisection's lower bound with a support count above any real one, so its first step always runs; it is
# capped at the row length + 1 (the worst case); the bisection makes it end after two to four steps in practice.
_ORT_BISECT_STEP = """    sum_lh_{i} = Add (lo_{i}, hi_{i})
    mid_{i} = Mul (sum_lh_{i}, half)
    d_{i} = Sub (z, mid_{i})
    r_{i} = Relu (d_{i})
    mass_{i} = ReduceSum <keepdims = 1> (r_{i}, last)
    low_{i} = GreaterOrEqual (mass_{i}, one)
    lo_{j} = Where (low_{i}, mid_{i}, lo_{i})
    hi_{j} = Where (low_{i}, hi_{i}, mid_{i})
"""
# Written for memory traffic (the op is memory-bound on CPU): the mask becomes a -inf bias of the mask's own small
# shape instead of a scores-sized Where, and masked keys stay -inf throughout (Relu(-inf - tau) is 0, and the
# support test z > tau is false for them), so no scores-sized "valid" tensor is ever built.
_ORT_TEXT = """
<domain: "bertzoo", opset_import: ["": {opset}]>
SparsegenLin <lambda> (scores, mask) => (probs) {{
    lam = Constant <value_float: float = @lambda> ()
    one = Constant <value_float = 1.0> ()
    zero = Constant <value_float = 0.0> ()
    half = Constant <value_float = 0.5> ()
    minus_one = Constant <value_float = -1.0> ()
    neg_inf = Log (zero)
    last = Constant <value_ints = [-1]> ()
    x = Cast <to = 1> (scores)
    scale = Sub (one, lam)
    z_scaled = Div (x, scale)
    mask_b = Cast <to = 9> (mask)
    bias = Where (mask_b, zero, neg_inf)
    z_masked = Add (z_scaled, bias)
    row_max = ReduceMax <keepdims = 1> (z_masked, last)
    all_masked = IsInf (row_max)
    safe_max = Where (all_masked, zero, row_max)
    z = Sub (z_masked, safe_max)
    row_shape = Shape (row_max)
    lo_0 = Expand (minus_one, row_shape)
    hi_0 = Expand (zero, row_shape)
{bisect}    n_keys = Shape <start = -1> (z)
    max_keys = Squeeze (n_keys)
    one_i = Constant <value_int = 1> ()
    max_trip = Add (max_keys, one_i)
    more_than_any_count = Cast <to = 1> (max_trip)
    cnt_start = Expand (more_than_any_count, row_shape)
    go = Constant <value = bool {{1}}> ()
    tau, unused_cnt = Loop (max_trip, go, lo_{n}, cnt_start) <body = michelot (int64 i, bool cond_in, float tau_in,
                                                                       float cnt_in) => (bool cond_out, float tau_out,
                                                                                         float cnt_out) {{
        above = Greater (z, tau_in)
        above_f = Cast <to = 1> (above)
        cnt_out = ReduceSum <keepdims = 1> (above_f, last)
        kept = Where (above, z, zero)
        s = ReduceSum <keepdims = 1> (kept, last)
        s_m1 = Sub (s, one)
        size = Max (cnt_out, one)
        tau_out = Div (s_m1, size)
        shrank = Less (cnt_out, cnt_in)
        shrank_f = Cast <to = 1> (shrank)
        any_shrank = ReduceMax <keepdims = 0> (shrank_f)
        cond_out = Cast <to = 9> (any_shrank)
    }}>
    shifted = Sub (z, tau)
    p = Relu (shifted)
    probs = CastLike (p, scores)
}}
"""
ORT_BISECT_STEPS = 8


def _ort_function_text(opset: int, bisect_steps: int = ORT_BISECT_STEPS) -> str:
    steps = "".join(_ORT_BISECT_STEP.format(i=i, j=i + 1) for i in range(bisect_steps))
    return _ORT_TEXT.format(opset=opset, bisect=steps, n=bisect_steps)


def ort_function_proto(opset: int, bisect_steps: int = ORT_BISECT_STEPS) -> onnx.FunctionProto:
    """The SparsegenLin definition ONNX Runtime runs (same result as :func:`function_proto`, measured faster)."""
    function = onnx.parser.parse_function(_ort_function_text(opset, bisect_steps))
    loop = next(n for n in function.node if n.op_type == "Loop")
    body = loop.attribute[0].g
    for value in [*body.input[2:], *body.output[1:]]:
        value.type.tensor_type.ClearField("shape")  # the text syntax's "float" means a scalar; these are [..., 1]
    return function


def carries_function(model: onnx.ModelProto) -> bool:
    """Whether ``model`` carries the SparsegenLin function, i.e. is an SSAF graph."""
    return any((f.domain, f.name) == (DOMAIN, OP_TYPE) for f in model.functions)


def with_ort_formulation(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` whose SparsegenLin function is the ONNX Runtime formulation (unchanged if it has none)."""
    if not carries_function(model):
        return model
    fast = onnx.ModelProto()
    fast.CopyFrom(model)
    opset = next(o.version for o in fast.opset_import if o.domain in ("", "ai.onnx"))
    functions = [ort_function_proto(opset) if (f.domain, f.name) == (DOMAIN, OP_TYPE) else f for f in fast.functions]
    del fast.functions[:]
    fast.functions.extend(functions)
    return fast


def function_proto(opset: int) -> onnx.FunctionProto:
    """The op's definition for a model whose default-domain opset is ``opset`` (>= 18: ReduceMax takes axes as input)."""
    if opset < 18:
        raise ValueError(f"the SparsegenLin function needs opset >= 18, got {opset}")
    return onnx.parser.parse_function(_FUNCTION_TEXT.format(opset=opset))


def attach_function(model: onnx.ModelProto) -> onnx.ModelProto:
    """Add the SparsegenLin definition (and our domain's opset import) to a model whose graph uses the op."""
    opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    kept = [f for f in model.functions if not (f.domain == DOMAIN and f.name == OP_TYPE)]
    del model.functions[:]
    model.functions.extend([*kept, function_proto(opset)])
    if not any(o.domain == DOMAIN for o in model.opset_import):
        model.opset_import.append(onnx.helper.make_opsetid(DOMAIN, DOMAIN_VERSION))
    return model


def count_nodes(model: onnx.ModelProto, op_type: str = OP_TYPE, domain: str = DOMAIN) -> int:
    """How many nodes of the main graph (functions not included) are ``domain.op_type``."""
    return sum(1 for n in model.graph.node if n.op_type == op_type and n.domain == domain)


def _translate(scores, mask, lam: float, impl: str):
    # ``impl`` (sort or bisect) is a training-time choice; the ONNX op is defined by its result, not its algorithm.
    return _registered_op()(scores, mask, **{"lambda": float(lam)})


def translation_table() -> dict:
    """For ``torch.onnx.export(custom_translation_table=...)``: our torch custom op -> one bare ONNX node."""
    import torch

    import bertzoo.trainer.sparsegen  # noqa: F401  (registers torch.ops.bertzoo.sparsegen_lin)

    return {torch.ops.bertzoo.sparsegen_lin.default: _translate}


__all__ = ["DOMAIN", "OP_TYPE", "attach_function", "carries_function", "count_nodes", "function_proto", "ort_function_proto",
           "translation_table", "with_ort_formulation"]
