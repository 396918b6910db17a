"""The CUDA backend against the float64 reference, on the device (skipped without one).

Exact gradient comparisons use the explicit-mask path (the mask is known on both sides); the
GPU's own selection from W is compared with the reference selection except at near-threshold
ties; larger shapes (S = 4096, D = 128, GQA) check the scheduling of many tiles."""
import math
import warnings

import pytest
import torch

import back_lite
import reference as ref
from back_lite import workspace_pool
from cuda_required import skip_module_without_cuda_backend
from determinism import deterministic_algorithms
from inputs import local_qkv, random_qkv

skip_module_without_cuda_backend()

DEV = "cuda"
DTYPES = [torch.bfloat16, torch.float16]
# (130, 256): keys filling whole 128-key tiles, where a non-causal head-dim-128 backward runs the
# causal dense walk with an unreachable diagonal (attn_bwd_sm90.cu)
LENGTHS = [(1, 1), (63, 63), (65, 130), (130, 63), (130, 130), (129, 257), (130, 256), (1000, 1000)]


def tile():
    return back_lite.tile_shape(DEV)


def lowp_autograd(q, k, v, dout, scale, causal):
    ql, kl, vl = (t.detach().clone().requires_grad_() for t in (q, k, v))
    out, _, _ = ref.attention(ql, kl, vl, scale, causal, q.dtype)
    return torch.autograd.grad(out, (ql, kl, vl), dout)


def check_forward(q, k, v, causal):
    scale = 1.0 / math.sqrt(q.shape[-1])
    out, lse, w = back_lite.forward(q, k, v, causal=causal, with_stats=True)
    out64, lse64, p64 = ref.attention(q, k, v, scale, causal)
    out_pt, lse_pt, p_pt = ref.attention(q, k, v, scale, causal, q.dtype)
    ref.check_close("out", out, out64, out_pt)
    ref.check_close("lse", lse, lse64, lse_pt)
    ref.check_close("W", w, ref.tile_mass(p64, *tile()), ref.tile_mass(p_pt.float(), *tile()))
    return out, lse, w


def check_masked_backward(got, q, k, v, out, dout, causal, mask):
    """dq, dk, dv of a masked backward against the float64 reference over the same tiles, with
    PyTorch's result in q's dtype as the error baseline."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    want = ref.backward(q, k, v, out, dout, scale, causal, mask, tile())
    base = ref.backward(q, k, v, out, dout, scale, causal, mask, tile(), q.dtype)
    for name, g, w, b in zip(("dq", "dk", "dv"), got, want, base):
        ref.check_close(name, g, w, b)


def check_random_mask_backward(q, k, v, causal, keep, generator=None):
    """The forward, a random tile mask keeping each (q head, row tile, key tile) with probability
    keep, the masked backward, and check_masked_backward on its gradients."""
    dout = torch.randn(q.shape, device=DEV).to(q.dtype)
    out, lse, _ = back_lite.forward(q, k, v, causal=causal)
    tm, tn = back_lite.num_tiles(q.shape[1], k.shape[1], DEV)
    mask = torch.rand(q.shape[0], q.shape[2], tm, tn, device=DEV, generator=generator) < keep
    got = back_lite.backward(dout, q, k, v, out, lse, mask=mask, causal=causal)
    check_masked_backward(got, q, k, v, out, dout, causal, mask)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("seqlens", LENGTHS, ids=lambda s: f"{s[0]}x{s[1]}")
def test_gpu_forward(dtype, head_dim, causal, seqlens):
    q, k, v = random_qkv(2, seqlens[0], seqlens[1], 4, 2, head_dim, dtype, DEV)
    check_forward(q, k, v, causal)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("seqlens", [(191, 191), (192, 200), (193, 1000), (400, 129), (2000, 300)],
                         ids=lambda s: f"{s[0]}x{s[1]}")
def test_gpu_forward_three_consumer_tiles(dtype, causal, seqlens):
    """Head dim 64 runs 192-row work tiles (three consumer warpgroups): lengths on both sides
    of 192 and of 2 x 192, with and without statistics; the two calls must write the same out
    and lse (the statistics only add W)."""
    q, k, v = random_qkv(2, seqlens[0], seqlens[1], 6, 3, 64, dtype, DEV)
    out, lse, _ = check_forward(q, k, v, causal)
    out2 = torch.full_like(out, float("nan"))
    lse2 = torch.full_like(lse, float("nan"))
    back_lite.forward(q, k, v, causal=causal, out=out2, lse=lse2)
    assert torch.equal(out2, out) and torch.equal(lse2, lse)


# Key tiles (128 keys) along which the scores grow, and where they jump.
GROWTH_PER_TILE = 2.0  # added to k[..., 0] per key tile: ~1.4-2 log2 units of score per tile
JUMP_AT_KEY, JUMP = 640, 40.0  # then ~20-30 log2 units at once


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_forward_growing_row_maxima(dtype, head_dim, causal):
    """Every row's scores grow along the keys, by less than 2^8 over the first five key tiles and
    by far more at one key: the lazily rescaled kernels (rescale_lazy in attn_fwd_sm90.cu) move a
    row's reference max only at the jump, run with P up to ~2^7 before it, and must still match
    the reference in out, lse and W."""
    q, k, v = random_qkv(1, 700, 1000, 4, 2, head_dim, dtype, DEV)
    ramp = (torch.arange(1000, device=DEV) // 128).float() * GROWTH_PER_TILE
    ramp[JUMP_AT_KEY:] += JUMP
    k[..., 0] = (k[..., 0].float() + ramp.view(1, -1, 1)).to(dtype)
    q[..., 0] = 4.0
    check_forward(q, k, v, causal)


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_statistics_only_add_w(head_dim, causal):
    """A forward with statistics writes the same out and lse bits as one without (each mask and
    head dim rescales the same way in both kernels)."""
    q, k, v = random_qkv(2, 300, 700, 4, 2, head_dim, torch.bfloat16, DEV)
    out, lse, _ = back_lite.forward(q, k, v, causal=causal, with_stats=True)
    out2, lse2, _ = back_lite.forward(q, k, v, causal=causal)
    assert torch.equal(out, out2) and torch.equal(lse, lse2)


def check_dense_backward(qkv, causal):
    """BackLite's dense backward (negl_prob 0, through autograd) against the float64 reference,
    with the low-precision dense autograd as the error bound's base."""
    q, k, v = qkv
    dout = torch.randn(q.shape, device=DEV).to(q.dtype)
    scale = 1.0 / math.sqrt(q.shape[-1])
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
    out = back_lite.BackLite(negl_prob=0.0)(qg, kg, vg, causal=causal)
    got = torch.autograd.grad(out, (qg, kg, vg), dout)
    want = ref.dense_autograd(q, k, v, dout, scale, causal)
    base = lowp_autograd(q, k, v, dout, scale, causal)
    for name, g, w, b in zip(("dq", "dk", "dv"), got, want, base):
        ref.check_close(name, g, w, b)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("seqlens", LENGTHS, ids=lambda s: f"{s[0]}x{s[1]}")
def test_gpu_dense_backward(dtype, head_dim, causal, seqlens):
    check_dense_backward(random_qkv(2, seqlens[0], seqlens[1], 4, 2, head_dim, dtype, DEV), causal)


@pytest.mark.parametrize("causal", [False, True])
def test_gpu_dense_backward_many_short_columns(causal):
    """Many columns of two 80-row entries (Sq = 150, 100 heads): each persistent CTA hands one
    column's dK / dV to its reducer right behind the last, so a staging hand-over that lets the
    consumers run ahead of the reducer's reads shows here. A form that did (the dQ staging ring's
    DQEMPTY completed twice per column) passed the other tests and wrote dV wrong on this shape
    in the dev checker (bench/results/bwd-s69-column-end.txt, run 7)."""
    check_dense_backward(random_qkv(1, 150, 600, 100, 100, 128, torch.bfloat16, DEV), causal)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("batch,seqlens,heads_q,heads_k", [
    (1, (2000, 2000), 8, 1), (1, (700, 1500), 16, 1), (2, (1000, 1000), 12, 2), (1, (130, 256), 8, 2)],
    ids=["mqa8", "mqa16_sq<sk", "gqa6", "gqa4_keys_full"])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_gpu_dense_backward_split_columns(dtype, causal, batch, seqlens, heads_q, heads_k, head_dim):
    """Dense calls with fewer (b, kv head, key tile) columns than SMs: each column's query heads
    go to several CTAs (bl_bwd_head_split: up to 8 parts here), whose fp32 dK / dV partials a
    reduction sums -- MQA with groups of 8 and 16, Sq < Sk, a group of 6 (2 parts), and keys
    filling whole key tiles (at head dim 128 the non-causal call's causal walk)."""
    check_dense_backward(random_qkv(batch, *seqlens, heads_q, heads_k, head_dim, dtype, DEV), causal)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("keep", [0.05, 0.5, 1.0])
@pytest.mark.parametrize("seqlens,heads_q,heads_k", [
    ((2000, 2000), 8, 1), ((900, 1024), 16, 2), ((1000, 1000), 6, 1)], ids=["mqa8", "gqa8_keys_full", "mqa6"])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_gpu_masked_backward_split_columns(causal, keep, seqlens, heads_q, heads_k, head_dim):
    """Masked calls with fewer columns than SMs split each column's query heads into parts
    (bl_bwd_head_split) on whichever kernel the device picks (at head dim 128 version 10, the
    aligned or packed 80-row walks, the dense walk for a full mask; at 64 version 6), a part's
    entries found by binary search in the column's list: masks keeping 5 % (parts without an
    entry: zero partials), 50 % and every tile; MQA with 8 and 6 (2 parts) query heads, and GQA
    with keys filling whole key tiles (the 80-row walks' KEYS_FULL forms)."""
    gen = torch.Generator(device=DEV).manual_seed(3)
    check_random_mask_backward(
        *random_qkv(1, *seqlens, heads_q, heads_k, head_dim, torch.bfloat16, DEV), causal, keep,
        generator=gen)


@pytest.mark.parametrize("sq,heads", [(8192, 5), (2000, 40)], ids=["long", "many_heads"])
@pytest.mark.parametrize("keep", [None, 0.3], ids=["dense", "mask"])
def test_gpu_causal64_rotated_walk(sq, heads, keep):
    """Head-dim-64 causal calls on the persistent version 6, whose CTAs walk the rotated snake
    (ws64p_position turns it every two rounds; causal calls since the hundred-and-fifteenth
    session): 5 heads x 64 key tiles (320 columns) and 40 heads x 16 (640; 2000 rows end inside a
    tile), so with 132 SMs the CTAs walk three to five rounds and the rotation takes effect; a
    column walked twice or never shows in dK / dV against the reference."""
    qkv = random_qkv(1, sq, sq, heads, heads, 64, torch.bfloat16, DEV)
    if keep is None:
        check_dense_backward(qkv, True)
    else:
        gen = torch.Generator(device=DEV).manual_seed(5)
        check_random_mask_backward(*qkv, True, keep, generator=gen)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("batch,seqlens,heads_q,heads_k", [
    (1, (512, 448), 136, 136), (1, (256, 32768), 4, 1)], ids=["many_units_4_keys", "mqa_16_keys"])
def test_gpu_masked_backward_lists_teams(causal, batch, seqlens, heads_q, heads_k):
    """The lists kernel's phase 2 (bl_bwd_list_kernel) splits each key tile's words among a team
    of warps, each slice written at the popcount of the slices before it: 136 heads of 4 key tiles
    (units >= 132 SMs: 256-thread CTAs, teams of 2) and MQA with 16 key tiles a unit (16 units:
    1024-thread CTAs, teams of 2), 80-row entries included; a slice written at a wrong offset
    moves list entries and breaks dQ / dK / dV against the reference."""
    gen = torch.Generator(device=DEV).manual_seed(7)
    check_random_mask_backward(
        *random_qkv(batch, *seqlens, heads_q, heads_k, 128, torch.bfloat16, DEV), causal, 0.4,
        generator=gen)


def test_gpu_masked_backward_causal64_many_columns():
    """Head-dim-64 causal calls with many columns: 120 heads x 21 key tiles (2520 columns, several
    of the schedule's windows; until the hundred-and-thirteenth session more than the 2048 counts
    the global schedule's threads held in registers) with a random mask, so a column scheduled
    twice or never shows in dK / dV against the reference."""
    gen = torch.Generator(device=DEV).manual_seed(13)
    check_random_mask_backward(
        *random_qkv(1, 130, 2600, 120, 120, 64, torch.bfloat16, DEV), True, 0.5, generator=gen)


@pytest.mark.parametrize("keep", [0.2, 0.03])
def test_gpu_masked_backward_fewer_split_parts(keep):
    """A masked causal head-dim-128 call uses fewer of its head split's parts where it keeps
    little (bl_bwd_split_parts, from the entry totals on the device): 3 x 4096 x 16 q heads x 2
    kv heads (192 columns of 512 entries) splits 4 ways dense and, by the rule, 2 / 1 ways at 20
    / 3 % kept -- records of the unused parts are skipped in the draw, each used part takes 8 /
    parts heads, and the dK / dV reduction sums only the used partials (the others may hold what
    the earlier full-mask call left there)."""
    gen = torch.Generator(device=DEV).manual_seed(5)
    q, k, v = random_qkv(3, 4096, 4096, 16, 2, 128, torch.bfloat16, DEV)
    # an earlier call that uses all 4 parts leaves its partials in the workspace's pool
    check_random_mask_backward(q, k, v, True, 1.0, generator=gen)
    check_random_mask_backward(q, k, v, True, keep, generator=gen)


@pytest.mark.parametrize("keep", [1.0, 0.1])
def test_gpu_masked_backward_fewer_split_parts_many_columns(keep):
    """The same between two and four columns per SM (bench/results/bwd-s79-split-sweep.txt):
    3 x 4096 x 12 q heads x 3 kv heads (288 columns of 256 entries) splits 4 ways unmasked and,
    by the device's rule, 2 ways with every tile kept and 1 at 10 % -- after an unmasked call
    that used all 4 parts and left their partials in the workspace's pool."""
    gen = torch.Generator(device=DEV).manual_seed(11)
    q, k, v = random_qkv(3, 4096, 4096, 12, 3, 128, torch.bfloat16, DEV)
    dout = torch.randn(q.shape, device=DEV).to(q.dtype)
    out, lse, _ = back_lite.forward(q, k, v, causal=True)
    back_lite.backward(dout, q, k, v, out, lse, causal=True)
    check_random_mask_backward(q, k, v, True, keep, generator=gen)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_explicit_mask_backward(dtype, head_dim, causal):
    check_random_mask_backward(*random_qkv(2, 300, 520, 4, 2, head_dim, dtype, DEV), causal, 0.5)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("negl_prob", [0.02, 0.1, 0.3])
def test_gpu_sparse_backward(dtype, causal, negl_prob):
    q, k, v = local_qkv(1, 1024, 4, 2, 128, dtype, DEV, sharpness=8.0)
    dout = torch.randn(q.shape, device=DEV).to(dtype)
    out, lse, w = back_lite.forward(q, k, v, causal=causal, with_stats=True)
    mask = back_lite.select(w, negl_prob)
    want_mask, ambiguous = ref.select(w, negl_prob)
    assert torch.equal(mask | ambiguous, want_mask | ambiguous)
    assert back_lite.backward_sparsity(mask, 1024, 1024, causal) > 0.1
    got = back_lite.backward(dout, q, k, v, out, lse, tile_mass=w, negl_prob=negl_prob,
                             causal=causal)
    explicit = back_lite.backward(dout, q, k, v, out, lse, mask=mask, causal=causal)
    scale = 1.0 / math.sqrt(128)
    want = ref.backward(q, k, v, out, dout, scale, causal, mask, tile())
    base = ref.backward(q, k, v, out, dout, scale, causal, mask, tile(), dtype)
    for name, g, e, w, b in zip(("dq", "dk", "dv"), got, explicit, want, base):
        ref.check_close(name, g, w, b)
        ref.check_close(name + " (explicit mask)", e, w, b)


def test_gpu_select_matches_reference():
    w = torch.rand(3, 8, 40, 70, device=DEV) ** 4
    w[0, 0, 0] = 0.0
    w[0, 0, 1, 3] = math.nan
    for negl_prob in (0.0, 0.01, 0.1, 0.5, 0.9):
        got = back_lite.select(w, negl_prob)
        want, ambiguous = ref.select(w, negl_prob)
        assert torch.equal(got | ambiguous, want | ambiguous), negl_prob


@pytest.mark.parametrize("tiles_n", [1, 7, 33, 100, 256, 300, 1024, 1100])
def test_gpu_select_is_the_cpu_rule_bit_for_bit(tiles_n):
    """The GPU selection against the CPU backend's, mask for mask: one warp per row up to 1024
    key tiles (1 to 32 keys per lane; its parallel decision only where it provably agrees with
    the sequential sums), a shared-memory sort beyond. Rows with ties, zeros, running sums that
    meet negl_prob exactly (constant rows at 0.25 / 0.5), NaN, inf and a negative value."""
    g = torch.Generator().manual_seed(tiles_n)
    w = torch.rand(2, 3, 6, tiles_n, generator=g) ** 4
    w[0, 0, 1] = 1.0
    w[0, 0, 2] = (torch.rand(tiles_n, generator=g) * 4).floor() / 64
    w[0, 1, 0] = 0.0
    w[0, 1, 1, tiles_n // 2] = math.nan
    w[0, 1, 2, tiles_n // 3] = math.inf
    w[0, 1, 3, tiles_n - 1] = -1.0
    for negl_prob in (0.0, 0.01, 0.25, 0.3, 0.5, 0.9):
        want = back_lite.select(w, negl_prob)
        got = back_lite.select(w.to(DEV), negl_prob).cpu()
        assert torch.equal(got, want), (negl_prob, (got != want).nonzero()[:5].tolist())


@pytest.mark.parametrize("shape", [(1, 16, 256, 128), (1, 8, 512, 256), (1, 24, 512, 256)],
                         ids=["16kx16", "32kx8", "32kx24"])
def test_gpu_select_many_rows_bit_for_bit(shape):
    """Row tiles by the thousand: on an H200 (132 SMs) the first two take the warp kernel's
    capped grid, each warp selecting rows in turn, and the bench's 32k x 24 its grid of one CTA
    per 4 rows in several waves (launch_select_warp); every row (128 or 256 key tiles) is decided
    by the sort-free search (select_warp_row_search), the sort where it cannot -- the same masks as
    the CPU rule, row for row."""
    g = torch.Generator().manual_seed(shape[-1])
    w = torch.rand(*shape, generator=g) ** 6
    w[0, 0, 7] = 0.0
    w[0, 1, 3] = 1.0
    for negl_prob in (0.01, 0.2, 0.5):
        want = back_lite.select(w, negl_prob)
        got = back_lite.select(w.to(DEV), negl_prob).cpu()
        assert torch.equal(got, want), (negl_prob, (got != want).nonzero()[:5].tolist())


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("sq, keep", [(3000, 0.6), (3000, 0.97), (160, 0.95)])
@pytest.mark.parametrize("keys_fill_tiles", [False, True], ids=["sk_partial", "sk_whole"])
def test_gpu_masked_80_row_entries(dtype, sq, keep, keys_fill_tiles):
    """Masked head-dim-128 calls without a causal mask that the device runs on 80-row entries,
    4 query heads on one K / V head: at 60 % kept packed ones (a key tile's kept 64-row tiles end
    to end: ~110 of them per key tile here, so the rule picks packed entries whatever the
    rounding -- the dev checker's packed cases assert that pick); at 97 % packed and aligned
    entries are about as many (either may run); three-tile columns at 95 % take aligned ones (the
    dev checker's case that asserts it). Sq is a multiple of neither 64 nor 80 in the first two
    (padding rows from past the sequence end). Sk ends inside its last 128-key tile, or fills it
    (the same number of key tiles, so the same pick): then the walks without key-limit selects
    run (KEYS_FULL in bwd_ws128r80_sm90.cuh)."""
    sk = (384 if keys_fill_tiles else 300) if sq > 1000 else (768 if keys_fill_tiles else 700)
    check_random_mask_backward(*random_qkv(1, sq, sk, 4, 1, 128, dtype, DEV), False, keep)


@pytest.mark.parametrize("causal, sk", [(False, 900), (False, 1024), (True, 8000)],
                         ids=["sk_partial", "sk_whole", "causal"])
def test_gpu_masked_packed_one_head(causal, sk):
    """Masked head-dim-128 calls with one query head per kv head whose columns hold ~100 kept
    64-row tiles (Sq = 8000 at 80 % kept), as the bench's 16k calls do: the rule picks packed
    80-row entries, whose producer and reducer take a list code as the row tile itself where the
    group is one head (ws_split_code: no division). Without a causal mask Sk ends inside its last
    key tile or fills it (the KEYS_FULL walk); with one, each piece has its own diagonal."""
    check_random_mask_backward(*random_qkv(1, 8000, sk, 2, 2, 128, torch.bfloat16, DEV), causal,
                               0.8, torch.Generator(device=DEV).manual_seed(3))


def test_gpu_nan_row_in_a_dropped_tile_stays_out():
    """A NaN query row whose 64-row tile the mask drops in every key tile, beside kept tiles that
    share its 80-row tile: the call runs aligned 80-row entries (3-tile columns: 8 aligned
    entries against 9 packed and 11 of 64 rows), which load that row with the kept one. It must
    add nothing: the gradients are finite and those of the same call with the row zeroed -- dK
    and dV bit for bit (one CTA sums a column in a fixed order), dQ to rounding (fp32 reduce-adds
    from the key tiles' CTAs in varying order: asserted bit for bit, it failed now and then on
    the H200, bench/results/bwd-s35-causal.txt run 2)."""
    q, k, v = random_qkv(1, 160, 700, 4, 1, 128, torch.bfloat16, DEV)
    dout = torch.randn(q.shape, device=DEV).to(torch.bfloat16)
    tm, tn = back_lite.num_tiles(160, 700, DEV)
    mask = torch.ones(1, 4, tm, tn, dtype=torch.bool, device=DEV)
    mask[0, 0, 1] = False  # head 0, rows 64..127, every key tile
    out, lse, _ = back_lite.forward(q, k, v)
    q[0, 70, 0] = math.nan
    got = back_lite.backward(dout, q, k, v, out, lse, mask=mask)
    q[0, 70, 0] = 0.0
    want = back_lite.backward(dout, q, k, v, out, lse, mask=mask)
    for name, g, w in zip(("dq", "dk", "dv"), got, want):
        assert torch.isfinite(g).all(), name
        if name == "dq":
            torch.testing.assert_close(g, w, rtol=1e-2, atol=1e-2)
        else:
            assert torch.equal(g, w), name


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_gpu_masked_causal_packed_entries(dtype):
    """A masked causal head-dim-128 call on packed 80-row entries, where each entry's two pieces
    have their own diagonal: 16 query heads on one K / V head and Sq < Sk (columns of up to ~200
    kept 64-row tiles, the dev checker's causal packed case that asserts the pick); Sq a
    multiple of neither 64 nor 80."""
    check_random_mask_backward(*random_qkv(1, 1000, 2000, 16, 1, 128, dtype, DEV), True, 0.8)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("sq, sk, keep, diagonal", [
    (2048, 2048, 0.03, False), (256, 8192, 0.1, False), (2048, 2000, 0.05, False),
    (2048, 2048, 0.03, True)], ids=["direct", "plain_sq_lt_sk", "sk_partial", "diagonal_kept"])
def test_gpu_causal_version10_low_keeps(dtype, sq, sk, keep, diagonal):
    """Masked causal head-dim-128 calls with one query head per kv head at low keeps, which run
    on version 10 (bwd_ws128_sm90.cuh): about one entry per row tile takes its direct-dQ form;
    Sq = 256 against Sk = 8192 puts ~6 entries on each row tile (the form with dQ reduce-adds)
    and the diagonal in the last key tiles; Sk = 2000 ends inside its last key tile; and a mask
    that keeps every tile the diagonal crosses (each column's first entry then needs the mask)."""
    q, k, v = random_qkv(1, sq, sk, 2, 2, 128, dtype, DEV)
    dout = torch.randn(q.shape, device=DEV).to(dtype)
    out, lse, _ = back_lite.forward(q, k, v, causal=True)
    tm, tn = back_lite.num_tiles(sq, sk, DEV)
    gen = torch.Generator(device=DEV).manual_seed(2)
    mask = torch.rand(1, 2, tm, tn, device=DEV, generator=gen) < keep
    if diagonal:
        bm, bn = tile()
        for m in range(tm):  # the key tile holding the row tile's last query's diagonal key
            mask[0, :, m, min((m * bm + bm - 1 + sk - sq) // bn, tn - 1)] = True
    got = back_lite.backward(dout, q, k, v, out, lse, mask=mask, causal=True)
    check_masked_backward(got, q, k, v, out, dout, True, mask)


def light_and_heavy_rows_mask(heads, sq, sk, causal, generator, counts=(0, 1, 2, 5, 16, 17)):
    """A (1, heads, Tm, Tn) tile mask whose row tiles keep `counts` (in turn: by default 0, 1, 2,
    5, 16 or 17) of the key tiles the causal mask allows them (chosen at random), and every 16th
    row tile all of them."""
    tm, tn = back_lite.num_tiles(sq, sk, DEV)
    bm, bn = tile()
    mask = torch.zeros(1, heads, tm, tn, dtype=torch.bool)
    for h in range(heads):
        for m in range(tm):
            # with a causal mask: the key tiles up to the one holding the tile's last diagonal key
            allowed = tn if not causal else min(tn, (min(m * bm + bm, sq) - 1 + sk - sq) // bn + 1)
            c = allowed if m % 16 == 15 else min(counts[(m + h) % len(counts)], allowed)
            mask[0, h, m, torch.randperm(allowed, generator=generator)[:c]] = True
    return mask.to(DEV)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_direct_light_and_heavy_row_tiles(dtype, causal):
    """Version 10's DIRECT form (masked head-dim-128 calls averaging at most 16.5 entries a row
    tile): a light row tile's entries (at most 16, bl_bwd_dq16_tile) put their dQ in dq in 16-bit
    -- stored by a tile's only entry, added onto the preprocess's zeros by the others -- while a
    heavier tile's add into the fp32 accumulator, which the postprocess converts. One call with
    tiles of 0, 1, 2, 5, 16, 17 and all 32 entries; Sq ends inside its last row tile."""
    q, k, v = random_qkv(1, 4000, 4096, 4, 4, 128, dtype, DEV)
    dout = torch.randn(q.shape, device=DEV).to(dtype)
    out, lse, _ = back_lite.forward(q, k, v, causal=causal)
    mask = light_and_heavy_rows_mask(4, 4000, 4096, causal, torch.Generator().manual_seed(3))
    assert mask.sum(-1).float().mean() <= 16.5  # the DIRECT form's gate
    got = back_lite.backward(dout, q, k, v, out, lse, mask=mask, causal=causal)
    check_masked_backward(got, q, k, v, out, dout, causal, mask)


@pytest.mark.parametrize("head_dim, seed", [(128, 4), (64, 6)])
def test_gpu_direct_and_other_picks_in_turn(head_dim, seed):
    """The preprocess's zero CTAs write dq's 16-bit zeros only where the device's pick for the
    call says DIRECT (bl_bwd_workspace::zeros_pick, reset by the lists kernel), and the
    conversion skips the light tiles only then: calls of one shape that pick the DIRECT form (3 %
    kept, ~1 entry a row tile; at head dim 64 the persistent kernel's DQ16 form) and another
    kernel or form (70 %, ~22 entries: past the gate) in turn, in one workspace, each against the
    reference -- a pick left over from the call before would leave the other kind's zeros
    unwritten."""
    q, k, v = random_qkv(1, 2048, 4096, 4, 4, head_dim, torch.bfloat16, DEV)
    dout = torch.randn(q.shape, device=DEV).to(torch.bfloat16)
    out, lse, _ = back_lite.forward(q, k, v)
    tm, tn = back_lite.num_tiles(2048, 4096, DEV)
    gen = torch.Generator(device=DEV).manual_seed(seed)
    for keep in (0.03, 0.7, 0.03, 0.7):
        mask = torch.rand(1, 4, tm, tn, device=DEV, generator=gen) < keep
        got = back_lite.backward(dout, q, k, v, out, lse, mask=mask)
        check_masked_backward(got, q, k, v, out, dout, False, mask)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_ws64p_light_and_heavy_row_tiles(dtype, causal):
    """The persistent head-dim-64 kernel's DQ16 form (masked calls averaging at most 16 entries a
    row tile, bl_bwd_ws64p_dq16_chosen): its consumers stage a light row tile's dQ (at most 16
    entries) in 16-bit and the reducer stores it to dq (a tile's only entry) or adds it onto the
    preprocess's zeros, while heavier tiles add into the fp32 accumulator, which the postprocess
    converts. One call with tiles of 0, 1, 2, 16, 17 and all 32 entries; Sq ends inside its last
    row tile."""
    q, k, v = random_qkv(1, 4000, 4096, 4, 4, 64, dtype, DEV)
    dout = torch.randn(q.shape, device=DEV).to(dtype)
    out, lse, _ = back_lite.forward(q, k, v, causal=causal)
    mask = light_and_heavy_rows_mask(4, 4000, 4096, causal, torch.Generator().manual_seed(5),
                                     counts=(0, 1, 2, 16, 1, 17))
    assert mask.sum(-1).float().mean() <= 16  # the DQ16 form's gate
    got = back_lite.backward(dout, q, k, v, out, lse, mask=mask, causal=causal)
    check_masked_backward(got, q, k, v, out, dout, causal, mask)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("sk", [900, 1024])
@pytest.mark.parametrize("heads_k", [4, 2], ids=["mha", "gqa_split"])
def test_gpu_mask_keeping_every_tile_is_the_dense_backward(causal, sk, heads_k):
    """A mask that keeps every tile gives the dense call's gradients: the device runs the dense
    kernel for it (with a causal mask, for a mask keeping every tile the causal mask allows),
    whose dK and dV sum in a fixed order: the same bits. Sk = 1024 fills whole key tiles: without
    a causal mask both calls then take the causal dense walk (attn_bwd_sm90.cu). Two query heads
    per K / V head on this few columns: both calls split them the same way (bl_bwd_head_split)."""
    q, k, v = random_qkv(1, 700, sk, 4, heads_k, 128, torch.bfloat16, DEV)
    dout = torch.randn(q.shape, device=DEV).to(torch.bfloat16)
    out, lse, _ = back_lite.forward(q, k, v, causal=causal)
    tm, tn = back_lite.num_tiles(700, sk, DEV)
    mask = torch.ones(1, 4, tm, tn, dtype=torch.bool, device=DEV)
    dense = back_lite.backward(dout, q, k, v, out, lse, causal=causal)
    full = back_lite.backward(dout, q, k, v, out, lse, mask=mask, causal=causal)
    for name, a, b in zip(("dq", "dk", "dv"), full, dense):
        if name == "dq":  # fp32 reduce-adds from many CTAs, in varying order
            torch.testing.assert_close(a, b, rtol=1e-2, atol=1e-2)
        else:
            assert torch.equal(a, b), name


@pytest.mark.parametrize("causal", [False, True])
def test_gpu_large_gqa(causal):
    """B=1, S=4096, Hq=8, Hk=2, D=128, bf16: forward, and the explicit-mask backward."""
    q, k, v = local_qkv(1, 4096, 8, 2, 128, torch.bfloat16, DEV, width=64.0)
    dout = torch.randn(q.shape, device=DEV).to(torch.bfloat16)
    out, lse, w = check_forward(q, k, v, causal)
    mask = back_lite.select(w, 0.05)
    got = back_lite.backward(dout, q, k, v, out, lse, mask=mask, causal=causal)
    check_masked_backward(got, q, k, v, out, dout, causal, mask)


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("keep", [0.05, 0.6])
def test_gpu_gqa_list_codes(head_dim, causal, keep):
    """Six query heads per K / V head and Sq = 3000 (47 row tiles: not a power of two, so the
    reciprocal is inexact): the kernels split each list code hl * 47 + m with a float estimate
    and one correction step (ws_split_code) instead of an integer division -- in every role at
    head dim 64, in version 10's consumers and the packed 80-row walks at head dim 128
    (bench/results/bwd-s71-gqa-split.txt). A low and a high keep: the head-dim-128 call picks
    its kernel from the kept tiles."""
    check_random_mask_backward(*random_qkv(1, 3000, 3100, 12, 2, head_dim, torch.bfloat16, DEV),
                               causal, keep)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("keep", [0.03, 0.5])
def test_gpu_lists_with_more_units_than_ctas(causal, keep):
    """The lists kernel runs at most one CTA per SM, each walking several units (a unit: up to 16
    key tiles of one (b, kv head)), two per (b, kv head) here, the second a partial one (17 key
    tiles). At least two units per CTA, so that a CTA reuses its shared bitmaps; 3 % kept takes
    the paths that count each row tile's entries per unit (version 10's direct dQ)."""
    seqlen, heads, run_cols = 2100, 36, 16
    tm, tn = back_lite.num_tiles(seqlen, seqlen, DEV)
    units_per_batch = heads * -(-tn // run_cols)
    sms = torch.cuda.get_device_properties(DEV).multi_processor_count
    batch = -(-(2 * sms + 1) // units_per_batch)
    assert tn > run_cols and batch * units_per_batch > 2 * sms
    q, k, v = random_qkv(batch, seqlen, seqlen, heads, heads, 128, torch.bfloat16, DEV)
    dout = torch.randn(q.shape, device=DEV).to(torch.bfloat16)
    out, lse, _ = back_lite.forward(q, k, v, causal=causal)
    gen = torch.Generator(device=DEV).manual_seed(1)
    mask = torch.rand(batch, heads, tm, tn, device=DEV, generator=gen) < keep
    got = back_lite.backward(dout, q, k, v, out, lse, mask=mask, causal=causal)
    check_masked_backward(got, q, k, v, out, dout, causal, mask)


@pytest.fixture
def poisoned_bytes(monkeypatch):
    """Every workspace the backward takes from workspace_pool.empty starts as NaN bits (ints -1);
    the sizes asked for are listed in the returned list (clear it before the call under test)."""
    real_empty = workspace_pool.empty
    sizes = []

    def poisoned(nbytes, device, compressible):
        sizes.append(nbytes)
        return real_empty(nbytes, device, compressible).fill_(0xFF)

    monkeypatch.setattr(workspace_pool, "empty", poisoned)
    return sizes


@pytest.mark.parametrize("causal,heads_k,keep,head_dim", [
    (False, 4, 0.05, 128), (False, 4, 0.15, 128), (False, 4, 0.4, 128), (False, 4, 1.0, 128),
    (False, 2, 0.15, 128), (True, 4, 0.15, 128), (True, 1, 0.4, 128), (False, 1, 0.15, 64)])
def test_gpu_backward_in_a_poisoned_workspace(poisoned_bytes, causal, heads_k, keep, head_dim):
    """Every call's workspace starts as NaN bits (ints -1): the backward must write all it
    reads (the dq accumulator's zeros, Dlt, the lists, counts, totals, schedule, dq writers, a
    split call's per-column part counts), or NaN or stale values reach the gradients. 32 + 1
    key tiles of 128: at 5 / 15 / 40 % kept 1.6 / 5 / 13 entries per row tile, on version 10 or
    an 80-row walk as the device picks; 100 %: the dense walk; GQA and a causal call too. With
    2 or 1 kv heads the 66 / 33 columns are too few for the SMs: those calls split each
    column's query heads (bl_bwd_head_split), at head dim 64 too, and their dK / dV are summed
    by whichever CTA counts a column's last part. (Written for the dq-claims probe, which
    skipped the zeros where version 10 runs: dev/cuda/wip/bwd-dq-claims.patch.)"""
    q, k, v = random_qkv(1, 1000, 4100, 4, heads_k, head_dim, torch.bfloat16, DEV)
    dout = torch.randn(q.shape, device=DEV).to(torch.bfloat16)
    out, lse, _ = back_lite.forward(q, k, v, causal=causal)
    tm, tn = back_lite.num_tiles(1000, 4100, DEV)
    gen = torch.Generator(device=DEV).manual_seed(5)
    mask = torch.rand(1, 4, tm, tn, device=DEV, generator=gen) < keep
    poisoned_bytes.clear()
    got = back_lite.backward(dout, q, k, v, out, lse, mask=mask, causal=causal)
    assert poisoned_bytes, "the backward's workspace did not come through workspace_pool.empty"
    check_masked_backward(got, q, k, v, out, dout, causal, mask)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim", [128, 64])
def test_gpu_heavy_row_tiles_in_a_poisoned_workspace(poisoned_bytes, head_dim, causal):
    """The light / heavy row-tile forms (version 10's DIRECT form at head dim 128, the persistent
    kernel's DQ16 form at 64) in a workspace that starts as NaN bits: only the heavy tiles (more
    than 16 entries) add into the fp32 accumulator, so a heavy tile whose zeros were missed, or a
    light or empty one whose accumulator rows were read, would carry NaN into dq. (At head dim 128
    the accumulator is zeroed only for the heavy tiles where the device picks the DIRECT form,
    and only their parts are converted: bwd_prepost_sm90.cu.) Tiles of 0, 1, 2, 5 / 16, 17 and
    every allowed entry in one call."""
    q, k, v = random_qkv(1, 4000, 4096, 4, 4, head_dim, torch.bfloat16, DEV)
    dout = torch.randn(q.shape, device=DEV).to(torch.bfloat16)
    out, lse, _ = back_lite.forward(q, k, v, causal=causal)
    counts = (0, 1, 2, 5, 16, 17) if head_dim == 128 else (0, 1, 2, 16, 1, 17)
    mask = light_and_heavy_rows_mask(4, 4000, 4096, causal, torch.Generator().manual_seed(7),
                                     counts=counts)
    assert mask.sum(-1).float().mean() <= 16  # under both forms' gates (16.5 / 16)
    assert (mask.sum(-1) > 16).any()  # heavy tiles present
    poisoned_bytes.clear()
    got = back_lite.backward(dout, q, k, v, out, lse, mask=mask, causal=causal)
    assert poisoned_bytes, "the backward's workspace did not come through workspace_pool.empty"
    check_masked_backward(got, q, k, v, out, dout, causal, mask)


@pytest.mark.parametrize("keep", [0.02, 0.9])
def test_gpu_low_keep_schedule_windows(keep):
    """A non-causal head-dim-128 call with short heads (fewer than 256 key tiles) sorts its
    columns in windows of two rounds of the SMs and, for calls keeping at most 7 entries per row
    tile (bl_bwd_low_keep; 0.18 and 8.1 here), again in windows of one round
    (bl_bwd_workspace::sched_rec_low), which the kernels then walk. Here ~4.5 rounds of columns:
    two whole windows and a part of one, whose sub-windows are part empty; each keep walks one of
    the two record sets, and a lost or repeated column would show in dK / dV."""
    seqlen = 1100
    tm, tn = back_lite.num_tiles(seqlen, seqlen, DEV)
    sms = torch.cuda.get_device_properties(DEV).multi_processor_count
    heads = -(-(4 * sms + sms // 2) // tn)
    q, k, v = random_qkv(1, seqlen, seqlen, heads, heads, 128, torch.bfloat16, DEV)
    dout = torch.randn(q.shape, device=DEV).to(torch.bfloat16)
    out, lse, _ = back_lite.forward(q, k, v)
    gen = torch.Generator(device=DEV).manual_seed(2)
    mask = torch.rand(1, heads, tm, tn, device=DEV, generator=gen) < keep
    got = back_lite.backward(dout, q, k, v, out, lse, mask=mask)
    check_masked_backward(got, q, k, v, out, dout, False, mask)


@pytest.mark.parametrize("batch,heads_q,heads_k,head_dim",
                         [(1, 16, 16, 128), (2, 8, 8, 128), (1, 24, 24, 64)])
def test_gpu_causal_schedule_groups(batch, heads_q, heads_k, head_dim):
    """S = 16384 causal forwards whose schedule takes (b, h) pairs in several groups (one group's
    K / V fit in 64 MB of L2: groups of 8 at D = 128, groups of 16 and 8 at D = 64): every work
    tile is written, and right. The float64 reference is out of reach at this size, so the
    outputs start as NaN and are compared with PyTorch's SDPA (v has mean 1: a tile of zeros
    cannot pass either)."""
    torch.manual_seed(0)
    s = 16384
    q = torch.randn(batch, s, heads_q, head_dim, device=DEV, dtype=torch.bfloat16)
    k = torch.randn(batch, s, heads_k, head_dim, device=DEV, dtype=torch.bfloat16)
    v = (torch.randn(batch, s, heads_k, head_dim, device=DEV) + 1.0).to(torch.bfloat16)
    out = torch.full_like(q, float("nan"))  # written in place: a skipped tile stays NaN
    lse = torch.full((batch, heads_q, s), float("nan"), device=DEV)
    back_lite.forward(q, k, v, causal=True, out=out, lse=lse)
    want = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True).transpose(1, 2)
    assert torch.isfinite(out).all() and torch.isfinite(lse).all()
    err = (out.float() - want.float()).abs().max().item()
    assert err < 3e-2, f"max |out - SDPA| = {err}"


def test_gpu_matches_cpu_backend_selection_inputs():
    """The same problem on both backends gives close tile masses (the selection's input)."""
    q, k, v = local_qkv(1, 512, 2, 2, 64, torch.bfloat16, sharpness=8.0)
    _, _, w_cpu = back_lite.forward(q, k, v, with_stats=True)
    _, _, w_gpu = back_lite.forward(q.to(DEV), k.to(DEV), v.to(DEV), with_stats=True)
    torch.testing.assert_close(w_gpu.cpu(), w_cpu, rtol=1e-3, atol=1e-3)


def test_gpu_nan_stays_in_its_row():
    q, k, v = random_qkv(2, 200, 200, 4, 2, 64, torch.bfloat16, DEV)
    q[0, 5, 1, 3] = math.nan
    out, lse, w = back_lite.forward(q, k, v, with_stats=True)
    assert torch.isnan(out[0, 5, 1]).all()
    out[0, 5, 1] = 0.0
    assert torch.isfinite(out).all()


def test_gpu_compile_fullgraph():
    torch._dynamo.reset()
    q, k, v = local_qkv(1, 1024, 4, 2, 128, torch.bfloat16, DEV, sharpness=8.0)
    dout = torch.randn(q.shape, device=DEV).to(torch.bfloat16)
    attn = back_lite.BackLite(negl_prob=0.05)

    def run(fn):
        qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
        out = fn(qg, kg, vg)
        return (out,) + torch.autograd.grad(out, (qg, kg, vg), dout)

    eager = run(lambda a, b, c: attn(a, b, c, causal=True))
    compiled = run(torch.compile(lambda a, b, c: attn(a, b, c, causal=True), fullgraph=True))
    for name, a, b in zip(("out", "dq", "dk", "dv"), eager, compiled):
        if name == "dq":  # fp32 reduce-adds in the order CTAs finish: equal up to rounding
            eps = torch.finfo(a.dtype).eps
            torch.testing.assert_close(a, b, rtol=2 * eps, atol=1e-5)
        else:
            assert torch.equal(a, b), name


def test_gpu_fp32_is_rejected_with_its_name():
    q, k, v = random_qkv(1, 64, 64, 2, 2, 64, torch.float32, DEV)
    with pytest.raises(ValueError, match="torch.float32 is CPU only"):
        back_lite.forward(q, k, v)


def test_gpu_runs_on_a_side_stream():
    q, k, v = random_qkv(1, 300, 300, 4, 2, 128, torch.bfloat16, DEV)
    expected, _, _ = back_lite.forward(q, k, v)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        out, _, _ = back_lite.forward(q, k, v)
    torch.cuda.current_stream().wait_stream(stream)
    assert torch.equal(out, expected)


@pytest.mark.parametrize("dtype,head_dim,needle", [
    (torch.bfloat16, 32, "head_dim=32 is not supported by the CUDA backend"),
    (torch.float16, 80, "head_dim=80 is not supported by the CUDA backend"),
    (torch.bfloat16, 96, "head_dim=96 is not supported by the CUDA backend"),
    (torch.bfloat16, 256, "head_dim=256 is not supported by the CUDA backend"),
], ids=str)
def test_gpu_kinds_the_kernels_lack(dtype, head_dim, needle):
    """Head dims the kernels are not built for: backend_supports says so before a call, the
    forward and the backward refuse them with NotImplementedError in the same words, and the SDPA
    router hands such calls to PyTorch. (fp32 CUDA tensors are refused in Python, by _checks.)"""
    from back_lite.integrations import sdpa as bl_sdpa
    assert not back_lite.backend_supports(DEV, dtype, head_dim)
    assert needle in back_lite.functional.unsupported_reason(DEV, dtype, head_dim)
    q, k, v = random_qkv(1, 100, 100, 2, 2, head_dim, dtype, DEV)
    with pytest.raises(NotImplementedError, match=needle):
        back_lite.forward(q, k, v)
    out, dout = torch.zeros_like(q), torch.randn_like(q)
    lse = torch.zeros(1, 2, 100, device=DEV)
    with pytest.raises(NotImplementedError, match=needle):
        back_lite.backward(dout, q, k, v, out, lse)
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))  # PyTorch's (B, H, S, D)
    with bl_sdpa.sdpa_through_back_lite(0.0) as counts:
        with pytest.warns(UserWarning, match=needle):
            got = torch.nn.functional.scaled_dot_product_attention(qt, kt, vt)
    assert counts == {"back_lite": 0, "torch": 1}
    assert torch.equal(got, torch.nn.functional.scaled_dot_product_attention(qt, kt, vt))


def test_gpu_flash_attn_func():
    """flash_attn's signature on the CUDA backend: BackLite's forward bits, gradients within the
    reduce-adds' rounding of back_lite.attention's; with deterministic=True the same bits in every
    call, those of the deterministic form that torch.use_deterministic_algorithms asks for."""
    from back_lite.integrations import flash_attn as bl_fa
    q, k, v = (t.requires_grad_() for t in random_qkv(2, 700, 900, 4, 2, 128, torch.bfloat16,
                                                     DEV))
    out, lse, probs = bl_fa.flash_attn_func(q, k, v, causal=True, return_attn_probs=True,
                                            negl_prob=0.1)
    want, want_lse, _ = back_lite.attention(q, k, v, negl_prob=0.1, causal=True)
    assert probs is None and torch.equal(out, want) and torch.equal(lse, want_lse)
    dout = torch.randn_like(out)
    got_grads = torch.autograd.grad(out, (q, k, v), dout)
    want_grads = torch.autograd.grad(want, (q, k, v), dout)
    assert torch.equal(got_grads[1], want_grads[1]) and torch.equal(got_grads[2], want_grads[2])
    eps = torch.finfo(torch.bfloat16).eps  # dq: as test_gpu_backward_is_reproducible allows
    torch.testing.assert_close(got_grads[0], want_grads[0], rtol=2 * eps, atol=1e-5)
    det = [torch.autograd.grad(bl_fa.flash_attn_func(q, k, v, causal=True, negl_prob=0.1,
                                                     deterministic=True), (q, k, v), dout)
           for _ in range(3)]
    with deterministic_algorithms():
        under_torch = torch.autograd.grad(
            back_lite.attention(q, k, v, negl_prob=0.1, causal=True)[0], (q, k, v), dout)
    for name, *grads in zip("qkv", *det, under_torch):
        assert all(torch.equal(g, grads[0]) for g in grads), f"d{name}"
    from back_lite.integrations import flash_attn3 as bl_fa3
    out3, lse3 = bl_fa3.flash_attn_func(q, k, v, causal=True, return_attn_probs=True,
                                        negl_prob=0.1)
    assert torch.equal(out3, want) and torch.equal(lse3, want_lse)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_forward_is_reproducible(dtype, head_dim, causal):
    """out, lse and W come out the same bits in every call: each (batch, head, row tile) is one
    CTA's, its key tiles and the tile masses summed in a fixed order (README, Reproducibility)."""
    q, k, v = random_qkv(1, 1500, 1500, 4, 2, head_dim, dtype, DEV)
    first = back_lite.forward(q, k, v, causal=causal, with_stats=True)
    for _ in range(2):
        again = back_lite.forward(q, k, v, causal=causal, with_stats=True)
        for name, a, b in zip(("out", "lse", "W"), again, first):
            assert torch.equal(a, b), name


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("head_dim", [128, 64])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("tiles", ["dense", "mask", "select"])
@pytest.mark.parametrize("shape", [(1, 1000, 1000, 4, 2), (2, 300, 700, 4, 4), (1, 130, 63, 8, 1)],
                         ids=lambda s: "x".join(map(str, s)))
def test_gpu_deterministic_backward(dtype, head_dim, causal, tiles, shape):
    """Under torch.use_deterministic_algorithms(True) a backward runs the deterministic form
    (bl_attn_desc::deterministic: dq by the dq-rows kernel; dK / dV by version 10 without its dQ
    at head dim 128, by version 6 as usual at 64): the float64 reference's gradients over the
    same tiles, and the same bits, dq included, in every call; the forward runs silently. GQA /
    MQA (the split head-dim-64 form's parts included), Sq != Sk and rows past the last whole
    tile included."""
    batch, sq, sk, hq, hk = shape
    q, k, v = random_qkv(batch, sq, sk, hq, hk, head_dim, dtype, DEV)
    dout = torch.randn(q.shape, device=DEV).to(dtype)
    with deterministic_algorithms(), warnings.catch_warnings():
        warnings.simplefilter("error")
        out, lse, w = back_lite.forward(q, k, v, causal=causal, with_stats=True)
        tm, tn = back_lite.num_tiles(sq, sk, DEV)
        if tiles == "dense":
            mask, kw = torch.ones(batch, hq, tm, tn, dtype=torch.bool, device=DEV), {}
        elif tiles == "mask":
            gen = torch.Generator(device=DEV).manual_seed(5)
            mask = torch.rand(batch, hq, tm, tn, device=DEV, generator=gen) < 0.5
            kw = {"mask": mask}
        else:
            mask = back_lite.select(w, negl_prob=0.1)
            kw = {"tile_mass": w, "negl_prob": 0.1}
        first = back_lite.backward(dout, q, k, v, out, lse, causal=causal, **kw)
        for _ in range(2):
            again = back_lite.backward(dout, q, k, v, out, lse, causal=causal, **kw)
            for name, a, b in zip(("dq", "dk", "dv"), again, first):
                assert torch.equal(a, b), name
        qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
        negl = 0.1 if tiles == "select" else 0.0
        o = back_lite.BackLite(negl_prob=negl)(qg, kg, vg, causal=causal)
        auto = torch.autograd.grad(o, (qg, kg, vg), dout)
    check_masked_backward(first, q, k, v, out, dout, causal, mask)
    if tiles != "mask":
        for name, a, b in zip(("dq", "dk", "dv"), auto, first):
            assert torch.equal(a, b), f"autograd's {name}"


def test_gpu_deterministic_backward_without_a_form():
    """A call with no deterministic form -- 3.3M keys: the dq-rows kernel's list of key-tile
    steps outgrows the shared memory (head dim 64: past ~3.16M keys) -- under
    torch.use_deterministic_algorithms(True): every backward path (autograd, the op,
    caller-owned dq / dk / dv) raises, leaving given buffers as they were; with warn_only=True it
    warns and gives the fastest form's gradients (dk, dv bit for bit, dq within the
    reproducibility test's two ulps), unless the call itself asks for deterministic=True."""
    q, k, v = random_qkv(1, 100, 3_300_000, 1, 1, 64, torch.bfloat16, DEV)
    dout = torch.randn(q.shape, device=DEV).to(q.dtype)
    out, lse, _ = back_lite.forward(q, k, v, causal=True)
    # an explicit mask: the CUDA selection sorts a row of 25782 key tiles in no shared memory
    tm, tn = back_lite.num_tiles(100, 3_300_000, DEV)
    gen = torch.Generator(device=DEV).manual_seed(9)
    sparse = {"mask": torch.rand(1, 1, tm, tn, device=DEV, generator=gen) < 0.3, "causal": True}
    free = back_lite.backward(dout, q, k, v, out, lse, **sparse)
    with deterministic_algorithms():
        qg = q.clone().requires_grad_()
        with pytest.raises(RuntimeError, match=r"no deterministic form.*seqlen_k = 3300000"):
            back_lite.BackLite(negl_prob=0.0)(qg, k, v, causal=True).backward(dout)
        assert qg.grad is None
        with pytest.raises(RuntimeError, match="use_deterministic_algorithms"):
            back_lite.backward(dout, q, k, v, out, lse, **sparse)
        given = tuple(torch.full_like(t, 7.0) for t in (q, k, v))
        with pytest.raises(RuntimeError, match="use_deterministic_algorithms"):
            back_lite.backward(dout, q, k, v, out, lse, dq=given[0], dk=given[1], dv=given[2],
                               **sparse)
        torch.cuda.synchronize()
        assert all(bool((t == 7.0).all()) for t in given)
    with deterministic_algorithms(warn_only=True):
        with pytest.warns(UserWarning, match="no deterministic form"):
            warned = back_lite.backward(dout, q, k, v, out, lse, **sparse)
        # asked for by the call (flash_attn's deterministic=True): refused, warn_only or not
        with pytest.raises(RuntimeError, match=r"deterministic=True, but .*seqlen_k = 3300000"):
            back_lite.backward(dout, q, k, v, out, lse, deterministic=True, **sparse)
    assert torch.equal(warned[1], free[1]) and torch.equal(warned[2], free[2])
    eps = torch.finfo(q.dtype).eps
    torch.testing.assert_close(warned[0], free[0], rtol=2 * eps, atol=1e-5)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("head_dim,causal,tiles", [
    (128, False, "dense"), (128, True, "dense"), (64, False, "dense"), (64, True, "dense"),
    (128, False, "mask"), (128, True, "mask"), (64, True, "mask"), (128, True, "select")])
def test_gpu_backward_is_reproducible(dtype, head_dim, causal, tiles):
    """dK and dV come out the same bits in every call (each key tile's are one CTA's sums, over
    its row tiles and the query heads of its group, in a fixed order); dQ is the sum of fp32
    reduce-adds from the CTAs of many key tiles, in the order they finish, so it may differ from
    call to call by rounding: two ulps of the output dtype allowed (README, Reproducibility)."""
    q, k, v = random_qkv(1, 1500, 1500, 4, 2, head_dim, dtype, DEV)
    dout = torch.randn(q.shape, device=DEV).to(dtype)
    out, lse, w = back_lite.forward(q, k, v, causal=causal, with_stats=True)
    kw = {}
    if tiles == "mask":
        tm, tn = back_lite.num_tiles(1500, 1500, DEV)
        gen = torch.Generator(device=DEV).manual_seed(1)
        kw["mask"] = torch.rand(1, 4, tm, tn, device=DEV, generator=gen) < 0.5
    elif tiles == "select":
        kw.update(tile_mass=w, negl_prob=0.05)
    first = back_lite.backward(dout, q, k, v, out, lse, causal=causal, **kw)
    eps = torch.finfo(dtype).eps
    for _ in range(3):
        again = back_lite.backward(dout, q, k, v, out, lse, causal=causal, **kw)
        assert torch.equal(again[1], first[1]), "dk"
        assert torch.equal(again[2], first[2]), "dv"
        torch.testing.assert_close(again[0], first[0], rtol=2 * eps, atol=1e-5)
