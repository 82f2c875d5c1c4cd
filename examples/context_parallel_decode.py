#!/usr/bin/env python3
"""Context-parallel decode with mlakit: every sequence's KV cache split over the GPUs of a
torch.distributed process group (NCCL), each GPU attending over its shard, the partial
states merged exactly with ``mlakit.merge_states`` (docs/python.md, Merging partial states).

The recipe, per layer of a decoding step (``context_parallel_decode`` below):

1. **Shard**: rank r of W holds a contiguous range of every sequence's tokens in its own paged
   cache, with its own block table and its own lengths (``cache_seqlens`` of its range). Any
   contiguous split works; here the ranges start at page boundaries (``shard_bounds``). A
   rank whose range of a sequence is empty passes length 0 for it: its state comes back
   empty (out 0, LSE +inf), and the merge skips it.
2. **Attend**: every rank runs the step's queries (the same on every rank) over its shard with
   mlakit's decode, which returns the output and the natural-log LSE of the rank's keys:
   ``mla_decode`` -> ``(out [b, s_q, h_q, 512], lse [b, h_q, s_q])``, ``gqa_decode(...,
   return_lse=True)`` likewise with out ``[b, s_q, h_q, d]``. Each rank plans with its own
   lengths (once per step: pass the plan to every layer's call).
3. **Gather**: ``all_gather_into_tensor`` of out and lse into ``[W, b, s_q, h_q, d]`` and
   ``[W, b, h_q, s_q]``: W * b * s_q * h_q * (2 d + 4) bytes per layer, whatever the lengths.
4. **Merge**: ``mlakit.merge_states`` on the stacked states, the LSE passed as the view
   ``[W, b, s_q, h_q]`` of its ``[W, b, h_q, s_q]`` memory (no copy), gives the attention over
   the whole sequences, within the accuracy rules of docs/contract.md of the one-GPU result.

Queries per step: s_q = 1 here. Several non-causal query tokens (s_q > 1) work as they are.
A causal mask does not: each call aligns it to the end of its own keys, so every shard but
the last would hide keys that all the queries should see; causal MTP across shards needs the
mask on the last shard alone (and that shard holding the last s_q - 1 positions), which this
example does not do.

Run on W GPUs of one host, checking the result against the one-GPU decode of the whole cache
(one PASS / FAIL line per operation on rank 0; the exit status is nonzero on a failure):

    torchrun --standalone --nproc_per_node=2 examples/context_parallel_decode.py --check

``--cpu`` runs the same on CPU tensors with the gloo backend (mlakit's float64 CPU reference
per shard: keep it small, e.g. ``--cpu --b 4 --max-len 300``). tests/python/test_context_parallel.py
runs the shards one after another on one GPU.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import statistics
import sys
from typing import List, Optional, Tuple

import torch
import torch.distributed as dist

import mlakit

# NVLink multicast stays off in every process (NCCL, PyTorch's symmetric memory, NVSHMEM):
# on shared machines a program that uses it can put the host's GPUs out of service.
NVLINK_MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}

PAGE = 64
SHORT_LENGTH = 37  # a sequence within one page: every rank but the first holds none of it
# The problems of the check: (h_q, h_kv, d of q and the cache); MLA's out has 512 columns.
SHAPES = {"mla": (128, 1, 576), "gqa": (32, 8, 128)}


@dataclasses.dataclass
class PagedProblem:
    """One decoding step of one layer over a paged cache: the whole cache, or a rank's shard."""

    kind: str  # "mla" (mlakit.mla_decode) or "gqa" (mlakit.gqa_decode)
    q: torch.Tensor  # [b, s_q, h_q, d_qk]
    caches: Tuple[torch.Tensor, ...]  # (kv_cache,) or (k_cache, v_cache): [num_blocks, page, h_kv, d]
    block_table: torch.Tensor  # [b, max_blocks] int32, -1 past each sequence's blocks
    cache_seqlens: torch.Tensor  # [b] int32


def shard_bounds(length: int, world_size: int, page: int) -> List[Tuple[int, int]]:
    """The contiguous token range [start, end) of a sequence of `length` tokens that each of
    `world_size` ranks holds: ceil(length / world_size) rounded up to whole pages per rank, so
    each shard is whole pages of the sequence, the last ranks' ranges possibly empty.

    length 300, 2 ranks, page 64: 150 -> 192 tokens a rank: [(0, 192), (192, 300)].
    length 150, 4 ranks: 38 -> 64: [(0, 64), (64, 128), (128, 150), (150, 150)].
    length 37, 2 ranks: [(0, 37), (37, 37)]; length 0: [(0, 0)] * world_size.
    """
    per_rank = math.ceil(math.ceil(length / world_size) / page) * page
    return [(min(length, r * per_rank), min(length, (r + 1) * per_rank)) for r in range(world_size)]


def shard_paged_caches(problem: PagedProblem, rank: int, world_size: int) -> PagedProblem:
    """Rank `rank`'s shard of `problem`: its range of every sequence (shard_bounds) copied into
    a cache of its own, with its own block table and lengths; the same queries. An engine
    writes each token into the owning rank's cache directly; this builds the shards of a
    whole cache for the example and the tests."""
    page = problem.caches[0].shape[1]
    table = problem.block_table.cpu()
    blocks: List[List[int]] = []  # the physical blocks of the whole cache that this shard holds, per sequence
    lengths = []
    for i, length in enumerate(problem.cache_seqlens.tolist()):
        start, end = shard_bounds(length, world_size, page)[rank]
        blocks.append(table[i, start // page : math.ceil(end / page)].tolist())
        lengths.append(end - start)
    held = [block for sequence in blocks for block in sequence]
    width = max([1] + [len(sequence) for sequence in blocks])
    local_table = torch.full((len(blocks), width), -1, dtype=torch.int32)
    first = 0
    for i, sequence in enumerate(blocks):
        local_table[i, : len(sequence)] = torch.arange(first, first + len(sequence), dtype=torch.int32)
        first += len(sequence)
    device = problem.q.device
    caches = tuple(_copy_blocks(cache, held) for cache in problem.caches)
    return PagedProblem(problem.kind, problem.q, caches, local_table.to(device),
                        torch.tensor(lengths, dtype=torch.int32, device=device))


def _copy_blocks(cache: torch.Tensor, blocks: List[int]) -> torch.Tensor:
    """A cache of the given blocks of `cache`, in that order (at least one block: a shard with
    no tokens still passes a cache, which is never read)."""
    local = cache.new_empty((max(1, len(blocks)),) + tuple(cache.shape[1:]))
    if blocks:
        local[: len(blocks)] = cache[torch.tensor(blocks, device=cache.device)]
    return local


def decode(problem: PagedProblem) -> Tuple[torch.Tensor, torch.Tensor]:
    """mlakit's decode of `problem`: (out [b, s_q, h_q, d_v], lse [b, h_q, s_q] natural log).
    The plan is made by the call here; an engine makes it once per step from the rank's own
    lengths and passes it to every layer's decode."""
    p = problem
    if p.kind == "mla":
        return mlakit.mla_decode(p.q, p.caches[0], p.block_table, p.cache_seqlens)
    return mlakit.gqa_decode(p.q, p.caches[0], p.caches[1], p.block_table, p.cache_seqlens, return_lse=True)


def all_gather_states(out: torch.Tensor, lse: torch.Tensor, group: Optional[dist.ProcessGroup] = None):
    """Every rank's (out, lse), stacked: ([W, *out.shape], [W, *lse.shape])."""
    world_size = dist.get_world_size(group)

    def gather(x: torch.Tensor) -> torch.Tensor:
        # Ranks concatenated along the first dimension (what every backend takes), then viewed apart.
        gathered = x.new_empty((world_size * x.shape[0],) + tuple(x.shape[1:]))
        dist.all_gather_into_tensor(gathered, x.contiguous(), group=group)
        return gathered.view((world_size,) + tuple(x.shape))

    return gather(out), gather(lse)


def merge_gathered(out_all: torch.Tensor, lse_all: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """The states of W shards, out_all [W, b, s_q, h_q, d] and lse_all [W, b, h_q, s_q] (the
    decode's layout), merged: (out [b, s_q, h_q, d], lse [b, h_q, s_q]), as one decode of the
    whole cache returns them. The LSEs are read and written through [.., s_q, h_q] views."""
    _, b, s_q, h_q, _ = out_all.shape
    lse = lse_all.new_empty((b, h_q, s_q))
    out, _ = mlakit.merge_states(out_all, lse_all.transpose(2, 3), out_lse=lse.transpose(1, 2))
    return out, lse


def context_parallel_decode(shard: PagedProblem, group: Optional[dist.ProcessGroup] = None):
    """This rank's part of one context-parallel decode: attend over its shard, gather every
    rank's state, merge. Every rank returns the whole result (out, lse)."""
    out, lse = decode(shard)
    return merge_gathered(*all_gather_states(out, lse, group))


def make_problem(kind: str, seed: int, b: int, max_len: int, device: str = "cuda") -> PagedProblem:
    """A random decode step, the same for a seed on every rank: lengths in [1, max_len] but
    sequence 0 (empty) and 1 (SHORT_LENGTH tokens, within one page) and 2 (max_len); a
    shuffled block table; cache values N(0, 1) / 10 clamped to [-1, 1] (docs/contract.md's
    scale), NaN in every slot past a length; q ~ N(0, 1); bfloat16. Lengths and the table
    come from a CPU generator, the values from one on `device`."""
    if b < 3:
        raise ValueError(f"make_problem: b: expected >= 3 (an empty, a short and a full sequence), got {b}")
    h_q, h_kv, d = SHAPES[kind]
    host = torch.Generator().manual_seed(seed)
    values = torch.Generator(device=device).manual_seed(seed + 1)
    lengths = torch.randint(1, max_len + 1, (b,), generator=host)
    lengths[:3] = torch.tensor([0, min(SHORT_LENGTH, max_len), max_len])
    blocks_per_seq = max(1, math.ceil(max_len / PAGE))
    table = torch.randperm(b * blocks_per_seq, generator=host).view(b, blocks_per_seq).to(torch.int32)
    for i, length in enumerate(lengths.tolist()):
        table[i, math.ceil(length / PAGE) :] = -1
    # The slots that hold tokens; the others (blocks no sequence holds, the tails of last
    # blocks) stay NaN, so that a read past a length shows.
    slots = (table.long().clamp(min=0) * PAGE).unsqueeze(-1) + torch.arange(PAGE)
    position = torch.arange(blocks_per_seq * PAGE).view(blocks_per_seq, PAGE)
    used = slots[(table >= 0).unsqueeze(-1) & (position < lengths.view(b, 1, 1))].to(device)

    def cache() -> torch.Tensor:
        x = torch.empty((b * blocks_per_seq * PAGE, h_kv, d), device=device).normal_(generator=values)
        poisoned = torch.full_like(x, math.nan)
        poisoned[used] = (x[used] / 10).clamp(-1, 1)
        return poisoned.to(torch.bfloat16).view(b * blocks_per_seq, PAGE, h_kv, d)

    caches = (cache(),) if kind == "mla" else (cache(), cache())
    q = torch.empty((b, 1, h_q, d), device=device).normal_(generator=values).to(torch.bfloat16)
    return PagedProblem(kind, q, caches, table.to(device), lengths.to(torch.int32).to(device))


def compare(out, lse, want_out, want_lse) -> Tuple[bool, str]:
    """The accuracy rules of docs/contract.md (SPEC section 8) for (out, lse) against the
    one-GPU result: every out element within abs 1e-3 or rel 2/128, cosine difference <= 5e-6,
    every LSE within abs 1e-6 or rel 8/65536, infinities at the same positions, no NaN.
    Returns (passed, the broken rules and the figures as one line)."""
    broken, figures = [], []
    for name, got, want, abs_tol, rel_tol in (("out", out, want_out, 1e-3, 2 / 128),
                                              ("lse", lse, want_lse, 1e-6, 8 / 65536)):
        got, want = got.double(), want.double()
        if torch.isnan(got).any():
            broken.append(f"{name} has NaN")
        for special in (math.inf, -math.inf):
            if not torch.equal(got == special, want == special):
                broken.append(f"{name} has {special} at other positions")
        finite = torch.isfinite(want) & torch.isfinite(got)
        err = (got - want).abs()[finite]
        over = int((err > torch.clamp(want.abs()[finite] * rel_tol, min=abs_tol)).sum())
        if over:
            broken.append(f"{over} {name} values out of tolerance")
        figures.append(f"max |{name} diff| {float(err.max()) if err.numel() else 0.0:.3g}")
    a, e = out.double().nan_to_num(), want_out.double()
    cos_diff = float(1 - 2 * (a * e).sum() / ((a * a).sum() + (e * e).sum()))
    if not cos_diff <= 5e-6:
        broken.append("cosine difference > 5e-6")
    figures.append(f"cosine diff {cos_diff:.3g}")
    return not broken, "; ".join(broken + figures)


def _median_us(fn, repeats: int = 20) -> float:
    """Median device time of fn() in microseconds (CUDA events; every rank calls this)."""
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return statistics.median(times)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="compare with the one-GPU decode of the whole cache")
    parser.add_argument("--cpu", action="store_true", help="CPU tensors and the gloo backend (the CPU reference)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--b", type=int, default=6, help="sequences (>= 3)")
    parser.add_argument("--max-len", type=int, default=32768, help="the longest sequence")
    args = parser.parse_args(argv)
    for name, value in NVLINK_MULTICAST_OFF.items():
        os.environ.setdefault(name, value)  # before torch.distributed starts NCCL

    if args.cpu:
        device = "cpu"
        dist.init_process_group("gloo")
    else:
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local_rank)
        device = f"cuda:{local_rank}"
        dist.init_process_group("nccl", device_id=torch.device(device))
    try:
        rank, world_size = dist.get_rank(), dist.get_world_size()
        passed = True
        for kind in SHAPES:
            problem = make_problem(kind, args.seed, args.b, args.max_len, device)
            shard = shard_paged_caches(problem, rank, world_size)
            out, lse = context_parallel_decode(shard)
            timing = "" if args.cpu else f", {_median_us(lambda: context_parallel_decode(shard)):.0f} us a step"
            held = shard.cache_seqlens.tolist()
            line = f"{kind} decode on {world_size} ranks: b={args.b}, lengths {problem.cache_seqlens.tolist()}"
            if rank == 0:
                print(f"{line}; rank 0 holds {held}{timing}", flush=True)
            if args.check and rank == 0:
                ok, figures = compare(out, lse, *decode(problem))
                passed &= ok
                print(f"{'PASS' if ok else 'FAIL'} {kind}: {world_size} shards merged vs one device: {figures}",
                      flush=True)
        verdict = torch.tensor([int(passed)], device=device)
        dist.broadcast(verdict, src=0)  # every rank exits with rank 0's verdict
        return 0 if int(verdict) else 1
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
