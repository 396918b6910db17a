"""back_lite.integrations: the SDPA drop-in and its patch helper, Hugging Face transformers'
AttentionInterface registration, diffusers' attention processors.

Every comparison runs the model twice from the same weights, once through PyTorch's own attention
and once through BackLite (negl_prob=0: the dense backward, so outputs and gradients must agree to
fp32 rounding), and a spy on back_lite.functional.attention proves that BackLite really ran --
otherwise a routing bug would compare PyTorch with itself and pass. transformers / diffusers tests
skip when the package cannot be imported (pip install transformers diffusers).
"""
import copy
import inspect
import math
import warnings

import pytest
import torch
import torch.nn.functional as F

import back_lite
from back_lite import functional
from back_lite.integrations import sdpa as bl_sdpa

# fp32 on the CPU backend: online softmax and blocked sums differ from PyTorch's math only in
# rounding; gradients through a few layers are compared by their global relative error.
OUT_ATOL = 2e-5
GRAD_RTOL = 1e-4


@pytest.fixture
def spy(monkeypatch):
    """Counts calls of back_lite.functional.attention (the path every integration must take)."""
    calls = []
    real = functional.attention

    def counting(q, k, v, *args, **kwargs):
        calls.append(dict(q=q, k=k, v=v, kwargs=kwargs))
        return real(q, k, v, *args, **kwargs)

    monkeypatch.setattr(functional, "attention", counting)
    return calls


def bhsd(batch, heads, seqlen, dim, requires_grad=True):
    """A (B, H, S, D) tensor laid out as (B, S, H, D) underneath, as model code makes it."""
    t = torch.randn(batch, seqlen, heads, dim).transpose(1, 2)
    return t.requires_grad_(requires_grad)


def local_bhsd(batch, heads, seqlen, dim, width=24.0):
    """q, k whose attention is local along the sequence (so that a sparse backward skips tiles)."""
    pos = torch.arange(seqlen, dtype=torch.float32)
    freqs = torch.linspace(0.0, math.pi / width, dim // 2)
    feat = torch.cat([(pos[:, None] * freqs).cos(), (pos[:, None] * freqs).sin()], dim=-1)
    feat = feat * math.sqrt(12.0 * math.sqrt(dim) / (dim // 2))  # logit ~12 at distance 0
    q = feat[None, :, None] + 0.1 * torch.randn(batch, seqlen, heads, dim)
    k = feat[None, :, None] + 0.1 * torch.randn(batch, seqlen, heads, dim)
    return [t.transpose(1, 2).requires_grad_() for t in (q, k)]


def grads(out, inputs, dout):
    return torch.autograd.grad(out, inputs, dout)


def assert_close_grads(got, want):
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=OUT_ATOL, rtol=1e-4)


# ---------------------------------------------------------------------------- SDPA drop-in

@pytest.mark.parametrize("heads_q,heads_k,seqlen_q,seqlen_k,causal", [
    (2, 2, 150, 150, False),
    (4, 2, 150, 150, True),   # GQA
    (2, 1, 70, 200, True),    # MQA, Sq < Sk: PyTorch's top-left causal
    (2, 2, 200, 90, False),   # Sq > Sk, non-causal
])
def test_sdpa_matches_torch(spy, heads_q, heads_k, seqlen_q, seqlen_k, causal):
    q = bhsd(2, heads_q, seqlen_q, 64)
    k, v = bhsd(2, heads_k, seqlen_k, 64), bhsd(2, heads_k, seqlen_k, 64)
    gqa = heads_q != heads_k
    got = bl_sdpa.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa,
                                               negl_prob=0.0)
    want = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)
    assert len(spy) == 1
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, atol=OUT_ATOL, rtol=1e-4)
    dout = torch.randn_like(want)
    got_grads = grads(got, (q, k, v), dout)
    assert_close_grads(got_grads, grads(want, (q, k, v), dout))
    if causal and seqlen_q < seqlen_k:
        # keys no query can see (top-left alignment) get no gradient
        assert got_grads[1][:, :, seqlen_q:].abs().max() == 0


def test_sdpa_scale_and_float_inputs(spy):
    q, k, v = bhsd(1, 2, 100, 32), bhsd(1, 2, 100, 32), bhsd(1, 2, 100, 32)
    got = bl_sdpa.scaled_dot_product_attention(q, k, v, scale=0.3, negl_prob=0.0)
    want = F.scaled_dot_product_attention(q, k, v, scale=0.3)
    torch.testing.assert_close(got, want, atol=OUT_ATOL, rtol=1e-4)
    assert spy[0]["kwargs"]["scale"] == 0.3


def test_sdpa_passes_views_without_copies(spy):
    q, k, v = bhsd(2, 2, 130, 64), bhsd(2, 2, 130, 64), bhsd(2, 2, 130, 64)
    out = bl_sdpa.scaled_dot_product_attention(q, k, v, negl_prob=0.0)
    call = spy[0]
    for name, t in (("q", q), ("k", k), ("v", v)):
        assert call[name].data_ptr() == t.data_ptr(), f"{name} was copied"
        assert call[name].shape == t.transpose(1, 2).shape
    # the (B, Hq, Sq, D) result is a view of BackLite's (B, Sq, Hq, D) output
    assert out.transpose(1, 2).is_contiguous()


def test_sdpa_copies_only_a_non_contiguous_head_dim(spy):
    base = torch.randn(1, 2, 64, 100)  # (B, H, D, S): head dim strided
    q = base.transpose(2, 3).requires_grad_()
    k, v = bhsd(1, 2, 100, 64), bhsd(1, 2, 100, 64)
    got = bl_sdpa.scaled_dot_product_attention(q, k, v, negl_prob=0.0)
    torch.testing.assert_close(got, F.scaled_dot_product_attention(q, k, v), atol=OUT_ATOL,
                               rtol=1e-4)
    assert spy[0]["q"].stride(-1) == 1


def test_sdpa_negl_prob_reaches_the_sparse_backward():
    batch, heads, seqlen, dim = 1, 2, 512, 64
    q, k = local_bhsd(batch, heads, seqlen, dim)
    v = bhsd(batch, heads, seqlen, dim)
    negl_prob = 0.2
    out = bl_sdpa.scaled_dot_product_attention(q, k, v, negl_prob=negl_prob)
    dout = torch.randn_like(out)
    sparse = grads(out, (q, k, v), dout)
    # the same call through the library's own API, in its (B, S, H, D) layout
    direct, _, tile_mass = back_lite.attention(q.transpose(1, 2), k.transpose(1, 2),
                                               v.transpose(1, 2), negl_prob=negl_prob)
    want = grads(direct, (q, k, v), dout.transpose(1, 2))
    for g, w in zip(sparse, want):
        assert torch.equal(g, w)
    mask = back_lite.select(tile_mass, negl_prob)
    assert back_lite.backward_sparsity(mask, seqlen, seqlen, False) > 0.2  # tiles were skipped
    dense = grads(bl_sdpa.scaled_dot_product_attention(q, k, v, negl_prob=0.0), (q, k, v), dout)
    assert not torch.equal(sparse[0], dense[0])
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v), atol=OUT_ATOL,
                               rtol=1e-4)  # the forward stays exact


@pytest.mark.parametrize("kwargs,needle", [
    (dict(attn_mask=torch.ones(100, 100, dtype=torch.bool)), "attn_mask"),
    (dict(dropout_p=0.1), "dropout_p=0.1"),
])
def test_sdpa_unsupported_arguments(kwargs, needle):
    q, k, v = bhsd(1, 2, 100, 64), bhsd(1, 2, 100, 64), bhsd(1, 2, 100, 64)
    with pytest.raises(NotImplementedError, match=needle):
        bl_sdpa.scaled_dot_product_attention(q, k, v, **kwargs)


def test_sdpa_shape_errors():
    q, k = bhsd(1, 4, 100, 64), bhsd(1, 2, 100, 64)
    with pytest.raises(bl_sdpa.UnsupportedSDPACall, match="enable_gqa=True"):
        bl_sdpa.scaled_dot_product_attention(q, k, k)
    q3 = torch.randn(2, 100, 64)
    with pytest.raises(bl_sdpa.UnsupportedSDPACall, match=r"query must be 4-D .* \(2, 100, 64\)"):
        bl_sdpa.scaled_dot_product_attention(q3, q3, q3)
    q, k = bhsd(1, 2, 200, 64), bhsd(1, 2, 100, 64)
    with pytest.raises(bl_sdpa.UnsupportedSDPACall, match=r"more queries \(200\) than keys"):
        bl_sdpa.scaled_dot_product_attention(q, k, k, is_causal=True)
    v = bhsd(1, 2, 100, 32)
    with pytest.raises(bl_sdpa.UnsupportedSDPACall, match="value has head dim 32"):
        bl_sdpa.scaled_dot_product_attention(k, k, v)
    with pytest.raises(ValueError, match=r"negl_prob must be in \[0, 1\), got 1.5"):
        bl_sdpa.scaled_dot_product_attention(k, k, k, negl_prob=1.5)


def test_patch_routes_falls_back_and_restores(spy):
    torch_sdpa = F.scaled_dot_product_attention
    q, k, v = bhsd(1, 2, 100, 64), bhsd(1, 2, 100, 64), bhsd(1, 2, 100, 64)
    want = torch_sdpa(q, k, v, is_causal=True)
    with bl_sdpa.sdpa_through_back_lite(negl_prob=0.0) as counts:
        assert bl_sdpa.is_patched()
        got = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        # keyword arguments, as diffusers' native backend calls it
        got_kw = torch.nn.functional.scaled_dot_product_attention(query=q, key=k, value=v,
                                                                  is_causal=True)
        mask = torch.ones(100, 100, dtype=torch.bool)
        with pytest.warns(UserWarning, match="attn_mask is not supported"):
            masked = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert counts == {"back_lite": 2, "torch": 1}
    assert len(spy) == 2
    assert F.scaled_dot_product_attention is torch_sdpa and not bl_sdpa.is_patched()
    torch.testing.assert_close(got, want, atol=OUT_ATOL, rtol=1e-4)
    torch.testing.assert_close(got_kw, want, atol=OUT_ATOL, rtol=1e-4)
    torch.testing.assert_close(masked, torch_sdpa(q, k, v, attn_mask=mask))
    # the graph built inside the block keeps BackLite's backward after the block
    dout = torch.randn_like(want)
    assert_close_grads(grads(got, (q, k, v), dout), grads(want, (q, k, v), dout))


def test_patch_fallback_modes_and_nesting(spy):
    q = bhsd(1, 2, 100, 64)
    mask = torch.ones(100, 100, dtype=torch.bool)
    with bl_sdpa.sdpa_through_back_lite(0.1, fallback="error"):
        with pytest.raises(NotImplementedError, match="dropout_p=0.5"):
            F.scaled_dot_product_attention(q, q, q, dropout_p=0.5)
        with bl_sdpa.sdpa_through_back_lite(0.0, fallback="silent") as inner:
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                F.scaled_dot_product_attention(q, q, q, attn_mask=mask)
            F.scaled_dot_product_attention(q, q, q)
        assert inner == {"back_lite": 1, "torch": 1}
        assert spy[-1]["kwargs"]["negl_prob"] == 0.0  # the innermost settings applied
        assert bl_sdpa.is_patched()  # still inside the outer block
        F.scaled_dot_product_attention(q, q, q)
        assert spy[-1]["kwargs"]["negl_prob"] == 0.1
    assert not bl_sdpa.is_patched()
    with pytest.raises(ValueError, match="fallback must be one of"):
        with bl_sdpa.sdpa_through_back_lite(fallback="maybe"):
            pass
    assert not bl_sdpa.is_patched()


def test_kinds_the_backend_lacks_fall_back(spy):
    """A dtype or head dim the device's backend does not compute is a call BackLite cannot
    compute: the drop-in raises, the router hands it to PyTorch (here fp64 and an odd head dim on
    the CPU; on CUDA the head dims other than 64 and 128: tests/gpu)."""
    q64 = bhsd(1, 2, 100, 64).detach().double()
    q_odd = bhsd(1, 2, 100, 63)
    with pytest.raises(bl_sdpa.UnsupportedSDPACall, match="dtype torch.float64 is not supported"):
        bl_sdpa.scaled_dot_product_attention(q64, q64, q64)
    with pytest.raises(bl_sdpa.UnsupportedSDPACall, match="head_dim must be even.*got 63"):
        bl_sdpa.scaled_dot_product_attention(q_odd, q_odd, q_odd)
    with bl_sdpa.sdpa_through_back_lite(0.0) as counts:
        with pytest.warns(UserWarning, match="dtype torch.float64 is not supported.*runs PyTorch"):
            got64 = F.scaled_dot_product_attention(q64, q64, q64, is_causal=True)
        with pytest.warns(UserWarning, match="head dim 63"):
            got_odd = F.scaled_dot_product_attention(q_odd, q_odd, q_odd)
    assert counts == {"back_lite": 0, "torch": 2} and not spy
    torch.testing.assert_close(got64, F.scaled_dot_product_attention(q64, q64, q64, is_causal=True),
                               atol=0, rtol=0)
    torch.testing.assert_close(got_odd, F.scaled_dot_product_attention(q_odd, q_odd, q_odd),
                               atol=0, rtol=0)


def test_patch_restores_after_an_exception():
    with pytest.raises(RuntimeError, match="boom"):
        with bl_sdpa.sdpa_through_back_lite():
            raise RuntimeError("boom")
    assert not bl_sdpa.is_patched()


# ---------------------------------------------------------------------------- helpers


def randomize_zero_params(model, std=0.02):
    """Zero-initialised parameters (adaLN-Zero gates, zero output layers) would hide the attention
    from the gradients; give them small random values so every path carries gradient."""
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            if p.abs().max() == 0:
                p.copy_(std * torch.randn(p.shape, generator=gen))


def grad_rel_err(ref, model):
    """Global relative error of all parameter gradients; also checks every one exists."""
    num, den = 0.0, 0.0
    for (name, p), p2 in zip(ref.named_parameters(), model.parameters()):
        if p.grad is None:
            assert p2.grad is None, name
            continue
        num += float((p.grad.double() - p2.grad.double()).square().sum())
        den += float(p.grad.double().square().sum())
    assert den > 0
    return math.sqrt(num / den)


def attention_grad_norm(model, needle):
    return math.sqrt(sum(float(p.grad.square().sum()) for n, p in model.named_parameters()
                         if needle in n and p.grad is not None))


# ---------------------------------------------------------------------------- transformers


@pytest.fixture(scope="module")
def hf():
    pytest.importorskip("transformers", reason="transformers is not installed "
                                               "(pip install transformers)")
    import back_lite.integrations.transformers as bl_hf
    return bl_hf


def tiny_llama(hf, attn_implementation):
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=97, hidden_size=128, intermediate_size=192,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=512)
    model = LlamaForCausalLM(config).float()
    model.set_attn_implementation(attn_implementation)
    return model


def test_transformers_llama_matches_sdpa(hf, spy):
    name = hf.register(negl_prob=0.0)
    assert name == "back_lite"
    ref = tiny_llama(hf, "sdpa")
    model = tiny_llama(hf, name)
    model.load_state_dict(ref.state_dict())
    assert ref.config._attn_implementation == "sdpa"
    assert model.config._attn_implementation == "back_lite"
    ids = torch.randint(0, 97, (2, 150), generator=torch.Generator().manual_seed(0))
    loss_ref = ref(ids, labels=ids).loss
    loss_ref.backward()
    loss = model(ids, labels=ids).loss
    loss.backward()
    assert len(spy) == 2  # both layers ran BackLite
    call = spy[0]
    assert call["q"].shape == (2, 150, 4, 32) and call["k"].shape == (2, 150, 2, 32)  # GQA
    assert call["kwargs"]["causal"] is True
    torch.testing.assert_close(loss, loss_ref, atol=1e-5, rtol=1e-5)
    assert grad_rel_err(ref, model) < GRAD_RTOL
    assert attention_grad_norm(model, "q_proj") > 0


def test_transformers_generate_with_cache_matches_sdpa(hf, spy):
    name = hf.register(negl_prob=0.0)
    ref, model = tiny_llama(hf, "sdpa"), tiny_llama(hf, name)
    model.load_state_dict(ref.state_dict())
    prompt = torch.randint(0, 97, (2, 40), generator=torch.Generator().manual_seed(1))
    kwargs = dict(max_new_tokens=6, do_sample=False, attention_mask=torch.ones_like(prompt),
                  pad_token_id=0)
    with torch.no_grad():
        want = ref.generate(prompt, **kwargs)
        got = model.generate(prompt, **kwargs)
    assert torch.equal(got, want)
    # decoding steps: one query against the cached keys (bottom-right causal sees them all)
    assert any(c["q"].shape[1] == 1 and c["k"].shape[1] > 40 for c in spy)


def test_transformers_rejects_padding_and_dropout(hf):
    name = hf.register(negl_prob=0.05)
    model = tiny_llama(hf, name)
    ids = torch.randint(0, 97, (2, 30))
    padded = torch.ones_like(ids)
    padded[0, :4] = 0
    with pytest.raises(NotImplementedError, match="attention_mask of shape"):
        model(ids, attention_mask=padded)
    model(ids, attention_mask=torch.ones_like(ids))  # no padding: no mask reaches BackLite
    attn = model.model.layers[0].self_attn
    q = torch.randn(1, 4, 30, 32)
    kv = torch.randn(1, 2, 30, 32)
    with pytest.raises(NotImplementedError, match="dropout 0.1"):
        hf.back_lite_attention_forward(attn, q, kv, kv, None, dropout=0.1)


def test_transformers_fallback_runs_padded_batches_on_sdpa(hf, spy):
    """register(fallback="warn"): a padded batch (a mask reaches the attention) is computed by
    transformers' SDPA attention, with a warning; an unpadded one still runs BackLite. Both give
    the "sdpa" model's loss and gradients."""
    name = hf.register(negl_prob=0.0, fallback="warn")
    try:
        ref, model = tiny_llama(hf, "sdpa"), tiny_llama(hf, name)
        model.load_state_dict(ref.state_dict())
        ids = torch.randint(0, 97, (2, 30), generator=torch.Generator().manual_seed(2))
        padded = torch.ones_like(ids)
        padded[0, :4] = 0
        loss_ref = ref(ids, attention_mask=padded, labels=ids).loss
        loss_ref.backward()
        with pytest.warns(UserWarning, match="attention_mask of shape .* runs PyTorch"):
            loss = model(ids, attention_mask=padded, labels=ids).loss
        loss.backward()
        assert not spy  # no layer ran BackLite
        torch.testing.assert_close(loss, loss_ref, atol=1e-6, rtol=1e-6)
        assert grad_rel_err(ref, model) < GRAD_RTOL
        model(ids, attention_mask=torch.ones_like(ids))
        assert len(spy) == 2  # without padding: BackLite in both layers
        with pytest.raises(ValueError, match="fallback must be one of"):
            hf.register(fallback="never")
    finally:
        hf.register()  # the defaults again, for the other tests


def test_transformers_negl_prob_per_layer(hf, spy):
    name = hf.register(negl_prob=0.05)
    model = tiny_llama(hf, name)
    assert hf.set_negl_prob(model, 0.2) == 2
    ids = torch.randint(0, 97, (1, 200))
    loss = model(ids, labels=ids).loss
    loss.backward()
    assert [c["kwargs"]["negl_prob"] for c in spy] == [0.2, 0.2]
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    with pytest.raises(ValueError, match="negl_prob must be in"):
        hf.register(negl_prob=-0.1)


# ---------------------------------------------------------------------------- diffusers


@pytest.fixture(scope="module")
def dif():
    pytest.importorskip("diffusers", reason="diffusers is not installed (pip install diffusers)")
    import back_lite.integrations.diffusers as bl_dif
    return bl_dif


def compare_models(ref, model, inputs):
    out_ref = ref(**inputs).sample
    out_ref.square().mean().backward()
    out = model(**inputs).sample
    out.square().mean().backward()
    torch.testing.assert_close(out, out_ref, atol=OUT_ATOL, rtol=1e-4)
    assert grad_rel_err(ref, model) < GRAD_RTOL


def test_diffusers_dit_processor_matches_default(dif, spy):
    from diffusers import DiTTransformer2DModel
    torch.manual_seed(0)
    # 16 x 16 patches = 256 tokens: 4 query tiles x 2 key tiles
    ref = DiTTransformer2DModel(num_attention_heads=2, attention_head_dim=32, in_channels=4,
                                num_layers=1, sample_size=32, patch_size=2, norm_num_groups=1)
    randomize_zero_params(ref)
    model = copy.deepcopy(ref)
    assert dif.use_back_lite(model, negl_prob=0.0) == {"attn_processor": 1, "sdpa_wrapped": 0}
    assert isinstance(model.transformer_blocks[0].attn1.processor, dif.BackLiteAttnProcessor)
    gen = torch.Generator().manual_seed(0)
    inputs = dict(hidden_states=torch.randn(2, 4, 32, 32, generator=gen),
                  timestep=torch.tensor([10, 500]), class_labels=torch.tensor([1, 3]))
    compare_models(ref, model, inputs)
    assert len(spy) == 1 and spy[0]["q"].shape == (2, 256, 2, 32)
    assert attention_grad_norm(model, "attn1.to_q") > 0


def test_diffusers_unet_set_attn_processor(dif, spy):
    from diffusers import UNet2DConditionModel
    torch.manual_seed(0)
    ref = UNet2DConditionModel(
        sample_size=8, in_channels=4, out_channels=4, layers_per_block=1,
        block_out_channels=(32, 32), down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"), cross_attention_dim=32,
        attention_head_dim=16, norm_num_groups=8)
    randomize_zero_params(ref)
    model = copy.deepcopy(ref)
    model.set_attn_processor(dif.BackLiteAttnProcessor(negl_prob=0.0))
    gen = torch.Generator().manual_seed(0)
    inputs = dict(sample=torch.randn(2, 4, 8, 8, generator=gen), timestep=torch.tensor([10, 500]),
                  encoder_hidden_states=torch.randn(2, 7, 32, generator=gen))
    compare_models(ref, model, inputs)
    # self-attention over 8 x 8 and 4 x 4 (mid block) pixels, cross-attention over 7 text tokens
    assert {c["k"].shape[1] for c in spy} == {64, 16, 7}
    assert len(spy) == len(model.attn_processors)  # every attention module ran BackLite


def test_diffusers_wan_sdpa_wrapper_matches_default(dif, spy):
    from diffusers import WanTransformer3DModel
    torch.manual_seed(0)
    ref = WanTransformer3DModel(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=32,
                                in_channels=4, out_channels=4, text_dim=32, freq_dim=32,
                                ffn_dim=64, num_layers=1, rope_max_seq_len=64)
    randomize_zero_params(ref)
    model = copy.deepcopy(ref)
    counts = dif.use_back_lite(model, negl_prob=0.0, fallback="error")
    assert counts == {"attn_processor": 0, "sdpa_wrapped": 2}  # self- and cross-attention
    gen = torch.Generator().manual_seed(0)
    # 3 frames x 8 x 8 patches = 192 video tokens, 12 text tokens
    inputs = dict(hidden_states=torch.randn(1, 4, 3, 16, 16, generator=gen),
                  timestep=torch.tensor([300]),
                  encoder_hidden_states=torch.randn(1, 12, 32, generator=gen))
    compare_models(ref, model, inputs)
    assert sorted(c["k"].shape[1] for c in spy) == [12, 192]


def test_diffusers_processor_rejects_a_mask(dif):
    from diffusers.models.attention_processor import Attention
    attn = Attention(query_dim=32, heads=2, dim_head=16, processor=dif.BackLiteAttnProcessor())
    x = torch.randn(1, 10, 32)
    with pytest.raises(NotImplementedError, match="attention_mask of shape"):
        attn(x, attention_mask=torch.ones(1, 10, 10))
    with pytest.raises(ValueError, match="fallback must be one of"):
        dif.BackLiteAttnProcessor(fallback="sometimes")


def test_diffusers_processor_falls_back_where_asked(dif, spy):
    """fallback="warn" / "silent": a masked call runs AttnProcessor2_0 whole; q / k / v the
    backend cannot take (fp64 here; on CUDA head dims other than 64 and 128) run PyTorch's
    attention on the processor's own projections. Both give the default processor's result."""
    from diffusers.models.attention_processor import Attention, AttnProcessor2_0
    torch.manual_seed(0)
    attn = Attention(query_dim=32, heads=2, dim_head=16)
    x = torch.randn(2, 10, 32)
    mask = torch.zeros(2, 10, 10)
    mask[:, :, 7:] = -1e4  # an additive padding mask over the last 3 keys
    attn.set_processor(AttnProcessor2_0())
    want_masked = attn(x, attention_mask=mask)
    attn.set_processor(dif.BackLiteAttnProcessor(negl_prob=0.0, fallback="warn"))
    with pytest.warns(UserWarning, match="attention_mask of shape"):
        got_masked = attn(x, attention_mask=mask)
    torch.testing.assert_close(got_masked, want_masked, atol=0, rtol=0)
    assert not spy

    attn64, x64 = copy.deepcopy(attn).double(), x.double()
    attn64.set_processor(AttnProcessor2_0())
    want64 = attn64(x64)
    attn64.set_processor(dif.BackLiteAttnProcessor(negl_prob=0.0, fallback="silent"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got64 = attn64(x64)
    torch.testing.assert_close(got64, want64, atol=1e-12, rtol=1e-12)
    assert not spy
    attn64.set_processor(dif.BackLiteAttnProcessor(negl_prob=0.0))  # "error", the default
    with pytest.raises(NotImplementedError, match="dtype torch.float64 is not supported"):
        attn64(x64)

    got = attn(x)  # a call BackLite computes still runs BackLite
    assert len(spy) == 1
    attn.set_processor(AttnProcessor2_0())
    torch.testing.assert_close(got, attn(x), atol=OUT_ATOL, rtol=1e-4)


def test_diffusers_processor_falls_back_without_a_usable_backend(dif, spy, monkeypatch):
    """A device whose backend is not usable here (CUDA on a GPU other than an H100 / H200) is a
    call BackLite cannot compute too; simulated on the CPU."""
    from diffusers.models.attention_processor import Attention, AttnProcessor2_0
    torch.manual_seed(0)
    attn = Attention(query_dim=32, heads=2, dim_head=16, processor=AttnProcessor2_0())
    x = torch.randn(2, 10, 32)
    want = attn(x)
    monkeypatch.setattr(bl_sdpa, "_has_backend", lambda device: False)
    attn.set_processor(dif.BackLiteAttnProcessor(negl_prob=0.0, fallback="warn"))
    with pytest.warns(UserWarning, match="no usable backend for tensors on cpu"):
        got = attn(x)
    assert not spy
    torch.testing.assert_close(got, want, atol=0, rtol=0)


def test_diffusers_use_back_lite_passes_fallback_to_both_processors(dif):
    from diffusers.models.attention_processor import Attention
    model = torch.nn.ModuleList([Attention(query_dim=32, heads=2, dim_head=16)])
    dif.use_back_lite(model, fallback="silent")
    assert model[0].processor.fallback == "silent"
    with pytest.raises(ValueError, match="fallback must be one of"):
        dif.use_back_lite(model, fallback="loud")


def test_diffusers_wrapper_keeps_the_inner_signature_and_attributes(dif):
    from diffusers.models.attention_processor import AttnProcessor2_0

    class Inner:
        _attention_backend = None

        def __call__(self, attn, hidden_states, encoder_hidden_states=None,
                     attention_mask=None, scale_shift=1.0):
            return hidden_states * scale_shift

    wrapped = dif.BackLiteSDPAProcessor(Inner(), negl_prob=0.1)
    # diffusers drops keyword arguments the processor's __call__ does not name
    assert "scale_shift" in inspect.signature(wrapped.__call__).parameters
    assert wrapped(None, torch.ones(2), scale_shift=3.0).sum() == 6.0
    wrapped._attention_backend = "native"  # what set_attention_backend writes
    assert wrapped.inner._attention_backend == "native"
    copied = copy.deepcopy(wrapped)  # models are deep-copied with their processors
    assert copied.inner is not wrapped.inner and copied.negl_prob == 0.1
    assert copied(None, torch.ones(2), scale_shift=2.0).sum() == 4.0
    assert "scale_shift" in inspect.signature(copied.__call__).parameters
    rewrapped = dif.BackLiteSDPAProcessor(wrapped, negl_prob=0.2)
    assert isinstance(rewrapped.inner, Inner) and rewrapped.negl_prob == 0.2
    assert isinstance(dif.BackLiteSDPAProcessor(AttnProcessor2_0()).inner, AttnProcessor2_0)


def test_sdpa_drop_in_compiles_fullgraph():
    q, k, v = bhsd(1, 2, 200, 64), bhsd(1, 2, 200, 64), bhsd(1, 2, 200, 64)

    def attend(q, k, v):
        return bl_sdpa.scaled_dot_product_attention(q, k, v, is_causal=True, negl_prob=0.1)

    compiled = torch.compile(attend, fullgraph=True, backend="aot_eager")
    got = compiled(q, k, v)
    want = attend(q, k, v)
    torch.testing.assert_close(got, want, atol=0, rtol=0)
    dout = torch.randn_like(want)
    for g, w in zip(grads(got, (q, k, v), dout), grads(want, (q, k, v), dout)):
        torch.testing.assert_close(g, w, atol=0, rtol=0)
