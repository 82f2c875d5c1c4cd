"""mlakit.flash_mla on PyTorch CUDA tensors, used as FlashMLA is: both metadata forms, dense
and sparse FP8 decode, a FlashMLA-style decoding loop, and CUDA-graph capture of a decoding
step, against the float64 PyTorch reference. Skipped without torch or CUDA."""

import pytest

torch = pytest.importorskip("torch")

from accuracy import check_stat  # noqa: E402
from mlakit import flash_mla  # noqa: E402
from torch_cases import (  # noqa: E402
    activations,
    capture,
    block_table,
    cache_values,
    check,
    dense_reference,
    fill_cache,
    fp8_paged_cache,
    generator,
    paged_cache,
    require_gpu,
    seqlens,
    sparse_indices,
    sparse_prefill_reference,
    sparse_reference,
    to_numpy,
)

require_gpu()


def metadata(form, cache_seqlens, s_q, h_q, h_kv=1):
    """FlashMLA's two ways of getting the step's metadata."""
    if form == "object":
        return flash_mla.get_mla_metadata()
    return flash_mla.get_mla_metadata(cache_seqlens, s_q * h_q // h_kv, h_kv)


@pytest.mark.parametrize("form", ["object", "arrays"])
@pytest.mark.parametrize("s_q,h_q,causal", [(1, 128, False), (2, 128, True), (1, 16, False), (4, 32, True)])
def test_dense_decode_matches_reference(form, s_q, h_q, causal):
    lengths = (1, 64, 65, 3000, 0, 777)
    gen = generator(s_q * h_q)
    kv, table = paged_cache(gen, lengths)
    q = activations(gen, (len(lengths), s_q, h_q, 576))
    cache_seqlens = seqlens(lengths)
    meta, num_splits = metadata(form, cache_seqlens, s_q, h_q)
    out, lse = flash_mla.flash_mla_with_kvcache(q, kv, table, cache_seqlens, 512, meta, num_splits, causal=causal)
    check(out, lse, *dense_reference(q, kv, table, cache_seqlens, causal=causal))


def test_metadata_arrays_have_flash_mla_shapes_and_split_counts():
    lengths = (0, 10, 9000, 64)
    cache_seqlens = seqlens(lengths)
    tile_scheduler_metadata, num_splits = flash_mla.get_mla_metadata(cache_seqlens, 128, 1)
    assert tile_scheduler_metadata.dtype == torch.int32 and tile_scheduler_metadata.shape[1] == 8
    assert tile_scheduler_metadata.is_cuda and num_splits.shape == (5,) and num_splits.dtype == torch.int32
    splits = num_splits.diff().tolist()
    assert num_splits[0].item() == 0 and splits[0] == 0 and all(s >= 1 for s in splits[1:])


def test_copied_metadata_still_decodes_with_a_warning():
    lengths = (500, 20)
    gen = generator(30)
    kv, table = paged_cache(gen, lengths)
    q = activations(gen, (2, 1, 64, 576))
    cache_seqlens = seqlens(lengths)
    tile_scheduler_metadata, num_splits = flash_mla.get_mla_metadata(cache_seqlens, 64, 1)
    with pytest.warns(UserWarning, match="making a new plan"):
        out, lse = flash_mla.flash_mla_with_kvcache(
            q, kv, table, cache_seqlens, 512, tile_scheduler_metadata.clone(), num_splits.clone()
        )
    check(out, lse, *dense_reference(q, kv, table, cache_seqlens))


@pytest.mark.parametrize("form", ["object", "arrays"])
def test_sparse_fp8_decode_matches_reference(form):
    b, s_q, h_q, topk, num_blocks = 3, 2, 64, 512, 24
    gen = generator(31)
    _, cache = fp8_paged_cache(gen, num_blocks)
    k_cache = cache.view(torch.float8_e4m3fn)  # FlashMLA passes the FP8 cache as float8
    q = activations(gen, (b, s_q, h_q, 576))
    indices = sparse_indices(gen, b, s_q, topk, (num_blocks - 1) * 64, num_blocks * 64)
    cache_seqlens = seqlens((0,) * b)  # not used by the sparse decode
    options = {}
    if form == "object":
        meta, num_splits = flash_mla.get_mla_metadata()
        options = {
            "topk_length": torch.randint(0, topk + 1, (b,), generator=gen, dtype=torch.int32).cuda(),
            "attn_sink": torch.randn(h_q, generator=gen).cuda(),
        }
    else:
        meta, num_splits = flash_mla.get_mla_metadata(cache_seqlens, s_q * h_q, 1, h_q, True, topk)
    out, lse = flash_mla.flash_mla_with_kvcache(
        q, k_cache, None, cache_seqlens, 512, meta, num_splits, is_fp8_kvcache=True, indices=indices, **options
    )
    check(out, lse, *sparse_reference(q, cache, indices, None, options.get("topk_length"), options.get("attn_sink")))
    with pytest.raises(ValueError, match=r"topk"):  # a schedule serves one topk
        flash_mla.flash_mla_with_kvcache(
            q, k_cache, None, cache_seqlens, 512, meta, num_splits, is_fp8_kvcache=True, indices=indices[..., :64]
        )


@pytest.mark.parametrize("form", ["object", "arrays"])
def test_a_flash_mla_decoding_loop_matches_the_reference(form):
    """As a serving engine drives FlashMLA: each step appends s_q tokens to every sequence of
    every layer's cache, gets the metadata once, and calls flash_mla_with_kvcache per layer."""
    layers, s_q, h_q = 4, 2, 128
    start = [100, 1, 4000, 63]
    capacity = [n + 3 * s_q for n in start]
    gen = generator(32)
    table, num_blocks = block_table(gen, capacity)
    caches = [fill_cache(gen, table, capacity, num_blocks) for _ in range(layers)]
    for step in range(1, 4):
        cache_seqlens = seqlens([n + step * s_q for n in start])
        meta, num_splits = metadata(form, cache_seqlens, s_q, h_q)
        for kv in caches:
            q = activations(gen, (len(start), s_q, h_q, 576))
            out, lse = flash_mla.flash_mla_with_kvcache(
                q, kv, table, cache_seqlens, 512, meta, num_splits, causal=True
            )
            check(out, lse, *dense_reference(q, kv, table, cache_seqlens, causal=True))


@pytest.mark.parametrize("form", ["object", "arrays"])
def test_cuda_graph_of_a_flash_mla_step_replays_with_new_lengths(form):
    """Metadata (for the object form: its first call) and every layer's decode are captured;
    each replay plans again from the lengths then in cache_seqlens."""
    capacity = (3000, 10, 640, 1)
    s_q, h_q, layers = 1, 128, 3
    gen = generator(33)
    table, num_blocks = block_table(gen, capacity)
    caches = [fill_cache(gen, table, capacity, num_blocks) for _ in range(layers)]
    cache_seqlens = seqlens(capacity)
    qs = [activations(gen, (4, s_q, h_q, 576)) for _ in range(layers)]

    def step():
        meta, num_splits = metadata(form, cache_seqlens, s_q, h_q)
        return [
            flash_mla.flash_mla_with_kvcache(q, kv, table, cache_seqlens, 512, meta, num_splits)
            for q, kv in zip(qs, caches)
        ]

    graph, results = capture(step)

    for lengths in ((2999, 10, 1, 0), (5, 9, 640, 1), (3000, 0, 320, 1)):
        cache_seqlens.copy_(seqlens(lengths))
        for q in qs:
            q.copy_(activations(gen, q.shape))
        graph.replay()
        torch.cuda.synchronize()
        for q, kv, (out, lse) in zip(qs, caches, results):
            check(out, lse, *dense_reference(q, kv, table, cache_seqlens))


@pytest.mark.parametrize("lse_base", ["e", "2"])
def test_sparse_prefill_returns_flash_mla_shapes_with_natural_log_statistics(lse_base):
    """FlashMLA on Hopper returns natural-log max_logits and lse; lse_base="2" is the switch
    to the 2025 releases' base 2."""
    s_q, h_q, topk, s_kv = 16, 64, 256, 1000
    gen = generator(34)
    q = activations(gen, (s_q, h_q, 576))
    kv = cache_values(gen, (s_kv, 1, 576)).to(torch.bfloat16)
    indices = sparse_indices(gen, 1, s_q, topk, s_kv, s_kv).view(s_q, 1, topk)
    kwargs = {} if lse_base == "e" else {"lse_base": "2"}
    out, max_logits, lse = flash_mla.flash_mla_sparse_fwd(q, kv, indices, 576**-0.5, **kwargs)
    assert out.shape == (s_q, h_q, 512) and max_logits.shape == lse.shape == (s_q, h_q)
    ref_out, ref_max, ref_lse = sparse_prefill_reference(q, kv, indices, 576**-0.5, natural=lse_base == "e")
    check(out, lse, ref_out, ref_lse)
    check_stat(to_numpy(max_logits), to_numpy(ref_max), "max_logits")
