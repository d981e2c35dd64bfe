"""ctypes binding of the flashattn C ABI (include/flashattn/flashattn.h).

Nothing here needs torch: the library is a plain C shared object, so one build serves every
torch version. The structs below mirror the header field by field; `load()` checks their
sizes against the library's own `struct_size` so a header/library mismatch fails loudly.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

# ---- enums (flashattn.h) ------------------------------------------------------------------
SUCCESS = 0
ERROR_INVALID_ARGUMENT = 1
ERROR_NOT_SUPPORTED = 2
ERROR_NO_DEVICE = 3
ERROR_CUDA = 4
ERROR_WORKSPACE = 5
ERROR_INTERNAL = 6

DTYPE_FP16 = 1
DTYPE_BF16 = 2
DTYPE_FP32 = 3
DTYPE_FP64 = 4
DTYPE_FP8_E4M3 = 5  # forward input only, with FwdParams.fp8

# FwdParams.fp8_v_layout (flashattn_fp8_v_layout): how an FP8 v is stored.
FP8_V_ROWS = 0  # as q and k: [b, s, h, d], d contiguous
FP8_V_KEYS_PERMUTED16 = 1  # V^T, keys contiguous and permuted in groups of 16 (flashattn.fp8.keys_permuted16)
FP8_V_ROWS_AUTO = 2  # rows, which the sm90 path may copy to FP8_V_KEYS_PERMUTED16 in its workspace where that pays

BACKEND_AUTO = 0
BACKEND_REFERENCE = 1
BACKEND_CPU = 2
BACKEND_SM80 = 3
BACKEND_SM90 = 4

BACKENDS = {
    "auto": BACKEND_AUTO,
    "reference": BACKEND_REFERENCE,
    "cpu": BACKEND_CPU,
    "sm80": BACKEND_SM80,
    "sm90": BACKEND_SM90,
}


class Tensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("shape", ctypes.c_int64 * 4),
        ("stride", ctypes.c_int64 * 4),
    ]


class Options(ctypes.Structure):
    _fields_ = [
        ("softmax_scale", ctypes.c_float),
        ("causal", ctypes.c_int32),
        ("window_left", ctypes.c_int32),
        ("window_right", ctypes.c_int32),
        ("softcap", ctypes.c_float),
        ("dropout_p", ctypes.c_float),
        ("deterministic", ctypes.c_int32),
        ("backend", ctypes.c_int),  # C enum
        ("device", ctypes.c_int32),
        ("num_threads", ctypes.c_int32),  # host paths' threads, 0 = the library's default
    ]


class Varlen(ctypes.Structure):
    _fields_ = [
        ("cu_seqlens_q", ctypes.c_void_p),
        ("cu_seqlens_k", ctypes.c_void_p),
        ("batch", ctypes.c_int32),
        ("max_seqlen_q", ctypes.c_int32),
        ("max_seqlen_k", ctypes.c_int32),
    ]


class KvCache(ctypes.Structure):
    """flashattn_kv_cache: KV cache / paged KV / rows appended in place / rotary (flash_attn_with_kvcache)."""

    _fields_ = [
        ("block_table", ctypes.c_void_p),  # const int32_t*: [batch, block_table_stride] page indices; NULL = contiguous
        ("block_table_stride", ctypes.c_int64),  # elements between sequences' rows of block_table
        ("max_pages", ctypes.c_int32),  # page entries per sequence (>= 1 with block_table)
        ("seqlens", ctypes.c_void_p),  # const int32_t*: end row of each sequence (cache_seqlens)
        ("leftpad", ctypes.c_void_p),  # const int32_t*: first row of each sequence (cache_leftpad)
        ("batch_idx", ctypes.c_void_p),  # const int32_t*: cache batch of each sequence (cache_batch_idx)
        ("k_new", Tensor),  # rows to append in place (data NULL = none)
        ("v_new", Tensor),
        ("rotary_cos", ctypes.c_void_p),  # [rotary_seqlen, rotary_dim / 2], q's dtype
        ("rotary_sin", ctypes.c_void_p),
        ("rotary_seqlen", ctypes.c_int64),
        ("rotary_dim", ctypes.c_int32),
        ("rotary_interleaved", ctypes.c_int32),
    ]


class Fp8Scales(ctypes.Structure):
    """flashattn_fp8_scales: the block scales of FP8 (E4M3) q/k/v and the 16-bit output dtype."""

    _fields_ = [
        ("q_scale", ctypes.c_void_p),  # const float*: contiguous [batch, nheads_q, ceil(seqlen_q / q_block_size)]
        ("k_scale", ctypes.c_void_p),  # const float*: contiguous [batch, nheads_k, ceil(seqlen_k / k_block_size)]
        ("v_scale", ctypes.c_void_p),  # const float*: as k_scale
        ("q_block_size", ctypes.c_int32),  # rows per scale block of q (>= 1)
        ("k_block_size", ctypes.c_int32),  # rows per scale block of k and v (>= 1)
        ("out_dtype", ctypes.c_int),  # C enum: DTYPE_BF16 or DTYPE_FP16
    ]


class FwdParams(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("dtype", ctypes.c_int),
        ("q", Tensor),
        ("k", Tensor),
        ("v", Tensor),
        ("out", Tensor),
        ("lse", ctypes.c_void_p),
        ("options", Options),
        ("varlen", Varlen),
        ("lse_fp64", ctypes.c_void_p),  # double*: the LSE in fp64 (float64 inputs, reference backend)
        # Dropout and ALiBi (appended after lse_fp64).
        ("dropout_seed", ctypes.c_uint64),  # Philox key, when options.dropout_p > 0
        ("dropout_offset", ctypes.c_uint64),  # Philox counter offset
        ("dropout_rng_state", ctypes.c_void_p),  # const uint64_t*: {seed, offset} read at run time (overrides)
        ("alibi_slopes", ctypes.c_void_p),  # const float*: [nheads_q] or [batch, nheads_q]
        ("alibi_batch_stride", ctypes.c_int64),  # 0 for [nheads_q], else elements between sequences
        # Inference (appended after alibi_batch_stride).
        ("kv_cache", KvCache),  # zero = plain contiguous k/v
        ("num_splits", ctypes.c_int32),  # split-KV: 0 = heuristic, 1 = never split, n > 1 = at most n
        # FP8 attention (appended after num_splits): zero unless dtype is DTYPE_FP8_E4M3.
        ("fp8", Fp8Scales),
        # Appended after fp8: v's layout for dtype DTYPE_FP8_E4M3 (FP8_V_ROWS / FP8_V_KEYS_PERMUTED16 /
        # FP8_V_ROWS_AUTO), 0 otherwise.
        ("fp8_v_layout", ctypes.c_int32),
    ]


class BwdParams(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("dtype", ctypes.c_int),
        ("q", Tensor),
        ("k", Tensor),
        ("v", Tensor),
        ("out", Tensor),
        ("dout", Tensor),
        ("lse", ctypes.c_void_p),
        ("dq", Tensor),
        ("dk", Tensor),
        ("dv", Tensor),
        ("options", Options),
        ("varlen", Varlen),
        ("lse_fp64", ctypes.c_void_p),  # const double*: the forward's fp64 LSE, in place of lse
        # Dropout and ALiBi (appended after lse_fp64): the forward's values.
        ("dropout_seed", ctypes.c_uint64),
        ("dropout_offset", ctypes.c_uint64),
        ("dropout_rng_state", ctypes.c_void_p),
        ("alibi_slopes", ctypes.c_void_p),
        ("alibi_batch_stride", ctypes.c_int64),
    ]


class CombineParams(ctypes.Structure):
    """flashattn_combine_params: merging partial attention results (split-KV, cascade)."""

    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("dtype", ctypes.c_int),
        ("num_splits", ctypes.c_int32),
        ("out_partial", ctypes.c_void_p),  # [num_splits, batch, seqlen_q, nheads, headdim]
        ("out_partial_shape", ctypes.c_int64 * 5),
        ("out_partial_stride", ctypes.c_int64 * 5),
        ("lse_partial", ctypes.c_void_p),  # const float*: [num_splits, batch, nheads, seqlen_q]
        ("lse_partial_fp64", ctypes.c_void_p),  # const double*: in place of lse_partial (fp64 only)
        ("lse_partial_stride", ctypes.c_int64 * 4),
        ("out", Tensor),
        ("lse", ctypes.c_void_p),  # float*: [batch, nheads, seqlen_q], contiguous, may be NULL
        ("lse_fp64", ctypes.c_void_p),  # double*: in place of lse (fp64 only)
        ("options", Options),
    ]


class Fp8QuantizeParams(ctypes.Structure):
    """flashattn_fp8_quantize_params: FP8 (E4M3) block quantization with the optional Hadamard transform."""

    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("dtype", ctypes.c_int),  # of x
        ("x", Tensor),  # [batch, seqlen, nheads, headdim]: quantize input / dequantize output
        ("x_fp8", Tensor),  # E4M3 bytes, the shape of x: quantize output / dequantize input
        ("scales", ctypes.c_void_p),  # float*: contiguous [batch, nheads, ceil(seqlen / block_size)]
        ("block_size", ctypes.c_int32),
        ("hadamard", ctypes.c_int32),
        ("hadamard_seed", ctypes.c_uint64),
        ("options", Options),
        ("x_fp8_layout", ctypes.c_int32),  # 0 rows, 1 keys_permuted16 (flashattn_fp8_v_layout)
    ]


class Fp8VPermuteParams(ctypes.Structure):
    """flashattn_fp8_v_permute_params: E4M3 v (rows) into the keys_permuted16 layout."""

    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("v", Tensor),  # E4M3 [batch, seqlen, nheads, headdim], headdim contiguous
        ("v_out", Tensor),  # the same shape, strides (nheads * headdim * L, 1, headdim * L, L)
        ("options", Options),
    ]


class DeviceInfo(ctypes.Structure):
    _fields_ = [
        ("device", ctypes.c_int32),
        ("cc_major", ctypes.c_int32),
        ("cc_minor", ctypes.c_int32),
        ("multiprocessors", ctypes.c_int32),
        ("fwd_backend", ctypes.c_int),
        ("bwd_backend", ctypes.c_int),
        ("name", ctypes.c_char * 128),
    ]


class FlashAttnError(RuntimeError):
    """A failing flashattn call that is neither an invalid argument nor an unsupported option."""


_LIB = None
_LIB_PATH = None


def _candidates():
    env = os.environ.get("FLASHATTN_LIBRARY")
    if env:
        # An explicit choice: no silent fallback to another build.
        return [Path(env)]
    here = Path(__file__).resolve().parent
    names = ["libflashattn.so", "libflashattn.dylib", "flashattn.dll"]
    found = [here / n for n in names]
    found += sorted(here.glob("libflashattn.so.*"))
    # Running from a source checkout (PYTHONPATH=python): the usual CMake build folders.
    root = here.parent.parent
    if (root / "CMakeLists.txt").exists():
        for build in ["build", "build-gpu", "build-cpu", "build-py"]:
            found.append(root / build / "libflashattn.so")
    return found


def load():
    """The loaded library (ctypes.CDLL), loading it on first use."""
    global _LIB, _LIB_PATH
    if _LIB is not None:
        return _LIB
    tried = []
    for path in _candidates():
        if not path.exists():
            tried.append(f"{path} (missing)")
            continue
        try:
            lib = ctypes.CDLL(str(path))
        except OSError as e:  # pragma: no cover - depends on the machine
            tried.append(f"{path} ({e})")
            continue
        _declare(lib)
        _check_abi(lib, path)
        _LIB, _LIB_PATH = lib, str(path)
        return lib
    raise ImportError(
        "flashattn: cannot load libflashattn. Install the package with `pip install .`, or set "
        "FLASHATTN_LIBRARY=/path/to/libflashattn.so (e.g. a CMake build folder). Tried: "
        + "; ".join(tried)
    )


def library_path():
    load()
    return _LIB_PATH


def _declare(lib):
    c = ctypes
    lib.flashattn_fwd_params_init.restype = FwdParams
    lib.flashattn_fwd_params_init.argtypes = []
    lib.flashattn_bwd_params_init.restype = BwdParams
    lib.flashattn_bwd_params_init.argtypes = []
    lib.flashattn_fwd_workspace_size.restype = c.c_int
    # The params as c_void_p (byref(params) or its address): a POINTER(FwdParams) argument costs ~2k CPU
    # instructions per call to convert; the C side checks params->struct_size.
    lib.flashattn_fwd_workspace_size.argtypes = [c.c_void_p, c.POINTER(c.c_size_t)]
    lib.flashattn_bwd_workspace_size.restype = c.c_int
    lib.flashattn_bwd_workspace_size.argtypes = [c.POINTER(BwdParams), c.POINTER(c.c_size_t)]
    lib.flashattn_fwd.restype = c.c_int
    lib.flashattn_fwd.argtypes = [c.c_void_p, c.c_void_p, c.c_size_t, c.c_void_p]
    lib.flashattn_bwd.restype = c.c_int
    lib.flashattn_bwd.argtypes = [c.POINTER(BwdParams), c.c_void_p, c.c_size_t, c.c_void_p]
    for name in ["flashattn_last_error", "flashattn_version"]:
        getattr(lib, name).restype = c.c_char_p
        getattr(lib, name).argtypes = []
    lib.flashattn_status_string.restype = c.c_char_p
    lib.flashattn_status_string.argtypes = [c.c_int]
    lib.flashattn_backend_name.restype = c.c_char_p
    lib.flashattn_backend_name.argtypes = [c.c_int]
    lib.flashattn_compiled_backends.restype = c.c_uint32
    lib.flashattn_compiled_backends.argtypes = []
    lib.flashattn_device_capability.restype = c.c_int
    lib.flashattn_device_capability.argtypes = [c.c_int32, c.POINTER(DeviceInfo)]
    if hasattr(lib, "flashattn_combine"):
        lib.flashattn_combine_params_init.restype = CombineParams
        lib.flashattn_combine_params_init.argtypes = []
        lib.flashattn_combine.restype = c.c_int
        lib.flashattn_combine.argtypes = [c.POINTER(CombineParams), c.c_void_p]
    if hasattr(lib, "flashattn_fp8_quantize"):
        lib.flashattn_fp8_quantize_params_init.restype = Fp8QuantizeParams
        lib.flashattn_fp8_quantize_params_init.argtypes = []
        for name in ["flashattn_fp8_quantize", "flashattn_fp8_dequantize"]:
            getattr(lib, name).restype = c.c_int
            getattr(lib, name).argtypes = [c.POINTER(Fp8QuantizeParams), c.c_void_p]
    if hasattr(lib, "flashattn_fp8_v_keys_permuted16"):
        lib.flashattn_fp8_v_permute_params_init.restype = Fp8VPermuteParams
        lib.flashattn_fp8_v_permute_params_init.argtypes = []
        lib.flashattn_fp8_v_keys_permuted16.restype = c.c_int
        lib.flashattn_fp8_v_keys_permuted16.argtypes = [c.POINTER(Fp8VPermuteParams), c.c_void_p]
    if hasattr(lib, "flashattn_sm90_set_ablation"):
        lib.flashattn_sm90_set_ablation.restype = c.c_int
        lib.flashattn_sm90_set_ablation.argtypes = [c.c_int, c.c_int]


def _check_abi(lib, path):
    checks = [(lib.flashattn_fwd_params_init, FwdParams), (lib.flashattn_bwd_params_init, BwdParams)]
    if hasattr(lib, "flashattn_combine_params_init"):
        checks.append((lib.flashattn_combine_params_init, CombineParams))
    if hasattr(lib, "flashattn_fp8_quantize_params_init"):
        checks.append((lib.flashattn_fp8_quantize_params_init, Fp8QuantizeParams))
    if hasattr(lib, "flashattn_fp8_v_permute_params_init"):
        checks.append((lib.flashattn_fp8_v_permute_params_init, Fp8VPermuteParams))
    for init, struct in checks:
        got = init().struct_size
        if got != ctypes.sizeof(struct):
            raise ImportError(
                f"flashattn: {path} reports sizeof({struct.__name__}) = {got}, the Python binding "
                f"expects {ctypes.sizeof(struct)}: the library and the package are from different versions"
            )


def place(options, t):
    """Sets options.device (and num_threads for host tensors) from tensor t; returns the stream to pass: t's
    device's current CUDA stream, or None for host tensors."""
    import torch  # this module loads the library without torch; its callers have torch already

    dev = t.device
    if dev.type == "cuda":
        index = dev.index if dev.index is not None else torch.cuda.current_device()
        options.device = index
        # The raw cudaStream_t, as _ops._raw_stream: torch.cuda.current_stream builds a Stream object per call.
        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        return raw(index) if raw is not None else torch.cuda.current_stream(dev).cuda_stream
    options.device = -1
    options.num_threads = torch.get_num_threads()
    return None


def last_error():
    return (load().flashattn_last_error() or b"").decode(errors="replace")


def status_string(status):
    return (load().flashattn_status_string(status) or b"").decode(errors="replace")


def raise_for_status(status, what, suffix=""):
    """Turns a flashattn_status into the matching Python exception, with the C message (and `suffix`)."""
    if status == SUCCESS:
        return
    msg = f"flashattn {what}: {last_error() or status_string(status)}{suffix}"
    if status == ERROR_INVALID_ARGUMENT:
        raise ValueError(msg)
    if status == ERROR_NOT_SUPPORTED:
        raise NotImplementedError(msg)
    raise FlashAttnError(f"{msg} [{status_string(status)}]")


def version():
    return load().flashattn_version().decode()


def compiled_backends():
    """Names of the backends compiled into the loaded library."""
    mask = load().flashattn_compiled_backends()
    return [name for name, i in BACKENDS.items() if i != BACKEND_AUTO and mask & (1 << i)]


def backend_id(backend):
    if isinstance(backend, int):
        return backend
    if type(backend) is str and backend in BACKENDS:  # already a lower-case name
        return BACKENDS[backend]
    try:
        return BACKENDS[str(backend).lower()]
    except KeyError:
        raise ValueError(f"backend: {backend!r} is not one of {sorted(BACKENDS)}") from None


def device_info(device=0):
    """Capability of CUDA device `device` as a dict (raises when there is none)."""
    info = DeviceInfo()
    raise_for_status(load().flashattn_device_capability(int(device), ctypes.byref(info)), "device_capability")
    lib = load()
    return {
        "device": info.device,
        "compute_capability": (info.cc_major, info.cc_minor),
        "multiprocessors": info.multiprocessors,
        "fwd_backend": lib.flashattn_backend_name(info.fwd_backend).decode(),
        "bwd_backend": lib.flashattn_backend_name(info.bwd_backend).decode(),
        "name": info.name.decode(errors="replace"),
    }


def sm90_set_ablation(pingpong=1, intra_warpgroup_overlap=1):
    """Experimental sm90 forward ablation switches (flashattn_experimental.h)."""
    lib = load()
    if not hasattr(lib, "flashattn_sm90_set_ablation"):
        raise NotImplementedError("flashattn: this library has no flashattn_sm90_set_ablation")
    raise_for_status(lib.flashattn_sm90_set_ablation(int(pingpong), int(intra_warpgroup_overlap)), "sm90_set_ablation")

