"""flashattn as a Transformers attn_implementation on the GPU, in bf16: a tiny random-weight Llama
(GQA, head dim 64) against transformers' sdpa, with padding, one training step, and greedy
generate() whose KV-cache decoding must agree with a full forward over the generated tokens.
Counts the calls into flashattn's kernels, so a silent fallback to sdpa fails."""

import copy

import pytest
import torch

transformers = pytest.importorskip("transformers")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

import flashattn  # noqa: E402
import flashattn.integrations.transformers as fa_hf  # noqa: E402

if not any(b in flashattn.compiled_backends() for b in ("sm80", "sm90")):
    pytest.skip(f"the loaded library has no GPU path (compiled: {flashattn.compiled_backends()})",
                allow_module_level=True)

DEV = "cuda"
CFG = dict(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
           num_key_value_heads=2, head_dim=64, max_position_embeddings=256)


@pytest.fixture
def calls(monkeypatch):
    counts = {"n": 0}
    dense, varlen = fa_hf.flash_attn_func, fa_hf.flash_attn_varlen_func

    def counting(fn):
        def f(*a, **kw):
            counts["n"] += 1
            return fn(*a, **kw)
        return f

    monkeypatch.setattr(fa_hf, "flash_attn_func", counting(dense))
    monkeypatch.setattr(fa_hf, "flash_attn_varlen_func", counting(varlen))
    return counts


def _pair():
    name = fa_hf.register()
    torch.manual_seed(0)
    ref = transformers.LlamaForCausalLM(transformers.LlamaConfig(**CFG)).to(DEV, torch.bfloat16).eval()
    ref.set_attn_implementation("sdpa")
    ours = copy.deepcopy(ref)
    ours.set_attn_implementation(name)
    return ours, ref


def _inputs(b=4, s=96, left_pad=True):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, CFG["vocab_size"], (b, s), generator=g).to(DEV)
    mask = torch.ones(b, s, dtype=torch.long, device=DEV)
    if left_pad:  # every row keeps tokens: a fully padded row's logits are undefined in sdpa
        mask[0, :s // 2], mask[1, :7], mask[2, :1] = 0, 0, 0
    return ids, mask


def _close(a, b, what):
    # bf16 end to end: compare relative to the logits' scale (sdpa itself is not exact either).
    err = (a.float() - b.float()).abs().max().item()
    scale = b.float().abs().max().item()
    assert err <= 0.03 * scale + 0.03, f"{what}: max |diff| {err:.4g} vs max |ref| {scale:.4g}"


@pytest.mark.parametrize("left_pad", [False, True])
def test_cuda_llama_logits_bf16_match_sdpa(calls, left_pad):
    ours, ref = _pair()
    ids, mask = _inputs(left_pad=left_pad)
    with torch.no_grad():
        lo = ours(input_ids=ids, attention_mask=mask).logits
        lr = ref(input_ids=ids, attention_mask=mask).logits
    assert calls["n"] == CFG["num_hidden_layers"]
    valid = mask.bool()
    _close(lo[valid], lr[valid], "logits")


def test_cuda_llama_training_step_bf16(calls):
    ours, ref = _pair()
    ours.train(), ref.train()
    ids, mask = _inputs()
    labels = ids.masked_fill(mask == 0, -100)
    for m in (ours, ref):
        m.zero_grad()
        m(input_ids=ids, attention_mask=mask, labels=labels).loss.backward()
    assert calls["n"] == CFG["num_hidden_layers"]
    for (n, po), (_, pr) in zip(ours.named_parameters(), ref.named_parameters()):
        _close(po.grad, pr.grad, n)


def test_cuda_llama_generate_bf16_cache_consistent(calls):
    ours, ref = _pair()
    ids, mask = _inputs(s=40)
    steps = 12
    with torch.no_grad():
        out = ours.generate(input_ids=ids, attention_mask=mask, max_new_tokens=steps, min_new_tokens=steps,
                            do_sample=False, pad_token_id=0)
    assert out.shape[1] == ids.shape[1] + steps
    assert calls["n"] >= CFG["num_hidden_layers"] * steps  # prefill + a decode step per token, per layer
    new = out[:, ids.shape[1]:]
    full_mask = torch.cat([mask, torch.ones_like(new)], dim=1)
    with torch.no_grad():
        # Teacher-forced full forwards over the generated sequence: ours and sdpa's logits at each
        # generated position agree, and the cached decode chose their argmax wherever the top-2
        # gap is well above that disagreement (bf16 noise cannot flip those).
        lo = ours(input_ids=out, attention_mask=full_mask).logits[:, ids.shape[1] - 1:-1].float()
        lr = ref(input_ids=out, attention_mask=full_mask).logits[:, ids.shape[1] - 1:-1].float()
    _close(lo, lr, "teacher-forced logits")
    noise = (lo - lr).abs().max().item()
    top2 = lr.topk(2, dim=-1).values
    clear = (top2[..., 0] - top2[..., 1]) > 4 * noise + 1e-3
    assert clear.any(), f"no generated position has a top-2 gap above 4x the noise ({noise:.3g})"
    assert torch.equal(new[clear], lr.argmax(-1)[clear]), "cached decoding chose other tokens than sdpa"
