"""Issue 23 item 4 on PyTorch CUDA tensors: empty inputs get the empty result through the
GPU entry points (whose plans and decodes then launch nothing), rows over no cache blocks or
kv rows are rows with nothing to attend, and a NaN scale is an error naming it. Skipped
without torch or CUDA."""

import math

import pytest

torch = pytest.importorskip("torch")

import mlakit  # noqa: E402
from mlakit import flash_mla  # noqa: E402
from torch_cases import activations, generator, paged_cache, require_gpu, seqlens  # noqa: E402

require_gpu()


def _assert_nothing_attended(out, lse):
    torch.cuda.synchronize()
    assert out.numel() > 0 and bool((out == 0).all())
    assert bool(torch.isposinf(lse).all())


@pytest.mark.parametrize("b, s_q, h_q", [(0, 1, 128), (2, 0, 128), (2, 1, 0)])
def test_dense_decode_of_no_query_rows(b, s_q, h_q):
    kv, table = paged_cache(generator(50), (70, 5))
    q = torch.zeros((b, s_q, h_q, 576), dtype=torch.bfloat16, device="cuda")
    lengths = seqlens([70, 5][:b])
    plan = mlakit.mla_decode_plan(lengths, s_q, h_q, 1)
    out, lse = mlakit.mla_decode(q, kv, table[:b], lengths, plan=plan)
    torch.cuda.synchronize()
    assert out.shape == (b, s_q, h_q, 512) and lse.shape == (b, h_q, s_q)
    meta, _ = flash_mla.get_mla_metadata()
    out, lse = flash_mla.flash_mla_with_kvcache(q, kv, table[:b], lengths, 512, meta)
    torch.cuda.synchronize()
    assert out.shape == (b, s_q, h_q, 512)


@pytest.mark.parametrize("kernel", ["auto", "portable"])
def test_dense_decode_over_no_cache_blocks(kernel):
    q = activations(generator(51), (2, 1, 128, 576))
    kv = torch.empty((0, 64, 1, 576), dtype=torch.bfloat16, device="cuda")
    lengths = seqlens([0, 0])
    plan = mlakit.mla_decode_plan(lengths, 1, 128, 1, kernel)
    out, lse = mlakit.mla_decode(q, kv, torch.zeros((2, 1), dtype=torch.int32, device="cuda"), lengths, plan=plan)
    _assert_nothing_attended(out, lse)


@pytest.mark.parametrize("b, s_q, h_q", [(0, 2, 64), (2, 0, 64), (2, 2, 0)])
def test_sparse_decode_of_no_query_rows(b, s_q, h_q):
    cache = mlakit.quantize_fp8_cache(torch.zeros((2, 64, 1, 576), dtype=torch.bfloat16, device="cuda"))
    q = torch.zeros((b, s_q, h_q, 576), dtype=torch.bfloat16, device="cuda")
    indices = torch.zeros((b, s_q, 64), dtype=torch.int32, device="cuda")
    out, lse = mlakit.mla_sparse_decode(q, cache, indices)
    torch.cuda.synchronize()
    assert out.shape == (b, s_q, h_q, 512) and lse.shape == (b, h_q, s_q)


def test_sparse_decode_over_no_cache_blocks():
    q = activations(generator(52), (2, 2, 64, 576))
    cache = torch.empty((0, 64, 1, 656), dtype=torch.uint8, device="cuda")
    out, lse = mlakit.mla_sparse_decode(q, cache, torch.zeros((2, 2, 64), dtype=torch.int32, device="cuda"))
    _assert_nothing_attended(out, lse)


@pytest.mark.parametrize("s_q, h_q, s_kv", [(0, 64, 8), (3, 0, 8), (3, 64, 0)])
def test_sparse_prefill_edges(s_q, h_q, s_kv):
    gen = generator(53)
    q = activations(gen, (s_q, h_q, 576))
    kv = activations(gen, (s_kv, 1, 576)) / 10
    indices = torch.arange(s_q * 64, dtype=torch.int32, device="cuda").view(s_q, 1, 64) % 9 - 1
    out, max_logits, lse = flash_mla.flash_mla_sparse_fwd(q, kv, indices, 0.1)
    torch.cuda.synchronize()
    assert out.shape == (s_q, h_q, 512) and lse.shape == max_logits.shape == (s_q, h_q)
    if s_kv == 0 and out.numel() > 0:
        _assert_nothing_attended(out, lse)
        assert bool(torch.isneginf(max_logits).all())


def test_fp8_tools_with_no_rows():
    no_tokens = torch.empty((0, 576), dtype=torch.bfloat16, device="cuda")
    assert mlakit.quantize_fp8_cache(no_tokens).shape == (0, 656)
    assert mlakit.dequantize_fp8_cache(torch.empty((0, 656), dtype=torch.uint8, device="cuda")).shape == (0, 576)
    cache = torch.full((2, 64, 1, 656), 7, dtype=torch.uint8, device="cuda")
    mlakit.append_fp8_cache(no_tokens, torch.empty(0, dtype=torch.int32, device="cuda"), cache)
    torch.cuda.synchronize()
    assert bool((cache == 7).all())


def test_a_nan_scale_is_an_error_naming_it():
    kv, table = paged_cache(generator(54), (70, 5))
    q = activations(generator(55), (2, 1, 128, 576))
    with pytest.raises(ValueError, match=r"^mla_decode: softmax_scale: expected a finite value"):
        mlakit.mla_decode(q, kv, table, seqlens([70, 5]), softmax_scale=math.nan)
