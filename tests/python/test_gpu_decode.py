"""Dense decode on PyTorch CUDA tensors against the float64 PyTorch reference: the native
mlakit API, plan reuse across layers, the caller's stream, CUDA-graph capture of plan +
decode, and errors. Skipped without torch or CUDA."""

import pytest

torch = pytest.importorskip("torch")

import mlakit  # noqa: E402
from torch_cases import (  # noqa: E402
    activations,
    capture,
    block_table,
    check,
    dense_reference,
    fill_cache,
    generator,
    paged_cache,
    require_gpu,
    seqlens,
)

require_gpu()

CASES = {
    # name: (lengths, s_q, h_q, h_kv, page, causal, dtype)
    "deepseek": ((0, 1, 63, 64, 65, 4109, 300, 2000), 1, 128, 1, 64, False, torch.bfloat16),
    "mtp_fp16": ((1, 2, 500, 3000), 2, 64, 1, 64, True, torch.float16),
    "kv_heads": ((17, 700, 64), 1, 32, 2, 32, False, torch.bfloat16),
    "page16_s4": ((3, 129, 1000), 4, 16, 1, 16, True, torch.bfloat16),
    "ratio3": ((250, 40), 1, 3, 1, 64, False, torch.bfloat16),
}


@pytest.mark.parametrize("name", list(CASES))
def test_decode_matches_reference(name):
    lengths, s_q, h_q, h_kv, page, causal, dtype = CASES[name]
    gen = generator(len(name))
    kv, table = paged_cache(gen, lengths, h_kv, page, dtype)
    q = activations(gen, (len(lengths), s_q, h_q, 576), dtype)
    cache_seqlens = seqlens(lengths)
    out, lse = mlakit.mla_decode(q, kv, table, cache_seqlens, causal=causal)
    assert out.dtype == dtype and out.shape == (len(lengths), s_q, h_q, 512) and out.device == q.device
    assert lse.dtype == torch.float32 and lse.shape == (len(lengths), h_q, s_q)
    check(out, lse, *dense_reference(q, kv, table, cache_seqlens, causal=causal))


def test_one_plan_serves_every_layer_and_the_softmax_scale_is_used():
    lengths = (100, 5000, 0, 64)
    gen = generator(1)
    cache_seqlens = seqlens(lengths)
    plan = mlakit.mla_decode_plan(cache_seqlens, 1, 128, 1)
    assert plan[1].b == 4 and plan[1].num_parts >= 1
    for layer in range(3):
        kv, table = paged_cache(gen, lengths)
        q = activations(gen, (4, 1, 128, 576))
        scale = 0.1 * (layer + 1)
        out, lse = mlakit.mla_decode(q, kv, table, cache_seqlens, softmax_scale=scale, plan=plan)
        check(out, lse, *dense_reference(q, kv, table, cache_seqlens, scale=scale))


def test_runs_on_the_callers_current_stream():
    lengths = (3000, 20)
    gen = generator(2)
    kv, table = paged_cache(gen, lengths)
    q = activations(gen, (2, 1, 128, 576))
    cache_seqlens = seqlens(lengths)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        # A long kernel first on the same stream: mlakit's work must queue behind it.
        torch.cuda._sleep(10_000_000)
        q_late = q * 1
        out, lse = mlakit.mla_decode(q_late, kv, table, cache_seqlens)
    torch.cuda.current_stream().wait_stream(side)
    check(out, lse, *dense_reference(q, kv, table, cache_seqlens))


def test_cuda_graph_of_plan_and_decode_replays_with_new_lengths_and_contents():
    capacity = (4200, 300, 64, 1000, 2)
    gen = generator(3)
    table, num_blocks = block_table(gen, capacity)
    layers = [fill_cache(gen, table, capacity, num_blocks) for _ in range(2)]
    cache_seqlens = seqlens(capacity)
    q = activations(gen, (5, 2, 64, 576))

    def step():
        plan = mlakit.mla_decode_plan(cache_seqlens, 2, 64, 1)
        return [mlakit.mla_decode(q, kv, table, cache_seqlens, causal=True, plan=plan) for kv in layers]

    graph, results = capture(step)

    for lengths in ((4200, 300, 64, 1000, 2), (1, 0, 63, 999, 2), (4000, 299, 10, 1000, 0)):
        cache_seqlens.copy_(seqlens(lengths))
        q.copy_(activations(gen, q.shape))
        first = layers[0][int(table[0, 0])]
        first.copy_(first.flip(-1))  # new contents in a used block (NaN rows stay NaN)
        graph.replay()
        torch.cuda.synchronize()
        for kv, (out, lse) in zip(layers, results):
            check(out, lse, *dense_reference(q, kv, table, cache_seqlens, causal=True))


def test_device_errors_carry_the_library_message():
    lengths = (10, 20)
    gen = generator(4)
    kv, table = paged_cache(gen, lengths)
    q = activations(gen, (2, 1, 128, 576))
    cache_seqlens = seqlens(lengths)
    with pytest.raises(ValueError, match=r"block_table\.dtype: expected int32, got float32"):
        mlakit.mla_decode(q, kv, table.float(), cache_seqlens)
    with pytest.raises(ValueError, match=r"h_q: expected 64 \(the plan's\), got 128"):
        mlakit.mla_decode(q, kv, table, cache_seqlens, plan=mlakit.mla_decode_plan(cache_seqlens, 1, 64, 1))
    with pytest.raises(ValueError, match="cache_seqlens"):
        mlakit.mla_decode(q, kv, table, cache_seqlens.cpu())
