"""flashattn.install_as_flash_attn(): `import flash_attn` resolving to flashattn, flash_attn.bert_padding and
flash_attn.layers.rotary against direct references, and the refusal to shadow a real flash_attn."""

import importlib
import sys
import types

import pytest
import torch

import flashattn
from flashattn import dropin


def _flash_attn_keys():
    return [k for k in sys.modules if k == "flash_attn" or k.startswith("flash_attn.")]


@pytest.fixture(autouse=True)
def clean_modules():
    """Every test starts and ends without flash_attn* in sys.modules (the real ones, if any, come back)."""
    saved = {k: sys.modules.pop(k) for k in _flash_attn_keys()}
    yield
    for k in _flash_attn_keys():
        del sys.modules[k]
    sys.modules.update(saved)
    importlib.invalidate_caches()


@pytest.fixture
def no_real_flash_attn(monkeypatch):
    """Happy-path tests must not depend on whether this machine has the real flash_attn installed."""
    if importlib.util.find_spec("flash_attn") is not None:
        monkeypatch.setattr(dropin, "_real_flash_attn", lambda: "")


def _qkv(b=2, s=7, h=4, hk=2, d=16, dtype=torch.float32):
    return (torch.randn(b, s, h, d, dtype=dtype), torch.randn(b, s, hk, d, dtype=dtype),
            torch.randn(b, s, hk, d, dtype=dtype))


# ---- install_as_flash_attn ----------------------------------------------------------------------


def test_imports_resolve_to_flashattn(no_real_flash_attn):
    mod = flashattn.install_as_flash_attn()
    import flash_attn
    from flash_attn import (flash_attn_func, flash_attn_kvpacked_func, flash_attn_qkvpacked_func,
                            flash_attn_varlen_func, flash_attn_varlen_kvpacked_func,
                            flash_attn_varlen_qkvpacked_func, flash_attn_with_kvcache)
    from flash_attn.bert_padding import index_first_axis, pad_input, unpad_input
    from flash_attn.flash_attn_interface import flash_attn_func as fai_func
    from flash_attn.layers.rotary import apply_rotary_emb

    assert mod is flash_attn
    assert flash_attn_func is fai_func is flashattn.flash_attn_func
    assert flash_attn_varlen_func is flashattn.flash_attn_varlen_func
    assert unpad_input is flashattn.bert_padding.unpad_input
    assert index_first_axis is flashattn.bert_padding.index_first_axis
    assert apply_rotary_emb is flashattn.rotary.apply_rotary_emb
    assert pad_input is flashattn.bert_padding.pad_input

    q, k, v = _qkv()
    torch.testing.assert_close(flash_attn_func(q, k, v, causal=True), flashattn.flash_attn_func(q, k, v, causal=True),
                               rtol=0, atol=0)
    kv = torch.stack((k, v), dim=2)
    torch.testing.assert_close(flash_attn_kvpacked_func(q, kv), flashattn.flash_attn_func(q, k, v), rtol=0, atol=0)
    qkv = torch.stack(_qkv(hk=4), dim=2)
    torch.testing.assert_close(flash_attn_qkvpacked_func(qkv), flashattn.flash_attn_func(*qkv.unbind(2)), rtol=0,
                               atol=0)
    cu = torch.tensor([0, 3, 7], dtype=torch.int32)
    qf, kf, vf = (t.reshape(-1, *t.shape[2:])[:7] for t in (q, k, v))
    out = flash_attn_varlen_func(qf, kf, vf, cu, cu, 4, 4, causal=True)
    torch.testing.assert_close(out, flashattn.flash_attn_varlen_func(qf, kf, vf, cu, cu, 4, 4, causal=True), rtol=0,
                               atol=0)
    kvf = torch.stack((kf, vf), 1)
    torch.testing.assert_close(flash_attn_varlen_kvpacked_func(qf, kvf, cu, cu, 4, 4),
                               flashattn.flash_attn_varlen_func(qf, kf, vf, cu, cu, 4, 4), rtol=0, atol=0)
    qkvf = qkv.reshape(-1, *qkv.shape[2:])[:7]
    torch.testing.assert_close(flash_attn_varlen_qkvpacked_func(qkvf, cu, 4),
                               flashattn.flash_attn_varlen_func(*qkvf.unbind(1), cu, cu, 4, 4), rtol=0, atol=0)
    assert flash_attn_with_kvcache is flashattn.flash_attn_with_kvcache
    assert flash_attn.flash_attn_interface.flash_attn_with_kvcache is flashattn.flash_attn_with_kvcache
    kc, vc = torch.zeros(2, 9, 2, 16), torch.zeros(2, 9, 2, 16)
    out = flash_attn_with_kvcache(q, kc, vc, k, v, cache_seqlens=0, causal=True)  # appends in place
    assert torch.equal(kc[:, :7], k) and torch.equal(vc[:, :7], v)
    torch.testing.assert_close(out, flashattn.flash_attn_func(q, k, v, causal=True), rtol=0, atol=0)


def test_version_passes_2x_checks(no_real_flash_attn):
    flashattn.install_as_flash_attn()
    import flash_attn

    parts = tuple(int(x) for x in flash_attn.__version__.split("."))
    assert parts[0] == 2 and parts >= (2, 6, 0)  # softcap, window_size, bottom-right causal: all >= 2.6
    assert flash_attn.__flashattn_version__ == flashattn.__version__
    assert importlib.util.find_spec("flash_attn") is not None  # availability checks see a package, not an error


def test_install_is_idempotent_and_unprovided_submodules_fail(no_real_flash_attn):
    first = flashattn.install_as_flash_attn()
    assert flashattn.install_as_flash_attn() is first
    with pytest.raises(ModuleNotFoundError, match="flash_attn.ops"):
        importlib.import_module("flash_attn.ops.triton.rotary")


def test_refuses_an_imported_real_flash_attn():
    fake = types.ModuleType("flash_attn")
    fake.__file__ = "/somewhere/flash_attn/__init__.py"
    sys.modules["flash_attn"] = fake
    with pytest.raises(ImportError, match="already imported"):
        flashattn.install_as_flash_attn()
    assert sys.modules["flash_attn"] is fake  # untouched
    with pytest.raises(TypeError, match="replace_installed"):
        flashattn.install_as_flash_attn(replace_installed="yes")
    sys.modules["flash_attn.ops"] = types.ModuleType("flash_attn.ops")
    mod = flashattn.install_as_flash_attn(replace_installed=True)
    assert sys.modules["flash_attn"] is mod is not fake
    assert "flash_attn.ops" not in sys.modules  # no mix of the real package's submodules with ours


def test_refuses_an_installed_real_flash_attn(tmp_path, monkeypatch):
    pkg = tmp_path / "flash_attn"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("raise RuntimeError('the fake real flash_attn must not be imported')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    with pytest.raises(ImportError, match="installed"):
        flashattn.install_as_flash_attn()
    assert "flash_attn" not in sys.modules
    flashattn.install_as_flash_attn(replace_installed=True)
    from flash_attn.bert_padding import unpad_input  # ours, not the file on sys.path

    assert unpad_input is flashattn.bert_padding.unpad_input


# ---- bert_padding -------------------------------------------------------------------------------


def _mask(b=3, s=6):
    m = torch.zeros(b, s, dtype=torch.int64)
    m[0, :4] = 1  # right padding
    m[1, 2:] = 1  # left padding
    m[2, :] = 1   # none
    return m


def test_unpad_pad_round_trip_against_a_reference():
    from flashattn.bert_padding import index_first_axis, pad_input, unpad_input

    mask = _mask()
    x = torch.randn(3, 6, 2, 5, requires_grad=True)
    hidden, indices, cu, max_len, seqused = unpad_input(x, mask)
    # Reference: the valid rows of each sequence, in order.
    ref = torch.cat([x[b][mask[b].bool()] for b in range(3)])
    torch.testing.assert_close(hidden, ref, rtol=0, atol=0)
    assert indices.tolist() == [b * 6 + s for b in range(3) for s in range(6) if mask[b, s]]
    assert cu.dtype == torch.int32 and cu.tolist() == [0, 4, 8, 14]
    assert max_len == 6 and isinstance(max_len, int)
    assert seqused.dtype == torch.int32 and seqused.tolist() == [4, 4, 6]
    back = pad_input(hidden, indices, 3, 6)
    torch.testing.assert_close(back, x * mask[:, :, None, None], rtol=0, atol=0)
    # Gradients reach exactly the valid rows.
    back.sum().backward()
    torch.testing.assert_close(x.grad, mask[:, :, None, None].expand_as(x).float(), rtol=0, atol=0)
    flat = x.detach().reshape(18, 2, 5)
    torch.testing.assert_close(index_first_axis(flat, indices), flat[indices], rtol=0, atol=0)


def test_unpad_with_unused_mask_counts_them_in_cu_seqlens_not_seqused():
    from flashattn.bert_padding import unpad_input

    mask = _mask()
    unused = torch.zeros_like(mask)
    unused[0, 4] = 1  # allocated, unused
    hidden, indices, cu, max_len, seqused = unpad_input(torch.randn(3, 6, 4), mask, unused)
    assert cu.tolist() == [0, 5, 9, 15] and seqused.tolist() == [4, 4, 6] and hidden.shape == (15, 4)
    assert 4 in indices.tolist()


def test_unpad_for_concatenated_sequences():
    from flashattn.bert_padding import unpad_input_for_concatenated_sequences

    lens = torch.tensor([[2, 3, 0, 0, 0, 0], [6, 0, 0, 0, 0, 0]])
    x = torch.randn(2, 6, 3)
    hidden, indices, cu, max_len = unpad_input_for_concatenated_sequences(x, lens)
    assert cu.tolist() == [0, 2, 5, 11] and max_len == 6
    torch.testing.assert_close(hidden, torch.cat((x[0, :5], x[1])), rtol=0, atol=0)


def test_bert_padding_bad_input_names_the_argument():
    from flashattn.bert_padding import pad_input, unpad_input

    with pytest.raises(ValueError, match="attention_mask"):
        unpad_input(torch.randn(3, 6, 4), torch.ones(3, 5))
    with pytest.raises(ValueError, match="indices"):
        pad_input(torch.randn(4, 2), torch.arange(3), 2, 3)


# ---- apply_rotary_emb ---------------------------------------------------------------------------


def _rotary_reference(x, cos, sin, interleaved, offsets):
    """Element by element: channel pairs (i, i + half) or (2i, 2i + 1) of token t rotated by angle row t + offset."""
    out = x.clone().double()
    half = cos.shape[1]
    b_, s_, h_, _ = x.shape
    for b in range(b_):
        off = int(offsets[b]) if isinstance(offsets, torch.Tensor) else offsets
        for t in range(s_):
            c, s = cos[t + off].double(), sin[t + off].double()
            for i in range(half):
                a, bb = (2 * i, 2 * i + 1) if interleaved else (i, i + half)
                x0, x1 = x[b, t, :, a].double(), x[b, t, :, bb].double()
                out[b, t, :, a] = x0 * c[i] - x1 * s[i]
                out[b, t, :, bb] = x0 * s[i] + x1 * c[i]
    return out.to(x.dtype)


def _cos_sin(seqlen_ro, rotary_dim):
    inv = 1.0 / (10000 ** (torch.arange(0, rotary_dim, 2).float() / rotary_dim))
    freqs = torch.outer(torch.arange(seqlen_ro).float(), inv)
    return freqs.cos(), freqs.sin()


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("rotary_dim", [16, 8])  # full and partial (the rest passes through)
@pytest.mark.parametrize("offsets", [0, 3, "tensor"])
def test_apply_rotary_emb_against_the_formula(interleaved, rotary_dim, offsets):
    from flashattn.rotary import apply_rotary_emb

    x = torch.randn(2, 5, 3, 16)
    cos, sin = _cos_sin(12, rotary_dim)
    if offsets == "tensor":
        offsets = torch.tensor([0, 6], dtype=torch.int32)
    out = apply_rotary_emb(x, cos, sin, interleaved=interleaved, seqlen_offsets=offsets)
    ref = _rotary_reference(x, cos, sin, interleaved, offsets)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    assert torch.equal(out[..., rotary_dim:], x[..., rotary_dim:])
    y = x.clone()
    assert apply_rotary_emb(y, cos, sin, interleaved=interleaved, inplace=True, seqlen_offsets=offsets) is y
    torch.testing.assert_close(y, out, rtol=0, atol=0)


def test_apply_rotary_emb_varlen_and_gradient():
    from flashattn.rotary import apply_rotary_emb

    cos, sin = _cos_sin(10, 8)
    a, b = torch.randn(1, 3, 2, 8), torch.randn(1, 5, 2, 8)
    cu = torch.tensor([0, 3, 8], dtype=torch.int32)
    packed = torch.cat((a[0], b[0])).requires_grad_()
    out = apply_rotary_emb(packed, cos, sin, seqlen_offsets=torch.tensor([2, 0]), cu_seqlens=cu, max_seqlen=5)
    ref = torch.cat((_rotary_reference(a, cos, sin, False, 2)[0], _rotary_reference(b, cos, sin, False, 0)[0]))
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    # A rotation is orthogonal: the gradient of |out|^2 / 2 is the input itself.
    (out.square().sum() / 2).backward()
    torch.testing.assert_close(packed.grad, packed.detach(), rtol=1e-5, atol=1e-5)


def test_apply_rotary_emb_bad_input_names_the_argument():
    from flashattn.rotary import apply_rotary_emb

    cos, sin = _cos_sin(6, 8)
    x = torch.randn(1, 5, 2, 8)
    with pytest.raises(ValueError, match="seqlen_offsets"):
        apply_rotary_emb(x, cos, sin, seqlen_offsets=2)  # rows 2..6 of a 6-row table
    with pytest.raises(ValueError, match="rotary_dim"):
        apply_rotary_emb(torch.randn(1, 5, 2, 4), cos, sin)
    with pytest.raises(ValueError, match="max_seqlen"):
        apply_rotary_emb(x[0], cos, sin, cu_seqlens=torch.tensor([0, 5], dtype=torch.int32))


def test_torch_free_name_list_matches_the_interface():
    import flashattn
    import flashattn.interface

    assert flashattn._TORCH_API == list(flashattn.interface.__all__)
