"""Sparse FP8 decode, the FP8 cache tools and the sparse prefill on PyTorch CUDA tensors,
against PyTorch references written here. Skipped without torch or CUDA."""

import math

import pytest

torch = pytest.importorskip("torch")

import mlakit  # noqa: E402
from accuracy import check_stat  # noqa: E402
from torch_cases import (  # noqa: E402
    activations,
    cache_values,
    check,
    dequantize_fp8_cache,
    fp8_paged_cache,
    generator,
    require_gpu,
    sparse_indices,
    sparse_prefill_reference,
    sparse_reference,
    to_numpy,
)

require_gpu()


def test_fp8_tools_on_the_gpu_match_the_cpu_and_the_format():
    gen = generator(20)
    kv = cache_values(gen, (5, 64, 1, 576)).to(torch.bfloat16)
    kv[0, 0] = 0
    cache = mlakit.quantize_fp8_cache(kv)
    assert cache.dtype == torch.uint8 and cache.shape == (5, 64, 1, 656) and cache.is_cuda
    assert torch.equal(cache.cpu(), mlakit.quantize_fp8_cache(kv.cpu()))  # bit-identical to the CPU version
    back = mlakit.dequantize_fp8_cache(cache)
    assert back.dtype == torch.bfloat16 and torch.equal(back, dequantize_fp8_cache(cache))
    err = (back.float() - kv.float()).abs()
    assert torch.all(err <= 2**-4 * kv.float().abs() + 1e-3) and torch.all(back[0, 0] == 0)

    tokens = cache_values(gen, (3, 576)).to(torch.bfloat16)
    slots = torch.tensor([7, -1, 64 * 5 + 3], dtype=torch.int32, device="cuda")
    before = cache.clone()
    mlakit.append_fp8_cache(tokens, slots, cache)
    expected = before.view(-1, 656)
    expected[7] = mlakit.quantize_fp8_cache(tokens[:1])[0]
    assert torch.equal(cache.view(-1, 656), expected)


@pytest.mark.parametrize(
    "b,s_q,h_q,topk,options",
    [(4, 1, 128, 2048, False), (3, 2, 64, 512, True), (2, 2, 16, 64, True)],
    ids=["v32_decode", "mtp_topk_length_sink", "small"],
)
def test_sparse_decode_matches_reference(b, s_q, h_q, topk, options):
    gen = generator(topk + h_q)
    num_blocks = 40
    _, cache = fp8_paged_cache(gen, num_blocks)
    q = activations(gen, (b, s_q, h_q, 576))
    indices = sparse_indices(gen, b, s_q, topk, (num_blocks - 1) * 64, num_blocks * 64)
    topk_length = torch.randint(0, topk + 1, (b,), generator=gen, dtype=torch.int32).cuda() if options else None
    attn_sink = torch.randn(h_q, generator=gen).cuda() if options else None
    plan = mlakit.mla_sparse_decode_plan(b, s_q, h_q, topk, q, topk_length)
    out, lse = mlakit.mla_sparse_decode(q, cache, indices, topk_length, attn_sink, plan=plan)
    assert out.dtype == torch.bfloat16 and out.shape == (b, s_q, h_q, 512) and lse.shape == (b, h_q, s_q)
    check(out, lse, *sparse_reference(q, cache, indices, None, topk_length, attn_sink))


@pytest.mark.parametrize(
    "s_q,h_q,d_qk,topk,options",
    [(32, 128, 576, 2048, False), (50, 64, 512, 128, True), (7, 16, 576, 64, True)],
    ids=["v32_prefill", "d512_topk_length_sink", "small"],
)
def test_sparse_prefill_matches_reference(s_q, h_q, d_qk, topk, options):
    gen = generator(s_q + topk)
    s_kv = 3000
    q = activations(gen, (s_q, h_q, d_qk))
    kv = cache_values(gen, (s_kv, 1, d_qk)).to(torch.bfloat16)
    indices = sparse_indices(gen, 1, s_q, topk, s_kv, s_kv).view(s_q, 1, topk)
    topk_length = torch.randint(0, topk + 1, (s_q,), generator=gen, dtype=torch.int32).cuda() if options else None
    attn_sink = torch.randn(h_q, generator=gen).cuda() if options else None
    out, max_logits, lse = mlakit.mla_sparse_prefill(q, kv, indices, 0.05, 512, attn_sink, topk_length)
    assert out.dtype == torch.bfloat16 and out.shape == (s_q, h_q, 512) and max_logits.shape == (s_q, h_q)
    ref_out, ref_max, ref_lse = sparse_prefill_reference(q, kv, indices, 0.05, topk_length, attn_sink)
    check(out, lse, ref_out, ref_lse)
    check_stat(to_numpy(max_logits), to_numpy(ref_max), "max_logits")
    _, _, lse_e = mlakit.mla_sparse_prefill(q, kv, indices, 0.05, 512, attn_sink, topk_length, lse_base="e")
    check_stat(to_numpy(lse_e), to_numpy(ref_lse) * math.log(2))
