"""flashattn as a Hugging Face Transformers attn_implementation: tiny random-weight models (no downloads)
against transformers' own sdpa/eager attention. Every test counts the calls into flashattn's kernels,
so a silent fallback to another implementation fails."""

import copy

import pytest
import torch

transformers = pytest.importorskip("transformers")

import flashattn.integrations.transformers as fa_hf  # noqa: E402

VOCAB = 96
SMALL = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16, max_position_embeddings=128)


@pytest.fixture(scope="module")
def name():
    return fa_hf.register()


@pytest.fixture
def calls(monkeypatch):
    """Counts the integration's calls into the kernels: {"dense": n, "varlen": n, "q_lens": [...]}."""
    counts = {"dense": 0, "varlen": 0, "q_lens": []}
    dense, varlen = fa_hf.flash_attn_func, fa_hf.flash_attn_varlen_func

    def counting_dense(q, k, v, **kw):
        counts["dense"] += 1
        counts["q_lens"].append(q.shape[1])
        return dense(q, k, v, **kw)

    def counting_varlen(q, k, v, *args, **kw):
        counts["varlen"] += 1
        counts["q_lens"].append(q.shape[0])
        return varlen(q, k, v, *args, **kw)

    monkeypatch.setattr(fa_hf, "flash_attn_func", counting_dense)
    monkeypatch.setattr(fa_hf, "flash_attn_varlen_func", counting_varlen)
    return counts


def _pair(name, model_cls, config, reference="sdpa"):
    """(ours, reference): the same random weights, two attention implementations."""
    torch.manual_seed(0)
    ref = model_cls(config).eval()
    ref.set_attn_implementation(reference)
    ours = copy.deepcopy(ref)
    ours.set_attn_implementation(name)
    assert ours.config._attn_implementation == name
    return ours, ref


def _llama(name, **overrides):
    cfg = transformers.LlamaConfig(**{**SMALL, **overrides})
    return _pair(name, transformers.LlamaForCausalLM, cfg)


def _padding(kind, b=3, s=12):
    if kind is None:
        return None
    m = torch.ones(b, s, dtype=torch.long)
    if kind == "left":
        m[0, :5], m[1, :2] = 0, 0
    else:
        m[0, 7:], m[1, 10:] = 0, 0
    return m


def _valid(mask, shape):
    return torch.ones(shape, dtype=torch.bool) if mask is None else mask.bool()


@pytest.mark.parametrize("padding", [None, "left", "right"])
def test_llama_logits_match_sdpa(name, calls, padding):
    ours, ref = _llama(name)
    ids = torch.randint(0, VOCAB, (3, 12))
    mask = _padding(padding)
    with torch.no_grad():
        got = ours(ids, attention_mask=mask).logits
        want = ref(ids, attention_mask=mask).logits
    valid = _valid(mask, ids.shape)  # padded positions are undefined in both
    torch.testing.assert_close(got[valid], want[valid], rtol=1e-4, atol=1e-4)
    layers = ours.config.num_hidden_layers
    if padding is None:
        assert calls == {"dense": layers, "varlen": 0, "q_lens": [12] * layers}
    else:  # unpadded: the varlen path sees only the valid tokens
        assert calls["dense"] == 0 and calls["varlen"] == layers
        assert calls["q_lens"] == [int(mask.sum())] * layers


def test_llama_training_step_gradients_match_sdpa(name, calls):
    ours, ref = _llama(name)
    ids = torch.randint(0, VOCAB, (3, 12))
    mask = _padding("right")
    labels = ids.masked_fill(mask == 0, -100)
    grads = []
    for model in (ours, ref):
        model.train()
        model.zero_grad()
        loss = model(ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys() and len(grads[0]) > 0
    for n in grads[0]:
        torch.testing.assert_close(grads[0][n], grads[1][n], rtol=1e-4, atol=1e-5, msg=n)
    assert calls["varlen"] == ours.config.num_hidden_layers


def _generate(model, ids, mask, cache_implementation=None, n=8):
    out = model.generate(ids, attention_mask=mask, max_new_tokens=n, do_sample=False, output_scores=True,
                         return_dict_in_generate=True, cache_implementation=cache_implementation, pad_token_id=0)
    return out.sequences, torch.stack(out.scores)


@pytest.mark.parametrize("cache", [None, "static"])
def test_llama_greedy_generate_matches_sdpa(name, calls, cache):
    ours, ref = _llama(name)
    ids = torch.randint(1, VOCAB, (2, 9))
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[0, :3] = 0  # left padding, as generate wants
    seq, scores = _generate(ours, ids, mask, cache)
    seq_ref, scores_ref = _generate(ref, ids, mask, cache)
    assert torch.equal(seq, seq_ref)
    torch.testing.assert_close(scores, scores_ref, rtol=1e-4, atol=1e-4)
    # Prefill over 9 (padded) tokens, then one query per step against the growing KV cache.
    layers = ours.config.num_hidden_layers
    assert calls["dense"] + calls["varlen"] == 8 * layers
    assert calls["q_lens"][:layers] == [int(mask.sum())] * layers and set(calls["q_lens"][layers:]) == {2}


def test_generate_without_padding_uses_the_dense_path(name, calls):
    ours, ref = _llama(name)
    ids = torch.randint(1, VOCAB, (2, 9))
    seq, scores = _generate(ours, ids, None)
    seq_ref, scores_ref = _generate(ref, ids, None)
    assert torch.equal(seq, seq_ref)
    torch.testing.assert_close(scores, scores_ref, rtol=1e-4, atol=1e-4)
    assert calls["varlen"] == 0 and calls["dense"] == 8 * ours.config.num_hidden_layers


@pytest.mark.parametrize("padding", [None, "left", "right"])
def test_mistral_sliding_window_matches_sdpa(name, calls, padding):
    cfg = transformers.MistralConfig(**SMALL, sliding_window=4)
    ours, ref = _pair(name, transformers.MistralForCausalLM, cfg)
    ids = torch.randint(0, VOCAB, (3, 12))
    mask = _padding(padding)
    with torch.no_grad():
        got = ours(ids, attention_mask=mask).logits
        want = ref(ids, attention_mask=mask).logits
        # The window must matter at this length, or this test could not see it ignored.
        no_window, _ = _pair(name, transformers.MistralForCausalLM,
                             transformers.MistralConfig(**SMALL, sliding_window=None))
        full = no_window(ids, attention_mask=mask).logits
    valid = _valid(mask, ids.shape)
    torch.testing.assert_close(got[valid], want[valid], rtol=1e-4, atol=1e-4)
    assert (full[valid] - want[valid]).abs().max() > 1e-2
    assert calls["dense"] + calls["varlen"] == 2 * cfg.num_hidden_layers


@pytest.mark.parametrize("cache", [None, "static"])
def test_qwen2_hybrid_sliding_generate_matches_sdpa(name, calls, cache):
    # One full-attention and one sliding-window layer (window 3 < the 9-token prompt).
    cfg = transformers.Qwen2Config(**{k: v for k, v in SMALL.items() if k != "head_dim"}, use_sliding_window=True,
                                   sliding_window=3, max_window_layers=1,
                                   layer_types=["full_attention", "sliding_attention"])
    ours, ref = _pair(name, transformers.Qwen2ForCausalLM, cfg)
    ids = torch.randint(1, VOCAB, (2, 9))
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[1, :4] = 0
    seq, scores = _generate(ours, ids, mask, cache)
    seq_ref, scores_ref = _generate(ref, ids, mask, cache)
    assert torch.equal(seq, seq_ref)
    torch.testing.assert_close(scores, scores_ref, rtol=1e-4, atol=1e-4)
    assert calls["dense"] + calls["varlen"] == 8 * 2


def test_packed_sequences_by_position_ids_match_sdpa(name, calls):
    ours, ref = _llama(name)
    ids = torch.randint(0, VOCAB, (1, 12))
    position_ids = torch.tensor([[0, 1, 2, 3, 4, 0, 1, 2, 0, 1, 2, 3]])  # three sequences in one row
    with torch.no_grad():
        # use_cache=False: transformers detects packing (for sdpa's mask) only without a cache.
        got = ours(ids, position_ids=position_ids, use_cache=False).logits
        want = ref(ids, position_ids=position_ids, use_cache=False).logits
        unpacked = ours(ids[:, 5:8]).logits
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(got[:, 5:8], unpacked, rtol=1e-4, atol=1e-4)  # no attention across sequences
    assert calls["varlen"] == 2 and calls["dense"] == 2


def test_softcap_matches_eager(name, calls):
    # Gemma2: attention-logit softcapping, a softmax scale other than 1/sqrt(head_dim)
    # (query_pre_attn_scalar != head_dim) and sliding layers. Large init weights make the logits
    # large enough for the cap to change the result.
    common = dict(SMALL, sliding_window=4, query_pre_attn_scalar=24, initializer_range=0.5)
    cfg = transformers.Gemma2Config(**common, attn_logit_softcapping=1.0)
    ours, ref = _pair(name, transformers.Gemma2ForCausalLM, cfg, reference="eager")
    ids = torch.randint(0, VOCAB, (3, 10))
    mask = _padding("left", s=10)
    with torch.no_grad():
        got = ours(ids, attention_mask=mask).logits
        want = ref(ids, attention_mask=mask).logits
        cfg_nocap = transformers.Gemma2Config(**common, attn_logit_softcapping=None)
        nocap = _pair(name, transformers.Gemma2ForCausalLM, cfg_nocap, reference="eager")[1](ids, attention_mask=mask)
    valid = mask.bool()
    torch.testing.assert_close(got[valid], want[valid], rtol=1e-4, atol=1e-4)
    assert (nocap.logits[valid] - want[valid]).abs().max() > 1e-2
    assert calls["varlen"] == cfg.num_hidden_layers


def test_attention_dropout_in_training(name, calls):
    # transformers passes dropout = attention_dropout in training and 0 in eval: it runs as dropout_p.
    ours, ref = _llama(name, attention_dropout=0.1)
    ids = torch.randint(0, VOCAB, (2, 6))
    with torch.no_grad():  # eval: no dropout, the same as sdpa
        torch.testing.assert_close(ours(ids).logits, ref(ids).logits, rtol=1e-4, atol=1e-4)
        want = ref(ids).logits
    ours.train()
    torch.manual_seed(1)
    a = ours(ids).logits
    torch.manual_seed(1)
    b = ours(ids).logits
    torch.manual_seed(2)
    c = ours(ids).logits
    assert torch.equal(a, b), "the same torch seed must give the same dropout masks"
    assert not torch.allclose(a, c) and not torch.allclose(a, want), "dropout did not change the output"
    a.float().logsumexp(-1).sum().backward()  # the training step's backward, through the dropout backward
    grads = [p.grad for p in ours.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)
    assert calls["dense"] == 4 * ours.config.num_hidden_layers


def test_register_rejects_names_transformers_reserves():
    with pytest.raises(ValueError, match="flash"):
        fa_hf.register("my_flash_attn")
    with pytest.raises(ValueError, match="sdpa"):
        fa_hf.register("sdpa_like")
    with pytest.raises(ValueError, match="name"):
        fa_hf.register("has space")


def test_a_custom_name_works(calls):
    assert fa_hf.register("fattn_custom") == "fattn_custom"
    ours, ref = _llama("fattn_custom")
    ids = torch.randint(0, VOCAB, (2, 6))
    with torch.no_grad():
        torch.testing.assert_close(ours(ids).logits, ref(ids).logits, rtol=1e-4, atol=1e-4)
    assert calls["dense"] == ours.config.num_hidden_layers
