"""Which profiled Ascend kernels the die model knows, from their op type and shapes.

A kernel row gives its op type (``Type`` / ``OP Type``), its input and output shapes (``1,4096;
4096,7168``: tensors split by ``;``, dimensions by ``,``) and data types. ``die_op`` turns that
into a ``cmemu.op`` with its shape attributes (docs/trace-format.md, COMP), or says why not.
The op types are CANN's operator names (the ops-nn / ops-transformer operator lists); matching
is by name, case-insensitively, suffix variants (``V2``, ``V3``) included.
"""
from __future__ import annotations

import math

# CANN data type names (with or without the DT_ prefix) -> cmemu.dtype
DTYPES = {"BF16": "bf16", "BFLOAT16": "bf16", "FLOAT16": "fp16", "FP16": "fp16", "HALF": "fp16",
          "INT8": "int8", "FLOAT": "fp32", "FLOAT32": "fp32", "FP32": "fp32"}
DTYPE_BYTES = {"BF16": 2, "BFLOAT16": 2, "FLOAT16": 2, "FP16": 2, "HALF": 2, "INT8": 1, "UINT8": 1,
               "FLOAT": 4, "FLOAT32": 4, "FP32": 4, "INT32": 4, "UINT32": 4, "INT64": 8, "UINT64": 8,
               "INT16": 2, "UINT16": 2, "BOOL": 1, "DOUBLE": 8, "FLOAT64": 8, "COMPLEX64": 8, "INT4": 0.5}

GEMM_TYPES = frozenset({"matmul", "matmulv2", "matmulv3", "batchmatmul", "batchmatmulv2", "batchmatmulv3",
                        "quantbatchmatmulv3", "quantbatchmatmulv4"})
GROUPED_GEMM_TYPES = frozenset({"groupedmatmul"})
ATTENTION_TYPES = frozenset({"fusedinferattentionscore", "increflashattention"})
# vector op type -> (cmemu.op, which tensor gives rows x cols: "in" first input, "out" first output)
VECTOR_TYPES = {
    "rmsnorm": ("rmsnorm", "in"), "addrmsnorm": ("rmsnorm", "in"),
    "swiglu": ("swiglu", "out"),
    "rotarypositionembedding": ("rope", "in"), "applyrotaryposemb": ("rope", "in"), "rotarymul": ("rope", "in"),
    "softmaxv2": ("softmax", "in"), "softmax": ("softmax", "in"),
    "dynamicquant": ("quant_int8", "in"),
}
MLA_HEAD_DIM = 512  # DeepSeek MLA's absorbed latent dimension (kv_lora_rank), one KV head


def parse_shapes(text: str | None) -> list[tuple[int, ...]] | None:
    """``"1,4096;4096,7168"`` -> [(1, 4096), (4096, 7168)]; an empty tensor (a scalar) is ().
    None when the text is absent (N/A) or not of that form."""
    if text is None:
        return None
    shapes = []
    for part in text.strip().strip('"').split(";"):
        part = part.strip()
        if not part:
            shapes.append(())
            continue
        try:
            dims = tuple(int(d) for d in part.split(","))
        except ValueError:
            return None
        if any(d < 0 for d in dims):
            return None  # a dynamic dimension (-1): no size
        shapes.append(dims)
    return shapes


def parse_dtypes(text: str | None) -> list[str]:
    """``"DT_BF16;FLOAT16"`` -> ["BF16", "FLOAT16"] (CANN's names, DT_ prefix dropped)."""
    if not text:
        return []
    return [p.strip().upper().removeprefix("DT_") for p in text.strip().strip('"').split(";")]


def tensor_bytes(shape: tuple[int, ...], dtype: str) -> int | None:
    size = DTYPE_BYTES.get(dtype)
    return None if size is None else int(math.prod(shape) * size)


def die_op(op_type: str, ins, in_types, outs) -> tuple[dict | None, str]:
    """(attrs with ``cmemu.op`` and its shape, None) for a kernel the die model knows, else
    (None, why not: one summary kind). ``ins``/``outs``: parse_shapes lists (or None)."""
    key = op_type.lower()
    known = key in GEMM_TYPES or key in GROUPED_GEMM_TYPES or key in ATTENTION_TYPES or key in VECTOR_TYPES
    if not known:
        return None, "no die-model op for this kernel type"
    if not ins or not outs or not ins[0] or not outs[0]:
        return None, "a kernel the die model knows, without its shapes"
    dtype = DTYPES.get(in_types[0]) if in_types else "bf16"
    if dtype is None:
        return None, f"a kernel the die model knows, with input type {in_types[0]} it has no mode for"
    if key in GEMM_TYPES:
        attrs = _gemm(ins, outs)
    elif key in GROUPED_GEMM_TYPES:
        attrs = _grouped_gemm(ins, outs)
    elif key in ATTENTION_TYPES:
        attrs = _mla_attention(ins, outs)
    else:
        op, which = VECTOR_TYPES[key]
        shape = ins[0] if which == "in" else outs[0]
        attrs = {"cmemu.op": op, "cmemu.rows": max(1, math.prod(shape[:-1])), "cmemu.cols": shape[-1]}
    if isinstance(attrs, str):
        return None, attrs
    if any(v < 1 for k, v in attrs.items() if k != "cmemu.op"):
        return None, "a kernel the die model knows, with an empty shape"
    attrs["cmemu.dtype"] = dtype
    return attrs, ""


def _gemm(ins, outs):
    """C (batch x m x n) = A (batch x m x k) . B: m, n from C; k from A's size (either layout of
    A, transposed or not); a B without the batch is one weight: a single GEMM of batch x m rows."""
    a, out = ins[0], outs[0]
    if len(out) < 2 or len(a) < 2 or len(ins) < 2:
        return "a matmul whose shapes do not give m, n and k"
    m, n = out[-2], out[-1]
    batch = math.prod(out[:-2])
    if m * batch == 0 or math.prod(a) % (batch * m):
        return "a matmul whose shapes do not give m, n and k"
    k = math.prod(a) // (batch * m)
    if k not in a[-2:]:
        return "a matmul whose shapes do not give m, n and k"
    if batch == 1 or math.prod(ins[1]) == k * n:
        return {"cmemu.op": "gemm", "cmemu.m": m * batch, "cmemu.n": n, "cmemu.k": k}
    return {"cmemu.op": "grouped_gemm", "cmemu.m": m, "cmemu.n": n, "cmemu.k": k, "cmemu.groups": batch}


def _grouped_gemm(ins, outs):
    """GroupedMatmul: x (M x k), weight (E x k x n, either layout), y (M x n). The profile does
    not give the tokens per expert: assumed M / E each (rounded up)."""
    x, w, y = ins[0], ins[1] if len(ins) > 1 else (), outs[0]
    if len(x) != 2 or len(w) != 3 or len(y) != 2:
        return "a grouped matmul whose shapes are not x (M x k), weight (E x k x n), y (M x n)"
    groups, k, n = w[0], x[1], y[1]
    if sorted(w[1:]) != sorted((k, n)):
        return "a grouped matmul whose shapes are not x (M x k), weight (E x k x n), y (M x n)"
    return {"cmemu.op": "grouped_gemm", "cmemu.m": -(-x[0] // groups), "cmemu.n": n, "cmemu.k": k,
            "cmemu.groups": groups}


def _mla_attention(ins, outs):
    """Absorbed MLA attention: query (B, N, S, 512) over one latent KV head key (B, 1, Skv, 512),
    BNSD, or the same in BSND; a paged KV cache (blocks, block size, ...) does not give kv_len."""
    if len(ins) < 2 or len(ins[0]) != 4 or len(ins[1]) != 4:
        return "attention whose shapes are not MLA's (4-D query and KV: paged KV gives no kv_len)"
    q, kv = ins[0], ins[1]
    if q[3] != MLA_HEAD_DIM or kv[3] != MLA_HEAD_DIM or kv[0] != q[0]:
        return "attention whose shapes are not MLA's (head dim 512 over one latent KV head)"
    if kv[1] == 1:  # BNSD
        batch, heads, seq, kv_len = q[0], q[1], q[2], kv[2]
    elif kv[2] == 1:  # BSND
        batch, seq, heads, kv_len = q[0], q[1], q[2], kv[1]
    else:
        return "attention whose shapes are not MLA's (head dim 512 over one latent KV head)"
    return {"cmemu.op": "mla_attention", "cmemu.tokens": batch * seq, "cmemu.kv_len": kv_len,
            "cmemu.heads": heads, "cmemu.queries_per_request": seq}
