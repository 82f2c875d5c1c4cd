"""Context-parallel decode (examples/context_parallel_decode.py) on one device: the shards of
every sequence's cache decoded one after another, their states stacked as the all-gather
stacks them and merged with mlakit.merge_states, against one decode of the whole cache, under
the accuracy rules of docs/contract.md; for the MLA and the GQA decode, W = 2, 3, 4. On the
GPU (skipped without one) at up to 4096 tokens a sequence; on CPU tensors (the CPU reference
of every step) on a small problem. The shard ranges themselves need neither."""

import os
import sys

import pytest

torch = pytest.importorskip("torch")

import mlakit  # noqa: E402
from accuracy import check_out, check_stat  # noqa: E402
from torch_cases import require_gpu  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples"))
import context_parallel_decode as cp  # noqa: E402


def merged_shards(problem, world_size):
    """What every rank of a world_size group returns, computed on one device: each shard's
    decode, stacked along a new first dimension, merged."""
    states = [cp.decode(cp.shard_paged_caches(problem, rank, world_size)) for rank in range(world_size)]
    return cp.merge_gathered(torch.stack([out for out, _ in states]), torch.stack([lse for _, lse in states]))


def check_against_the_whole_cache(problem, world_size):
    out, lse = merged_shards(problem, world_size)
    want_out, want_lse = cp.decode(problem)
    assert out.shape == want_out.shape and lse.shape == want_lse.shape
    check_out(out.double().cpu().numpy(), want_out.double().cpu().numpy())
    check_stat(lse.cpu().numpy(), want_lse.cpu().numpy())
    assert torch.equal(out[0], torch.zeros_like(out[0])) and bool((lse[0] == float("inf")).all())  # length 0


@pytest.mark.parametrize("world_size", [2, 3, 4])
@pytest.mark.parametrize("kind", ["mla", "gqa"])
def test_shards_merged_on_one_gpu_equal_the_whole_cache(kind, world_size):
    require_gpu()
    problem = cp.make_problem(kind, seed=world_size, b=6, max_len=4096, device="cuda")
    check_against_the_whole_cache(problem, world_size)


@pytest.mark.parametrize("kind", ["mla", "gqa"])
def test_shards_merged_on_cpu_tensors_equal_the_whole_cache(kind):
    problem = cp.make_problem(kind, seed=1, b=4, max_len=150, device="cpu")
    check_against_the_whole_cache(problem, 3)


def test_shard_ranges_cover_each_sequence_in_whole_pages():
    for length in (0, 1, 37, 63, 64, 65, 150, 300, 4096, 32767):
        for world_size in (1, 2, 3, 4, 8):
            bounds = cp.shard_bounds(length, world_size, 64)
            assert len(bounds) == world_size and bounds[0][0] == 0 and bounds[-1][1] == length
            assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))  # contiguous, in rank order
            assert all(start % 64 == 0 or start == length for start, _ in bounds)
    assert cp.shard_bounds(150, 4, 64) == [(0, 64), (64, 128), (128, 150), (150, 150)]
    assert cp.shard_bounds(37, 2, 64) == [(0, 37), (37, 37)]


def test_a_shard_holds_its_tokens_in_its_own_cache():
    problem = cp.make_problem("gqa", seed=2, b=4, max_len=300, device="cpu")
    lengths = problem.cache_seqlens.tolist()
    for rank in range(3):
        shard = cp.shard_paged_caches(problem, rank, 3)
        for i, length in enumerate(lengths):
            start, end = cp.shard_bounds(length, 3, cp.PAGE)[rank]
            assert int(shard.cache_seqlens[i]) == end - start
            for which in range(2):
                mine = tokens(shard.caches[which], shard.block_table[i], end - start)
                whole = tokens(problem.caches[which], problem.block_table[i], end)[start:]
                assert torch.equal(mine, whole)


def tokens(cache, table_row, length):
    """The first `length` tokens [length, h_kv, d] a block-table row names."""
    page = cache.shape[1]
    blocks = table_row[: -(-length // page)].long()
    return cache[blocks].flatten(0, 1)[:length]
