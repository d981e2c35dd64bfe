"""Padding helpers with flash_attn 2.x's `flash_attn.bert_padding` API (signatures and return values).

Pure torch. They turn a padded batch (batch, seqlen, ...) plus a 2-D mask into the packed
(total, ...) layout the varlen functions take, and back. `unpad_input` returns flash_attn >= 2.7's
5-tuple (hidden, indices, cu_seqlens, max_seqlen, seqused); code written against the older
4-tuple can take `[:4]`.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
import torch.nn.functional as F

__all__ = [
    "index_first_axis",
    "index_put_first_axis",
    "pad_input",
    "unpad_input",
    "unpad_input_for_concatenated_sequences",
]


def _check_indices(indices: torch.Tensor, name: str = "indices") -> None:
    if not isinstance(indices, torch.Tensor):
        raise TypeError(f"flashattn: {name} must be a torch.Tensor, got {type(indices).__name__}")
    if indices.dim() != 1 or indices.is_floating_point() or indices.dtype == torch.bool:
        raise ValueError(f"flashattn: {name} must be a 1-D integer tensor, got {indices.dtype} of shape "
                         f"{tuple(indices.shape)}")


def index_first_axis(input: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """input[indices] along the first axis: (first, ...) -> (len(indices), ...), differentiable in input."""
    if not isinstance(input, torch.Tensor) or input.dim() < 2:
        raise ValueError("flashattn: index_first_axis: input must be a tensor of at least 2 dims (first, ...), got "
                         f"{tuple(input.shape) if isinstance(input, torch.Tensor) else type(input).__name__}")
    _check_indices(indices)
    # Plain indexing: autograd's index backward (an index_put into zeros) is what flash_attn's
    # hand-written IndexFirstAxis computes.
    return input[indices]


def index_put_first_axis(values: torch.Tensor, indices: torch.Tensor, first_axis_dim: int) -> torch.Tensor:
    """zeros(first_axis_dim, ...) with rows `indices` set to `values`; differentiable in values."""
    if not isinstance(values, torch.Tensor) or values.dim() < 2:
        raise ValueError("flashattn: index_put_first_axis: values must be a tensor of at least 2 dims (total, ...)")
    _check_indices(indices)
    if indices.shape[0] != values.shape[0]:
        raise ValueError(f"flashattn: index_put_first_axis: indices has {indices.shape[0]} entries but values has "
                         f"{values.shape[0]} rows")
    output = values.new_zeros((int(first_axis_dim), *values.shape[1:]))
    return output.index_put((indices,), values)


def _check_mask(mask: torch.Tensor, hidden_states: torch.Tensor, name: str) -> None:
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"flashattn: {name} must be a torch.Tensor, got {type(mask).__name__}")
    if mask.dim() != 2 or hidden_states.dim() < 2 or tuple(mask.shape) != tuple(hidden_states.shape[:2]):
        raise ValueError(f"flashattn: {name} must have shape (batch, seqlen) = {tuple(hidden_states.shape[:2])} "
                         f"(the first two dims of hidden_states), got {tuple(mask.shape)}")


def unpad_input(
    hidden_states: torch.Tensor, attention_mask: torch.Tensor, unused_mask: Optional[torch.Tensor] = None
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, int, torch.Tensor]:
    """Packs the valid tokens of a padded batch.

    hidden_states: (batch, seqlen, ...); attention_mask: (batch, seqlen), bool/int, 1 = valid;
    unused_mask: (batch, seqlen), 1 = allocated but unused (kept in the packed tensor, not counted
    in seqused). Returns (hidden (total, ...), indices (total,) into the flattened (batch * seqlen),
    cu_seqlens int32 (batch + 1,), max_seqlen_in_batch (int), seqused int32 (batch,)).
    """
    _check_mask(attention_mask, hidden_states, "attention_mask")
    if unused_mask is not None:
        _check_mask(unused_mask, hidden_states, "unused_mask")
    all_masks = (attention_mask + unused_mask) if unused_mask is not None else attention_mask
    seqlens_in_batch = all_masks.sum(dim=-1, dtype=torch.int32)
    used_seqlens_in_batch = attention_mask.sum(dim=-1, dtype=torch.int32)
    indices = torch.nonzero(all_masks.flatten(), as_tuple=False).flatten()
    max_seqlen_in_batch = int(seqlens_in_batch.max().item()) if seqlens_in_batch.numel() else 0
    cu_seqlens = F.pad(torch.cumsum(seqlens_in_batch, dim=0, dtype=torch.int32), (1, 0))
    flat = hidden_states.reshape(-1, *hidden_states.shape[2:])
    return index_first_axis(flat, indices), indices, cu_seqlens, max_seqlen_in_batch, used_seqlens_in_batch


def unpad_input_for_concatenated_sequences(
    hidden_states: torch.Tensor, attention_mask_in_length: torch.Tensor
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """Several short samples per row: attention_mask_in_length (batch, seqlen) lists each row's
    sample lengths left-aligned, then zeros (e.g. [[2, 3, 0, 0, 0, 0], ...]); every sample becomes
    its own sequence. Returns (hidden (total, ...), indices, cu_seqlens int32, max_seqlen_in_batch)."""
    _check_mask(attention_mask_in_length, hidden_states, "attention_mask_in_length")
    length = attention_mask_in_length.sum(dim=-1)
    seqlen = attention_mask_in_length.size(-1)
    attention_mask_2d = (torch.arange(seqlen, device=length.device, dtype=length.dtype).expand(len(length), seqlen)
                         < length.unsqueeze(1))
    real_indices_idx = torch.nonzero(attention_mask_in_length.flatten(), as_tuple=False).flatten()
    seqlens_in_batch = attention_mask_in_length.flatten()[real_indices_idx]
    indices = torch.nonzero(attention_mask_2d.flatten(), as_tuple=False).flatten()
    max_seqlen_in_batch = int(seqlens_in_batch.max().item()) if seqlens_in_batch.numel() else 0
    cu_seqlens = F.pad(torch.cumsum(seqlens_in_batch, dim=0, dtype=torch.int32), (1, 0))
    flat = hidden_states.reshape(-1, *hidden_states.shape[2:])
    return index_first_axis(flat, indices), indices, cu_seqlens, max_seqlen_in_batch


def pad_input(hidden_states: torch.Tensor, indices: torch.Tensor, batch: int, seqlen: int) -> torch.Tensor:
    """Inverse of unpad_input: (total, ...) -> (batch, seqlen, ...), zeros where nothing was packed."""
    output = index_put_first_axis(hidden_states, indices, int(batch) * int(seqlen))
    return output.view(int(batch), int(seqlen), *hidden_states.shape[1:])
