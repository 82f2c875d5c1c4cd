"""GQA decode and its cache tools on PyTorch CUDA tensors against mlakit's float64 CPU
reference run on host copies of the same data (itself checked against an independent NumPy
implementation in test_gqa_decode_cpu.py): bf16 / fp16 caches, int8 and fp8 caches, the
fused append with rotary embedding, the options, plan reuse across layers, the caller's
stream, CUDA-graph capture of plan + decode replayed with new lengths, errors. Skipped
without torch, CUDA, or an mlakit built with CUDA."""

import math

import pytest

torch = pytest.importorskip("torch")

import mlakit  # noqa: E402
from accuracy import check_out, check_stat  # noqa: E402
from torch_cases import capture, generator, require_gpu  # noqa: E402

require_gpu()
try:
    mlakit._mlakit.gqa_decode_workspace_size(1, 1, 8, 1, 128)
except RuntimeError as e:  # e.g. the GQA kernels not built for this device
    pytest.skip(f"mlakit cannot run the GQA decode here: {e}", allow_module_level=True)


# ----------------------------------------------------------------------------------------
# Problems (built on the CPU from a seeded generator, then moved to the GPU).


def block_table(gen, lengths, page=64, spare_blocks=1):
    """A block table over shuffled physical blocks, `spare_blocks` more columns than the
    longest sequence needs (every column has a block: room to append), and the block count."""
    width = max(1, max(math.ceil(n / page) for n in lengths)) + spare_blocks
    num_blocks = len(lengths) * width + 3
    table = torch.randperm(num_blocks, generator=gen)[: len(lengths) * width].view(len(lengths), width)
    return table.to(torch.int32).contiguous(), num_blocks


def fill_caches(gen, table, lengths, num_blocks, h_kv=8, d=128, page=64, dtype=torch.bfloat16):
    """k_cache, v_cache on the GPU holding values at positions [0, lengths[i]) of each
    sequence where `table` (host) says, NaN in every other slot."""
    caches = []
    for _ in range(2):
        cache = torch.full((num_blocks, page, h_kv, d), float("nan"))
        for i, n in enumerate(lengths):
            rows = (torch.randn((n, h_kv, d), generator=gen) / 4).clamp(-1, 1)
            for pos in range(n):
                cache[table[i, pos // page], pos % page] = rows[pos]
        caches.append(cache.to(dtype).cuda())
    return caches


def paged_case(gen, lengths, s_q=1, h_q=32, h_kv=8, d=128, page=64, dtype=torch.bfloat16, spare_blocks=1):
    """q, k_cache, v_cache (NaN in every unused slot), block_table, cache_seqlens; on the GPU."""
    table, num_blocks = block_table(gen, lengths, page, spare_blocks)
    k, v = fill_caches(gen, table, lengths, num_blocks, h_kv, d, page, dtype)
    q = torch.randn((len(lengths), s_q, h_q, d), generator=gen).to(dtype).cuda()
    return q, k, v, table.cuda(), torch.tensor(lengths, dtype=torch.int32).cuda()


def new_rows(gen, b, s_q, h_kv, d, dtype=torch.bfloat16):
    return [(torch.randn((b, s_q, h_kv, d), generator=gen) / 4).to(dtype).cuda() for _ in range(2)]


def host(x):
    """A host copy (a float is passed through)."""
    return x.detach().cpu().clone() if isinstance(x, torch.Tensor) else x


def host_reference(q, k_cache, v_cache, block_table, cache_seqlens, **kw):
    """mlakit's float64 CPU reference on host copies: (out float32 unrounded, lse, host
    caches after the append, host scales after the append)."""
    args = {name: host(value) for name, value in kw.items()}
    k, v = host(k_cache), host(v_cache)
    out = torch.empty(q.shape, dtype=torch.float32)
    _, lse = mlakit.gqa_decode(host(q), k, v, host(block_table), host(cache_seqlens), out=out, return_lse=True,
                               **args)
    return out, lse, k, v, args.get("k_scale"), args.get("v_scale")


def check(out, lse, ref_out, ref_lse):
    check_out(out.float().cpu().numpy(), ref_out.double().numpy())
    check_stat(lse.cpu().numpy(), ref_lse.double().numpy())


def same_bits(a, b):
    """Equal dtypes, shapes and bytes (NaN included), wherever the tensors live."""
    a, b = a.detach().cpu().contiguous(), b.detach().cpu().contiguous()
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    as_int = {1: torch.uint8, 2: torch.int16, 4: torch.int32}[a.element_size()]
    return torch.equal(a.view(as_int), b.view(as_int))


def assert_caches_agree(gpu, ref, gpu_scale, ref_scale):
    """The GPU's cache against the host reference's after the same append: identical bytes and
    scales (the reference stores appended rows as the GPU does, rotation included:
    reference/gqa_cache_ref.h, append_cache_row)."""
    assert same_bits(gpu, ref), "the appended cache rows differ from the reference's"
    if gpu_scale is not None:
        assert same_bits(gpu_scale, ref_scale), "the appended rows' scales differ from the reference's"


# ----------------------------------------------------------------------------------------
# The decode.

CASES = {
    # name: (lengths, s_q, h_q, h_kv, d, page, dtype, options)
    "llama_bf16": ((0, 1, 63, 64, 65, 4109, 300, 2000), 1, 32, 8, 128, 64, torch.bfloat16, {}),
    "mha_fp16_d64": ((17, 700, 64), 1, 16, 16, 64, 16, torch.float16, {}),
    "mqa_d256_page32": ((250, 40, 1), 1, 8, 1, 256, 32, torch.bfloat16, {}),
    "s_q4_causal_window": ((3, 129, 1000), 4, 16, 2, 128, 64, torch.bfloat16, dict(causal=True, window=100)),
    "softcap_alibi_scale": ((500, 2048), 2, 32, 4, 128, 64, torch.bfloat16,
                            dict(softcap=30.0, alibi=True, softmax_scale=0.2, causal=True)),
    "rope_q_only": ((77, 900), 1, 32, 8, 128, 64, torch.float16, dict(rope_style="gptj", rotary_dim=64)),
    "long_split": ((32768,), 1, 32, 8, 128, 64, torch.bfloat16, {}),
}


def _options(gen, h_q, options):
    opts = dict(options)
    if opts.pop("alibi", False):
        opts["alibi_slopes"] = torch.rand((h_q,), generator=gen).cuda() * 0.1
    return opts


@pytest.mark.parametrize("name", list(CASES))
def test_decode_matches_the_host_reference(name):
    lengths, s_q, h_q, h_kv, d, page, dtype, options = CASES[name]
    gen = generator(len(name))
    q, k, v, table, seqlens = paged_case(gen, lengths, s_q, h_q, h_kv, d, page, dtype)
    opts = _options(gen, h_q, options)
    out, lse = mlakit.gqa_decode(q, k, v, table, seqlens, return_lse=True, **opts)
    assert out.dtype == dtype and out.shape == q.shape and out.device == q.device
    assert lse.dtype == torch.float32 and lse.shape == (len(lengths), h_q, s_q)
    ref_out, ref_lse, *_ = host_reference(q, k, v, table, seqlens, **opts)
    check(out, lse, ref_out, ref_lse)


@pytest.mark.parametrize("kind", ["int8", "fp8", "fp8_per_tensor"])
def test_quantized_caches(kind):
    gen = generator(10)
    q, k, v, table, seqlens = paged_case(gen, (1, 700, 3000, 64), s_q=2, page=64)
    k, v = k.nan_to_num(0.0), v.nan_to_num(0.0)
    dtype = "int8" if kind == "int8" else "fp8"
    tensor_scale = 0.003 if kind == "fp8_per_tensor" else None
    kq, ks = mlakit.quantize_gqa_cache(k, dtype, scale=tensor_scale)
    vq, vs = mlakit.quantize_gqa_cache(v, dtype, scale=tensor_scale)
    assert kq.dtype == (torch.int8 if dtype == "int8" else torch.float8_e4m3fn) and kq.device == k.device
    # The GPU tool stores what the CPU one stores.
    kq_host, ks_host = mlakit.quantize_gqa_cache(k.cpu(), dtype, scale=tensor_scale)
    assert same_bits(kq, kq_host) and same_bits(ks, ks_host)
    back = mlakit.dequantize_gqa_cache(kq, ks)
    assert back.dtype == torch.bfloat16 and same_bits(back, mlakit.dequantize_gqa_cache(kq_host, ks_host))
    out, lse = mlakit.gqa_decode(q, kq, vq, table, seqlens, k_scale=ks, v_scale=vs, causal=True, return_lse=True)
    ref_out, ref_lse, *_ = host_reference(q, kq, vq, table, seqlens, k_scale=ks, v_scale=vs, causal=True)
    check(out, lse, ref_out, ref_lse)
    # Their bytes as uint8 are read as fp8 too.
    if dtype == "fp8":
        again = mlakit.gqa_decode(q, kq.view(torch.uint8), vq.view(torch.uint8), table, seqlens, k_scale=ks,
                                  v_scale=vs, causal=True)
        assert same_bits(again, out)


@pytest.mark.parametrize("kind", ["int8", "fp8", "fp8_per_tensor"])
@pytest.mark.parametrize("q_dtype", [torch.bfloat16, torch.float16])
def test_quantized_results_follow_their_scales_exactly_across_the_float_range(kind, q_dtype):
    """The decode over a quantized cache is exact in the scales' exponents: value scales times
    2^v give outputs times 2^v and key scales times 2^-40 with the softmax scale times 2^40
    the same logits, bit for bit, although fp16 (the matrix units' type for these caches)
    spans only 2^-24 .. 2^16; bf16 q times 2^-60 (softmax scale times 2^60) too, as bf16 rows
    are scaled into fp16's range by a power of two. v = 60 with bf16 outputs, 10 with fp16
    ones (their own range; and only the outputs that are normal fp16 numbers both times)."""
    gen = generator(14)
    q, k, v, table, seqlens = paged_case(gen, (900, 5, 2500), s_q=2, page=16, dtype=q_dtype)
    kq, ks, vq, vs = _quantized(k, v, kind)
    scale = 0.125
    base, base_lse = mlakit.gqa_decode(q, kq, vq, table, seqlens, k_scale=ks, v_scale=vs, softmax_scale=scale,
                                       causal=True, return_lse=True)
    q_shift = 60 if q_dtype == torch.bfloat16 else 0  # fp16 q has no exponent range to give
    v_shift = 60 if q_dtype == torch.bfloat16 else 10
    out, lse = mlakit.gqa_decode(q * 2.0**-q_shift, kq, vq, table, seqlens, k_scale=ks * 2.0**-40,
                                 v_scale=vs * 2.0**v_shift, softmax_scale=scale * 2.0 ** (40 + q_shift), causal=True,
                                 return_lse=True)
    assert torch.isfinite(base).all() and torch.isfinite(out).all()
    # fp16 outputs below 2^-14 are subnormal, rounded on a coarser grid than their 2^10 multiples.
    normal = base.float().abs() >= (2.0**-14 if q_dtype == torch.float16 else 0.0)
    assert normal.float().mean() > 0.9
    assert torch.equal(out.float()[normal], base.float()[normal] * 2.0**v_shift)
    assert torch.equal(lse, base_lse)


APPENDS = {
    # name: (cache kind, rope style, rotary_dim, dtype)
    "bf16_no_rope": ("same", None, 0, torch.bfloat16),
    "bf16_neox": ("same", "neox", 0, torch.bfloat16),
    "fp16_gptj_partial": ("same", "gptj", 64, torch.float16),
    "int8_neox": ("int8", "neox", 0, torch.bfloat16),
    "int8_no_rope": ("int8", None, 0, torch.bfloat16),
    "fp8_neox": ("fp8", "neox", 0, torch.bfloat16),
    "fp8_per_tensor_gptj": ("fp8_per_tensor", "gptj", 0, torch.bfloat16),
}


def _quantized(k, v, kind):
    if kind == "same":
        return k, None, v, None
    dtype = "int8" if kind == "int8" else "fp8"
    tensor_scale = 0.004 if kind == "fp8_per_tensor" else None
    kq, ks = mlakit.quantize_gqa_cache(k.nan_to_num(0.0), dtype, scale=tensor_scale)
    vq, vs = mlakit.quantize_gqa_cache(v.nan_to_num(0.0), dtype, scale=tensor_scale)
    return kq, ks, vq, vs


@pytest.mark.parametrize("name", list(APPENDS))
def test_fused_append_with_rope(name):
    kind, style, rotary_dim, dtype = APPENDS[name]
    gen = generator(20 + len(name))
    s_q = 2
    q, k, v, table, seqlens = paged_case(gen, (2, 63, 64, 1000), s_q=s_q, dtype=dtype)
    k, ks, v, vs = _quantized(k, v, kind)
    k_new, v_new = new_rows(gen, 4, s_q, 8, 128, dtype)
    opts = dict(k_scale=ks, v_scale=vs, k_new=k_new, v_new=v_new, rope_style=style, rotary_dim=rotary_dim,
                causal=True)
    ref_out, ref_lse, k_ref, v_ref, ks_ref, vs_ref = host_reference(q, k, v, table, seqlens, **opts)
    # The append tool on copies stores exactly what the fused append stores.
    tool = [x.clone() if x is not None else None for x in (k, ks, v, vs)]
    mlakit.gqa_cache_append(k_new, v_new, tool[0], tool[2], table, seqlens, k_scale=tool[1], v_scale=tool[3],
                            rope_style=style, rotary_dim=rotary_dim)
    out, lse = mlakit.gqa_decode(q, k, v, table, seqlens, return_lse=True, **opts)
    check(out, lse, ref_out, ref_lse)
    assert_caches_agree(k, k_ref, ks, ks_ref)
    assert_caches_agree(v, v_ref, vs, vs_ref)
    for fused, alone in zip((k, ks, v, vs), tool):
        if fused is not None:
            assert same_bits(fused, alone)


def test_finished_entries_are_skipped():
    gen = generator(30)
    q, k, v, table, seqlens = paged_case(gen, (100, 200, 300), s_q=1)
    k_new, v_new = new_rows(gen, 3, 1, 8, 128)
    finished = torch.tensor([0, 1, 0], dtype=torch.uint8, device="cuda")
    out = torch.full(q.shape, 7.0, dtype=q.dtype, device="cuda")
    k_before = k.clone()
    opts = dict(k_new=k_new, v_new=v_new, finished=finished, rope_style="neox")
    ref_out, _, k_ref, *_ = host_reference(q, k, v, table, seqlens, **opts)
    mlakit.gqa_decode(q, k, v, table, seqlens, out=out, **opts)
    assert bool((out[1] == 7).all())
    check_out(out[[0, 2]].float().cpu().numpy(), ref_out[[0, 2]].double().numpy())
    row = table[1, 199 // 64].long()
    assert same_bits(k[row], k_before[row])  # entry 1's append skipped


def test_one_plan_serves_every_layer():
    gen = generator(40)
    lengths = (100, 5000, 0, 64)
    q, k, v, table, seqlens = paged_case(gen, lengths)
    workspace, plan = mlakit.gqa_decode_plan(seqlens, 1, 32, 8, 128)
    assert plan.device == torch.cuda.current_device() and plan.kernel == "gpu" and plan.num_parts >= 1
    assert (plan.b, plan.s_q, plan.h_q, plan.h_kv, plan.d) == (4, 1, 32, 8, 128)
    assert workspace.device == q.device and workspace.numel() == plan.workspace_bytes
    for layer in range(3):
        k, v = fill_caches(gen, table.cpu(), lengths, k.shape[0])
        scale = 0.05 * (layer + 1)
        out, lse = mlakit.gqa_decode(q, k, v, table, seqlens, softmax_scale=scale, return_lse=True,
                                     plan=(workspace, plan))
        ref_out, ref_lse, *_ = host_reference(q, k, v, table, seqlens, softmax_scale=scale)
        check(out, lse, ref_out, ref_lse)


def test_runs_on_the_callers_current_stream():
    gen = generator(50)
    q, k, v, table, seqlens = paged_case(gen, (3000, 20))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(10_000_000)  # a long kernel first: mlakit's work must queue behind it
        q_late = q * 1
        out = mlakit.gqa_decode(q_late, k, v, table, seqlens)
    torch.cuda.current_stream().wait_stream(side)
    ref_out, *_ = host_reference(q, k, v, table, seqlens)
    check_out(out.float().cpu().numpy(), ref_out.double().numpy())


@pytest.mark.parametrize("kind", ["same", "int8"])
def test_cuda_graph_of_plan_append_and_decode_replays_with_new_lengths(kind):
    """One decoding step of two layers (plan, then per layer append + rope + attention),
    captured once and replayed for successive steps: each replay appends at the new lengths."""
    gen = generator(60)
    capacity = (700, 90, 5, 2000)
    start = (600, 40, 2, 1800)
    s_q = 2
    q, k, v, table, seqlens = paged_case(gen, start, s_q=s_q, spare_blocks=3)
    layers = [_quantized(k, v, kind), _quantized(*fill_caches(gen, table.cpu(), start, k.shape[0]), kind)]
    k_new, v_new = new_rows(gen, 4, s_q, 8, 128)

    def step():
        plan = mlakit.gqa_decode_plan(seqlens, s_q, 32, 8, 128, causal=True)
        return [
            mlakit.gqa_decode(q, k, v, table, seqlens, k_scale=ks, v_scale=vs, k_new=k_new, v_new=v_new,
                              rope_style="neox", causal=True, return_lse=True, plan=plan)
            for k, ks, v, vs in layers
        ]

    graph, results = capture(step)  # (its warm-up call appends at the start lengths)

    lengths = list(start)
    for _ in range(3):
        lengths = [min(n + s_q, c) for n, c in zip(lengths, capacity)]
        seqlens.copy_(torch.tensor(lengths, dtype=torch.int32))
        q.copy_(torch.randn(q.shape, generator=gen).to(q.dtype))
        k_new.copy_((torch.randn(k_new.shape, generator=gen) / 4).to(k_new.dtype))
        v_new.copy_((torch.randn(v_new.shape, generator=gen) / 4).to(v_new.dtype))
        torch.cuda.synchronize()
        refs = [host_reference(q, k, v, table, seqlens, k_scale=ks, v_scale=vs, k_new=k_new, v_new=v_new,
                               rope_style="neox", causal=True) for k, ks, v, vs in layers]
        graph.replay()
        torch.cuda.synchronize()
        for (out, lse), (ref_out, ref_lse, k_ref, v_ref, ks_ref, vs_ref), (k, ks, v, vs) in zip(results, refs, layers):
            check(out, lse, ref_out, ref_lse)
            assert_caches_agree(k, k_ref, ks, ks_ref)
            assert_caches_agree(v, v_ref, vs, vs_ref)


def test_no_query_rows():
    gen = generator(70)
    _, k, v, table, seqlens = paged_case(gen, (10, 20))
    q = torch.zeros((0, 1, 32, 128), dtype=torch.bfloat16, device="cuda")
    out, lse = mlakit.gqa_decode(q, k, v, table[:0], seqlens[:0], return_lse=True)
    assert out.shape == (0, 1, 32, 128) and lse.shape == (0, 32, 1)


def test_device_errors_carry_the_library_message():
    gen = generator(80)
    q, k, v, table, seqlens = paged_case(gen, (10, 20))
    with pytest.raises(ValueError, match=r"block_table\.dtype: expected int32, got float32"):
        mlakit.gqa_decode(q, k, v, table.float(), seqlens)
    with pytest.raises(ValueError, match=r"^gqa_decode: cache_seqlens: expected device memory"):
        mlakit.gqa_decode(q, k, v, table, seqlens.cpu())
    with pytest.raises(ValueError, match=r"h_q"):
        mlakit.gqa_decode(q, k, v, table, seqlens, plan=mlakit.gqa_decode_plan(seqlens, 1, 16, 8, 128))
    with pytest.raises(ValueError, match=r"causal"):
        mlakit.gqa_decode(q, k, v, table, seqlens, plan=mlakit.gqa_decode_plan(seqlens, 1, 32, 8, 128, causal=True))
    with pytest.raises(ValueError, match=r"k_cache\.scale"):
        mlakit.gqa_decode(q, k.to(torch.int8), v.to(torch.int8), table, seqlens)
