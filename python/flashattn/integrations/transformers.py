"""Hugging Face Transformers: flashattn as an `attn_implementation`.

    import flashattn.integrations.transformers as fa_hf
    name = fa_hf.register()                       # "fattn"
    model = AutoModelForCausalLM.from_pretrained(..., attn_implementation=name)
    # or, on a loaded model: model.set_attn_implementation(name)

`register()` adds an attention function to `transformers.AttentionInterface` and a mask function to
`transformers.AttentionMaskInterface` under the same name. The mask function hands the attention a
2-D padding mask (batch, kv_length) of the keys it gets, or None when every key is valid, like
transformers' own flash path; the attention unpads padded batches and runs the varlen kernels,
so no compute is spent on padding. Causal attention is bottom-right aligned (decoding with a KV
cache: the queries are the last q_length keys). Sliding windows, GQA/MQA and softcap map onto the
kernels' options; packed sequences (batch 1, position_ids restarting, or cu_seq_lens_* kwargs)
run as varlen. Attention dropout (the `dropout` transformers passes: the model's attention_dropout in
training, 0 in eval) runs as flash_attn's dropout_p, on torch's generator. Refused with
NotImplementedError naming the option: attention sinks (s_aux), output_attentions, and
model-specific mask patterns (or/and mask functions, chunked attention).

The name must not contain "flash": transformers treats such names as its own flash-attention
implementations (it loads flash_attn or a Hub kernel for them instead of the registered function).
"""

from __future__ import annotations

import re
from typing import Any, Optional, Tuple

import torch

from ..bert_padding import index_first_axis, pad_input
from ..interface import flash_attn_func, flash_attn_varlen_func

__all__ = ["DEFAULT_NAME", "attention_forward", "attention_mask", "register"]

DEFAULT_NAME = "fattn"

# Substrings transformers gives a meaning of its own when it dispatches on the implementation's name.
_RESERVED = ("flash", "sdpa", "flex", "paged", "eager")


def _unpad_mask(mask: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, int]:
    """(indices into the flattened (batch * len), cu_seqlens int32, max_seqlen) of a 2-D bool mask."""
    lengths = mask.sum(dim=-1, dtype=torch.int32)
    indices = torch.nonzero(mask.flatten(), as_tuple=False).flatten()
    cu = torch.nn.functional.pad(torch.cumsum(lengths, dim=0, dtype=torch.int32), (1, 0))
    return indices, cu, int(lengths.max().item()) if lengths.numel() else 0


def _flat(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1, *t.shape[2:])


def _compute_dtype(query: torch.Tensor) -> Optional[torch.dtype]:
    """The dtype to run in when query's cannot run on its device (float32 on CUDA): autocast's, else None."""
    if query.device.type == "cuda" and query.dtype == torch.float32:
        if torch.is_autocast_enabled("cuda"):
            return torch.get_autocast_dtype("cuda")
        raise NotImplementedError(
            "flashattn (transformers): float32 attention on CUDA is not supported (fp16/bf16 kernels); load the "
            "model with dtype=torch.bfloat16 or torch.float16, or run it under torch.autocast")
    return None


def attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: Optional[torch.Tensor],
    dropout: float = 0.0,
    scaling: Optional[float] = None,
    sliding_window: Optional[int] = None,
    softcap: Optional[float] = None,
    is_causal: Optional[bool] = None,
    **kwargs: Any,
) -> Tuple[torch.Tensor, None]:
    """transformers' attention-function signature: query (batch, heads, q_len, d), key/value
    (batch, kv_heads, kv_len, d), attention_mask from `attention_mask()` below. Returns
    (out (batch, q_len, heads, d), None): no attention weights."""
    if kwargs.get("s_aux") is not None:
        raise NotImplementedError("flashattn (transformers): attention sinks (s_aux) are not implemented")
    if kwargs.get("output_attentions"):
        raise NotImplementedError("flashattn (transformers): output_attentions=True is not supported (the kernels "
                                  "never form the attention matrix); use attn_implementation='eager' for weights")
    if attention_mask is not None and (not isinstance(attention_mask, torch.Tensor) or attention_mask.dim() != 2):
        raise ValueError(
            "flashattn (transformers): attention_mask must be a 2-D padding mask (batch, kv_length) or None, got "
            f"{type(attention_mask).__name__} of shape {tuple(getattr(attention_mask, 'shape', ()))}: a custom 4-D "
            "mask cannot be run by flashattn's kernels")
    if is_causal is None:
        is_causal = getattr(module, "is_causal", True)
    batch, q_len = query.shape[0], query.shape[2]
    out_dtype = query.dtype
    # transformers' layout is (batch, heads, seq, d); the kernels take (batch, seq, heads, d).
    q, k, v = (t.transpose(1, 2) for t in (query, key, value))
    cast = _compute_dtype(q)
    if cast is not None:
        q, k, v = q.to(cast), k.to(cast), v.to(cast)
    d, dv = q.shape[-1], v.shape[-1]
    if dv != d:  # the kernels take one head dim for q, k and v (e.g. MLA has a smaller v): pad, crop after
        if dv > d:
            raise ValueError(f"flashattn (transformers): value head dim {dv} exceeds the query/key head dim {d}")
        v = torch.nn.functional.pad(v, (0, d - dv))
    window = (-1, -1)
    if sliding_window is not None:
        # transformers' sliding_window counts the query's own key: key j is seen when i - j < sliding_window.
        window = (int(sliding_window) - 1, int(sliding_window) - 1)
    # transformers passes dropout = attention_dropout in training and 0.0 in eval (flash_attn's dropout_p).
    opts = dict(dropout_p=float(dropout or 0.0), softmax_scale=scaling, causal=bool(is_causal), window_size=window,
                softcap=0.0 if softcap is None else float(softcap), deterministic=bool(kwargs.get("deterministic")))

    cu_q, cu_k = kwargs.get("cu_seq_lens_q"), kwargs.get("cu_seq_lens_k")
    max_q, max_k = kwargs.get("max_length_q"), kwargs.get("max_length_k")
    position_ids = kwargs.get("position_ids")
    if attention_mask is not None:
        mask = attention_mask.to(torch.bool)
        if mask.shape[0] != batch or mask.shape[1] > k.shape[1]:
            raise ValueError(f"flashattn (transformers): attention_mask has shape {tuple(mask.shape)}, expected "
                             f"(batch, <= kv_length) = ({batch}, <= {k.shape[1]})")
        if mask.shape[1] < k.shape[1]:  # a static cache's unwritten slots (see attention_mask())
            k, v = k[:, :mask.shape[1]], v[:, :mask.shape[1]]
        idx_k, cu_k, max_k = _unpad_mask(mask)
        if q_len == k.shape[1]:
            idx_q, cu_q, max_q = idx_k, cu_k, max_k
        elif is_causal:  # self-attention over a cache: the queries are the last q_len keys
            idx_q, cu_q, max_q = _unpad_mask(mask[:, -q_len:])
        else:  # cross-attention: the mask is the keys' (the encoder's); every query row is real
            idx_q, cu_q, max_q = _unpad_mask(torch.ones(batch, q_len, dtype=torch.bool, device=q.device))
        out = flash_attn_varlen_func(index_first_axis(_flat(q), idx_q), index_first_axis(_flat(k), idx_k),
                                     index_first_axis(_flat(v), idx_k), cu_q, cu_k, max_q, max_k, **opts)
        out = pad_input(out, idx_q, batch, q_len)
    elif all(x is not None for x in (cu_q, cu_k, max_q, max_k)):
        # Padding-free batches (e.g. DataCollatorWithFlattening(return_flash_attn_kwargs=True)).
        out = flash_attn_varlen_func(_flat(q), _flat(k), _flat(v), cu_q.to(torch.int32), cu_k.to(torch.int32),
                                     int(max_q), int(max_k), **opts).view(batch, q_len, *q.shape[2:])
    elif _is_packed(position_ids, batch, q_len, k.shape[1]):
        # Several sequences packed in one row, told apart by position_ids restarting (as transformers' flash path).
        pos = position_ids.reshape(-1)
        starts = torch.nonzero(pos == pos.min(), as_tuple=False).flatten().to(torch.int32)
        cu = torch.cat((starts, torch.tensor([pos.numel()], dtype=torch.int32, device=starts.device))).to(q.device)
        max_len = int(cu.diff().max().item())
        out = flash_attn_varlen_func(_flat(q), _flat(k), _flat(v), cu, cu, max_len, max_len,
                                     **opts).view(batch, q_len, *q.shape[2:])
    else:
        out = flash_attn_func(q, k, v, **opts)
    if dv != d:
        out = out[..., :dv]
    return out.to(out_dtype) if cast is not None else out, None


def _is_packed(position_ids: Optional[torch.Tensor], batch: int, q_len: int, k_len: int) -> bool:
    if position_ids is None or batch != 1 or q_len == 1 or q_len != k_len or position_ids.numel() != q_len:
        return False
    pos = position_ids.reshape(-1)
    return bool((pos.diff() != 1).any().item())


def _probe_causal(mask_function: Any) -> bool:
    """Whether transformers' mask function is a causal one (query 0 does not see key 1)."""
    if mask_function is None:
        return True
    zero, one = torch.tensor(0), torch.tensor(1)
    try:
        return not bool(mask_function(zero, zero, zero, one))
    except Exception:  # an index-only function we cannot probe: treat as causal (the common case)
        return True


def attention_mask(
    batch_size: int,
    q_length: Optional[int] = None,
    kv_length: Optional[int] = None,
    q_offset: Any = 0,
    kv_offset: int = 0,
    mask_function: Any = None,
    attention_mask: Optional[torch.Tensor] = None,
    **kwargs: Any,
) -> Optional[torch.Tensor]:
    """transformers' mask-function signature. Returns None when every key is valid, else a bool
    (batch, kv_length) mask of the valid keys (in the order the layer holds them)."""
    if kwargs.get("use_vmap"):
        # Set by transformers exactly when the model overlays its own pattern (or/and mask functions,
        # e.g. bidirectional image tokens): a 2-D padding mask cannot carry it.
        raise NotImplementedError(
            "flashattn (transformers): this model adds its own attention-mask pattern (or_mask_function / "
            "and_mask_function); flashattn runs causal, sliding-window and padding masks only")
    if "chunk" in getattr(mask_function, "__qualname__", ""):
        raise NotImplementedError("flashattn (transformers): chunked attention (attention_chunk_size) is not "
                                  "implemented")
    if q_length is None:  # transformers 4.x passes cache_position instead of q_length / q_offset
        cache_position = kwargs["cache_position"]
        q_length, q_offset = cache_position.shape[0], cache_position[0]
    device = kwargs.get("device", attention_mask.device if attention_mask is not None else None)
    mask = None
    if attention_mask is not None:
        if attention_mask.dim() != 2:
            raise ValueError("flashattn (transformers): attention_mask must be 2-D (batch, seq) padding mask, got "
                             f"shape {tuple(attention_mask.shape)}")
        # The 2-D mask covers absolute positions [0, seen + q_length): the layer holds keys
        # [kv_offset, kv_offset + kv_length) (sliding layers drop the oldest); past its end: not written.
        mask = attention_mask.to(torch.bool)
        end = kv_offset + kv_length
        if mask.shape[1] < end:
            mask = torch.nn.functional.pad(mask, (0, end - mask.shape[1]))
        mask = mask[:, kv_offset:end]
    # A static cache holds kv_length slots of which only the first `written` are filled (a dynamic
    # cache holds exactly the written keys): the mask then stops at `written` and the attention
    # drops the slots past it, so the queries are the last q_length keys again. Only for causal
    # self-attention; cross-attention keys are the encoder's.
    written = int(q_offset + q_length - kv_offset)
    if written < kv_length and _probe_causal(mask_function):
        if mask is None:
            mask = torch.ones(batch_size, written, dtype=torch.bool, device=device)
        return mask[:, :written]
    if mask is not None and bool(mask.all()):
        return None
    return mask


def register(name: str = DEFAULT_NAME) -> str:
    """Registers flashattn with transformers' AttentionInterface and AttentionMaskInterface under `name`
    and returns it, to pass as `attn_implementation=`. Idempotent."""
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z][A-Za-z0-9_]*", name):
        raise ValueError(f"flashattn: name must be an identifier-like string, got {name!r}")
    bad = [s for s in _RESERVED if s in name.lower()]
    if bad:
        raise ValueError(f"flashattn: name {name!r} contains {bad[0]!r}, which transformers reads as one of its own "
                         "attention implementations (it would not call the registered function); pick another name")
    try:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface
    except ImportError as e:
        raise ImportError("flashattn.integrations.transformers needs transformers with AttentionInterface and "
                          f"AttentionMaskInterface (pip install 'transformers>=4.57'; tested: 4.57.1, 5.24.0): {e}") from e
    AttentionInterface.register(name, attention_forward)
    AttentionMaskInterface.register(name, attention_mask)
    return name
