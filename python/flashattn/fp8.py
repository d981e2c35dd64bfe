"""flashattn.fp8: FP8 (E4M3) block quantization for FP8 attention (FlashAttention-3 style).

`quantize` cuts x [batch, seqlen, nheads, headdim] along seqlen into blocks of `block_size` tokens
per (batch, head), each with one float32 scale, and returns E4M3 values (torch.float8_e4m3fn) and
the scales [batch, nheads, ceil(seqlen / block_size)]:

    x'     = x, or with hadamard=True  H (signs * x) / sqrt(headdim)  along headdim
    scale  = amax(|x'| over the block's finite values) / 448   (1 for an all-zero block)
    x_fp8  = E4M3(x' / scale), round to nearest even, |.| > 448 saturated to 448, NaN kept

The Hadamard transform (random +-1 signs from `seed`, then the orthonormal Walsh-Hadamard matrix)
is orthogonal: quantize Q and K with the same seed and Q K^T is unchanged, while outliers are
spread over the row. `dequantize` inverts it: x ~= signs * H (scale * x_fp8) / sqrt(headdim).
Per element of x', |scale * x_fp8 - x'| <= 2^-4 |x'| (or 2^-10 scale for |x'| < 2^-6 scale).

Runs the C library's flashattn_fp8_quantize / flashattn_fp8_dequantize on CPU tensors; quantize also
runs on CUDA tensors (fp16/bf16/fp32), dequantize of CUDA tensors raises NotImplementedError.
No autograd. See docs/fp8.md.

`flash_attn_fp8_func` quantizes q, k, v this way and runs FP8 attention (flash_attn_func on
float8_e4m3fn inputs with their scales): Q and K share the Hadamard transform (so Q K^T is kept),
V is quantized untransformed (its transform would not cancel in P V). On CUDA it quantizes V straight into the
keys_permuted16 layout below (v_layout=None, the default), which the sm90 kernel reads without transposing V.

`keys_permuted16` stores an FP8 v as V^T with its keys permuted in groups of 16, the layout the sm90 FP8
kernel reads without transposing V (flash_attn_func(..., v_layout="keys_permuted16")).
"""

from __future__ import annotations

import ctypes
import struct
from typing import Tuple

import torch

from . import _lib
from ._ops import _POISON, _alloc  # NaN-filled under FLASHATTN_DEBUG_POISON=1 (tests)

__all__ = ["quantize", "dequantize", "flash_attn_fp8_func", "keys_permuted16"]

_DTYPES = {
    torch.float16: _lib.DTYPE_FP16,
    torch.bfloat16: _lib.DTYPE_BF16,
    torch.float32: _lib.DTYPE_FP32,
    torch.float64: _lib.DTYPE_FP64,
}
_HADAMARD_DIMS = (16, 32, 64, 128, 256)
_INT32_MAX = 2**31 - 1


def _check_block_size(block_size: object, seqlen: int, what: str) -> int:
    if isinstance(block_size, bool) or not isinstance(block_size, int):
        raise ValueError(f"flashattn.fp8.{what}: block_size must be an int, got {type(block_size).__name__}")
    if block_size < 1:
        raise ValueError(f"flashattn.fp8.{what}: block_size must be >= 1, got {block_size}")
    # Any block_size >= seqlen means one block per (batch, head): the C field is int32.
    return min(block_size, max(seqlen, 1), _INT32_MAX)


def _check_transform(hadamard: object, seed: object, headdim: int, what: str) -> None:
    if not isinstance(hadamard, (bool, int)) or hadamard not in (0, 1):
        raise ValueError(f"flashattn.fp8.{what}: hadamard must be a bool, got {hadamard!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**64:
        raise ValueError(f"flashattn.fp8.{what}: seed must be an int in [0, 2**64), got {seed!r}")
    if hadamard and headdim not in _HADAMARD_DIMS:
        raise ValueError(f"flashattn.fp8.{what}: hadamard=True needs headdim (the last dim) in {_HADAMARD_DIMS}, "
                         f"got {headdim}")


def _check_4d(name: str, t: object, what: str) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"flashattn.fp8.{what}: {name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != 4:
        raise ValueError(f"flashattn.fp8.{what}: {name} must have 4 dims [batch, seqlen, nheads, headdim], got shape "
                         f"{tuple(t.shape)}")
    t = t.detach()
    if t.numel() and t.stride(-1) != 1 and t.shape[-1] != 1:
        t = t.contiguous()
    if any(st < 0 for st in t.stride()):  # e.g. a flipped view
        t = t.contiguous()
    return t


_LAYOUTS = {"rows": 0, "keys_permuted16": 1}


def _check_layout(layout: object, what: str) -> int:
    if not isinstance(layout, str) or layout not in _LAYOUTS:
        raise ValueError(f"flashattn.fp8.{what}: layout must be 'rows' or 'keys_permuted16', got {layout!r}")
    return _LAYOUTS[layout]


# The params struct from x up to the options (x, x_fp8, scales, block_size, hadamard, hadamard_seed), packed in one
# call onto a copy of a cached flashattn_fp8_quantize_params_init(): this sits three times in every
# flash_attn_fp8_func call (field-by-field ctypes writes and the init call cost ~10-20 us each time).
_QUANT_BODY = struct.Struct("@P8qP8qPiiQ")
assert _lib.Fp8QuantizeParams.x.offset + _QUANT_BODY.size == _lib.Fp8QuantizeParams.options.offset
_QUANT_X_OFFSET = _lib.Fp8QuantizeParams.x.offset
_QUANT_TEMPLATE = []  # [the library's initialized params], made once


def _run(fn_name: str, x: torch.Tensor, x_fp8: torch.Tensor, scales: torch.Tensor, block_size: int, hadamard: bool,
         seed: int, layout: int = 0) -> None:
    lib = _lib.load()
    fn = getattr(lib, fn_name, None)
    if fn is None or not hasattr(lib, "flashattn_fp8_quantize_params_init"):
        raise NotImplementedError(f"flashattn.fp8: {_lib.library_path()} has no {fn_name} (older build)")
    if not _QUANT_TEMPLATE:
        _QUANT_TEMPLATE.append(lib.flashattn_fp8_quantize_params_init())
    p = _lib.Fp8QuantizeParams.from_buffer_copy(_QUANT_TEMPLATE[0])
    p.dtype = _DTYPES[x.dtype]
    xs, fs = x.stride(), x_fp8.stride()
    empty = x.numel() == 0  # x and x_fp8 have one shape
    # stride[3]: 1 for rows (a size-1 last dim may report any stride); keys_permuted16 keeps L.
    _QUANT_BODY.pack_into(p, _QUANT_X_OFFSET,
                          0 if empty else x.data_ptr(), *x.shape, xs[0], xs[1], xs[2], 1,
                          0 if empty else x_fp8.data_ptr(), *x_fp8.shape, fs[0], fs[1], fs[2], fs[3] if layout else 1,
                          scales.data_ptr() if scales.numel() else 0, block_size, int(bool(hadamard)), seed)
    p.x_fp8_layout = layout
    stream = _lib.place(p.options, x)
    _lib.raise_for_status(fn(ctypes.byref(p), stream), fn_name[len("flashattn_"):])


def quantize(x: torch.Tensor, block_size: int = 128, hadamard: bool = False,
             seed: int = 0, layout: str = "rows") -> Tuple[torch.Tensor, torch.Tensor]:
    """Quantizes x to FP8 E4M3 with one float32 scale per (batch, head, block of block_size tokens).

    Args:
        x: [batch, seqlen, nheads, headdim], float16/bfloat16/float32/float64, any strides.
        block_size: tokens per scale block (>= 1); block_size >= seqlen gives one scale per (batch, head).
        hadamard: multiply each row by the random orthogonal matrix H diag(signs) / sqrt(headdim) first
            (headdim must be 16, 32, 64, 128 or 256). Use the same seed for Q and K.
        seed: keys the random signs (an int in [0, 2**64)).
        layout: "rows" (x_fp8 contiguous like x) or "keys_permuted16": x_fp8 written straight in the layout
            `keys_permuted16()` returns (the handle for flash_attn_func(..., v_layout="keys_permuted16")), in the
            same pass: for V, this saves the separate conversion. The codes and scales are those of "rows".

    Returns:
        (x_fp8, scales): x_fp8 [batch, seqlen, nheads, headdim] torch.float8_e4m3fn (contiguous, or the
        keys_permuted16 handle), scales float32 [batch, nheads, ceil(seqlen / block_size)], contiguous.

    Raises:
        ValueError: a bad argument (the message names it).
        NotImplementedError: float64 CUDA tensors (the GPU quantizer takes fp16, bf16, fp32).
    """
    x = _check_4d("x", x, "quantize")
    if x.dtype not in _DTYPES:
        raise ValueError(f"flashattn.fp8.quantize: x dtype {x.dtype} is not supported "
                         "(float16, bfloat16, float32, float64)")
    b, s, h, d = x.shape
    bs = _check_block_size(block_size, s, "quantize")
    _check_transform(hadamard, seed, d, "quantize")
    lay = _check_layout(layout, "quantize")
    nblocks = (s + bs - 1) // bs
    if lay:
        x_fp8 = _permuted16_buffer(b, s, h, d, _round_up16(s), x.device)
    else:
        x_fp8 = _alloc((b, s, h, d), torch.float8_e4m3fn, x.device, None)
    scales = _alloc((b, h, nblocks), torch.float32, x.device, None)
    _run("flashattn_fp8_quantize", x, x_fp8, scales, bs, bool(hadamard), seed, lay)
    return x_fp8, scales


def dequantize(x_fp8: torch.Tensor, scales: torch.Tensor, block_size: int, hadamard: bool = False, seed: int = 0,
               dtype: torch.dtype = torch.float32, layout: str = "rows") -> torch.Tensor:
    """The inverse of `quantize`: scale * x_fp8 per block, then the inverse transform (when hadamard).

    Args:
        x_fp8: [batch, seqlen, nheads, headdim] torch.float8_e4m3fn, any strides.
        scales: float32 [batch, nheads, ceil(seqlen / block_size)].
        block_size, hadamard, seed: the values `quantize` was called with.
        dtype: of the result: float16/bfloat16/float32/float64.
        layout: "rows", or "keys_permuted16" for an x_fp8 in that layout (what quantize(..., layout=
            "keys_permuted16") or keys_permuted16() return), read as it is.

    Returns:
        x [batch, seqlen, nheads, headdim] in `dtype`, contiguous.
    """
    lay = _check_layout(layout, "dequantize")
    if lay and isinstance(x_fp8, torch.Tensor) and x_fp8.dim() == 4:
        x_fp8 = x_fp8.detach()  # a copy would lose keys: the C call checks the layout's strides
    else:
        x_fp8 = _check_4d("x_fp8", x_fp8, "dequantize")
    if x_fp8.dtype != torch.float8_e4m3fn:
        raise ValueError(f"flashattn.fp8.dequantize: x_fp8 must be torch.float8_e4m3fn, got {x_fp8.dtype}")
    if dtype not in _DTYPES:
        raise ValueError(f"flashattn.fp8.dequantize: dtype {dtype} is not supported (float16, bfloat16, float32, "
                         "float64)")
    b, s, h, d = x_fp8.shape
    bs = _check_block_size(block_size, s, "dequantize")
    _check_transform(hadamard, seed, d, "dequantize")
    if not isinstance(scales, torch.Tensor):
        raise ValueError(f"flashattn.fp8.dequantize: scales must be a torch.Tensor, got {type(scales).__name__}")
    if scales.dtype != torch.float32:
        raise ValueError(f"flashattn.fp8.dequantize: scales must be float32, got {scales.dtype}")
    nblocks = (s + bs - 1) // bs
    if tuple(scales.shape) != (b, h, nblocks):
        raise ValueError(f"flashattn.fp8.dequantize: scales shape {tuple(scales.shape)} does not match x_fp8 and "
                         f"block_size: expected (batch, nheads, ceil(seqlen / block_size)) = {(b, h, nblocks)}")
    if scales.device != x_fp8.device:
        raise ValueError(f"flashattn.fp8.dequantize: scales ({scales.device}) and x_fp8 ({x_fp8.device}) are on "
                         "different devices")
    scales = scales.detach().contiguous()
    x = _alloc((b, s, h, d), dtype, x_fp8.device, None)
    _run("flashattn_fp8_dequantize", x, x_fp8, scales, bs, bool(hadamard), seed, lay)
    return x


def flash_attn_fp8_func(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, softmax_scale=None, causal: bool = False,
                        window_size=(-1, -1), softcap: float = 0.0, alibi_slopes=None, hadamard: bool = True,
                        block_size: int = 128, seed: int = 0, out_dtype=None, return_attn_probs: bool = False,
                        v_layout=None):
    """FP8 attention of 16/32/64-bit q, k, v: quantize each to E4M3 with block scales, then attend.

    Q and K are quantized after the same random-sign Hadamard transform (hadamard=True, the same seed: Q K^T
    is unchanged, outliers are spread over the head dim); V without it. Every tensor gets one scale per
    (batch, head, block of block_size tokens). Then flash_attn_func(q_fp8, k_fp8, v_fp8, q_scale=..., ...)
    with the same softmax_scale (default 1/sqrt(headdim): the transform keeps headdim), masks, softcap
    and ALiBi. Forward only (inputs that require grad are refused).

    Args:
        q: (batch, seqlen_q, nheads, headdim); k, v: (batch, seqlen_k, nheads_k, headdim); float16, bfloat16,
            float32 or float64 CPU tensors, or float16/bfloat16/float32 CUDA tensors (quantized on the GPU).
        hadamard: transform Q and K first (headdim 16, 32, 64, 128 or 256).
        block_size: tokens per scale block (>= seqlen: one scale per (batch, head)).
        seed: keys the transform's random signs.
        out_dtype: torch.bfloat16 or torch.float16; default q's dtype if 16-bit, else bfloat16.
        v_layout: None (automatic), "rows" or "keys_permuted16": how the quantized V is passed on
            (flash_attn_func's v_layout). None: on CUDA, V is quantized straight into the keys_permuted16 layout
            (`quantize(v, layout="keys_permuted16")`: the same single pass, and the sm90 kernel then loads V without
            transposing it in shared memory, 5-35% faster than "rows" in s35's measurements); on the CPU in rows.
            "keys_permuted16" does the same on any device (the CPU reference gives the rows result bit for bit).
            "rows" passes V in rows (flash_attn_func's v_layout="rows": the kernel transposes V tiles in shared
            memory); the result differs from "keys_permuted16" on the GPU only by the kernel's accumulation order.

    Returns:
        out (batch, seqlen_q, nheads, headdim) in out_dtype, or (out, softmax_lse float32, None) with
        return_attn_probs=True.
    """
    from .interface import flash_attn_func

    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"flashattn.fp8.flash_attn_fp8_func: {name} must be a torch.Tensor, got {type(t).__name__}")
    if v_layout is not None and (not isinstance(v_layout, str) or v_layout not in ("rows", "keys_permuted16")):
        raise ValueError("flashattn.fp8.flash_attn_fp8_func: v_layout must be None (automatic), 'rows' or "
                         f"'keys_permuted16', got {v_layout!r}")
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
        raise RuntimeError("flashattn.fp8.flash_attn_fp8_func: FP8 attention is forward-only, but an input requires "
                           "grad: call it under torch.no_grad(), or detach the inputs")
    if out_dtype is None:
        out_dtype = q.dtype if q.dtype in (torch.float16, torch.bfloat16) else torch.bfloat16
    q_fp8, q_scale = quantize(q, block_size=block_size, hadamard=hadamard, seed=seed)
    k_fp8, k_scale = quantize(k, block_size=block_size, hadamard=hadamard, seed=seed)
    if v_layout is None:
        v_layout = "keys_permuted16" if v.is_cuda else None
    v_fp8, v_scale = quantize(v, block_size=block_size, hadamard=False,
                              layout="keys_permuted16" if v_layout == "keys_permuted16" else "rows")
    if softmax_scale is None:
        softmax_scale = q.shape[-1] ** -0.5
    return flash_attn_func(q_fp8, k_fp8, v_fp8, softmax_scale=softmax_scale, causal=causal, window_size=window_size,
                           softcap=softcap, alibi_slopes=alibi_slopes, return_attn_probs=return_attn_probs,
                           q_scale=q_scale, k_scale=k_scale, v_scale=v_scale, q_block_size=block_size,
                           k_block_size=block_size, out_dtype=out_dtype, v_layout=v_layout)


def _round_up16(n: int) -> int:
    return -(-n // 16) * 16


def keys_permuted16(v_fp8: torch.Tensor, row_len=None) -> torch.Tensor:
    """v (FP8 E4M3, [batch, seqlen_k, nheads_k, headdim]) in the layout of flash_attn_func(..., v_layout=
    "keys_permuted16"): V^T with the keys of each group of 16 permuted.

    Why: the FP8 tensor cores read P V's V operand with the keys contiguous, so the sm90 FP8 kernel transposes a v
    in rows ([b, s, h, d], d contiguous) tile by tile in shared memory, one of the two limits of its speed (the
    other is the softmax; docs/fp8.md). A v in this layout is loaded as it is, and the attention is the same. The
    cost is this function, one extra pass over V (the C library's flashattn_fp8_v_keys_permuted16: on the GPU a tiled
    transpose through shared memory, read v once, write the copy once).

    The storage is a [batch, nheads_k, headdim, L] buffer (L = row_len, default seqlen_k rounded up to 16): key j
    of (b, h, column c) sits at [b, h, c, 16 (j // 16) + perm(j % 16)], perm(8 k3 + 4 k2 + 2 k1 + k0) = 8 k2 +
    4 k1 + 2 k3 + k0 (the order of P's keys in the kernel's registers; C: fp8_v_key_position); every position that
    holds no key (in the last, partial group and up to L) is 0. The result views it with v's logical shape and
    strides (nheads_k * headdim * L, 1, headdim * L, L): a handle to pass to flash_attn_func, not a tensor to
    compute with (its element [b, j, h, c] is whatever sits at position j, and the last group's keys may lie past
    seqlen_k; .contiguous() or any copy of the view loses keys). flash_attn_func refuses a v whose strides are not
    of this form.

    Args:
        v_fp8: torch.float8_e4m3fn [batch, seqlen_k, nheads_k, headdim], CPU or CUDA, any strides (rows).
        row_len: L, a multiple of 16 >= seqlen_k rounded up to 16 (default: exactly that).

    Returns:
        torch.float8_e4m3fn of v_fp8's shape, on its device, in the layout above (a new buffer).
    """
    if not isinstance(v_fp8, torch.Tensor):
        raise ValueError(f"flashattn.fp8.keys_permuted16: v_fp8 must be a torch.Tensor, got {type(v_fp8).__name__}")
    if v_fp8.dtype != torch.float8_e4m3fn:
        raise ValueError(f"flashattn.fp8.keys_permuted16: v_fp8 must be torch.float8_e4m3fn, got {v_fp8.dtype}")
    if v_fp8.dim() != 4:
        raise ValueError("flashattn.fp8.keys_permuted16: v_fp8 must have 4 dims [batch, seqlen_k, nheads_k, headdim], "
                         f"got shape {tuple(v_fp8.shape)}")
    b, s, h, d = v_fp8.shape
    need = _round_up16(s)
    if row_len is None:
        row_len = need
    if isinstance(row_len, bool) or not isinstance(row_len, int) or row_len % 16 or row_len < need:
        raise ValueError(f"flashattn.fp8.keys_permuted16: row_len must be a multiple of 16 >= seqlen_k rounded up to "
                         f"16 = {need}, got {row_len!r}")
    lib = _lib.load()
    if not hasattr(lib, "flashattn_fp8_v_keys_permuted16"):
        raise NotImplementedError(f"flashattn.fp8.keys_permuted16: {_lib.library_path()} has no "
                                  "flashattn_fp8_v_keys_permuted16 (older build)")
    src = v_fp8.detach()
    if src.numel() and src.stride(-1) != 1 and d != 1:
        src = src.contiguous()
    if any(st < 0 for st in src.stride()):
        src = src.contiguous()
    # The C function writes every position (keyless ones 0): one pass over v (a tiled transpose on the GPU).
    out = _permuted16_buffer(b, s, h, d, row_len, v_fp8.device)
    buf = out.as_strided((b, h, d, row_len), (h * d * row_len, d * row_len, row_len, 1))
    p = lib.flashattn_fp8_v_permute_params_init()
    out_strides = (h * d * row_len, 1, d * row_len, row_len)
    for view, t, strides in ((p.v, src, src.stride()), (p.v_out, buf, out_strides)):
        view.data = t.data_ptr() if t.numel() else None
        for i in range(4):
            view.shape[i] = v_fp8.shape[i]
            view.stride[i] = strides[i]
    p.v.stride[3] = 1  # a size-1 last dim may report any stride
    stream = _lib.place(p.options, v_fp8)
    _lib.raise_for_status(lib.flashattn_fp8_v_keys_permuted16(ctypes.byref(p), stream), "fp8_v_keys_permuted16")
    return out


def _permuted16_buffer(b: int, s: int, h: int, d: int, row_len: int, device) -> torch.Tensor:
    """A [b, h, d, row_len] E4M3 buffer viewed as the keys_permuted16 handle [b, s, h, d] (strides (h d L, 1, d L,
    L)); its writer fills every position."""
    n = b * h * d * row_len  # flat: two torch calls on the usual path (this sits in every flash_attn_fp8_func call)
    if _POISON:  # tests: E4M3 NaN codes (as _alloc's NaN), so a position the writer skips shows
        buf = torch.full((n,), 0x7F, dtype=torch.uint8, device=device).view(torch.float8_e4m3fn)
    else:
        buf = torch.empty((n,), dtype=torch.float8_e4m3fn, device=device)
    return buf.as_strided((b, s, h, d), (h * d * row_len, 1, d * row_len, row_len))
