"""The cases of the side-by-side benchmark: docs/benchmarking.md's list, grouped in families.

A family is one operation and the sides it is timed on. The first side named is the
baseline of the ratio, `subject` the side the ratio is about: ratio = t_baseline / t_subject
(> 1: the subject is faster). A family whose operation mlakit does not have yet names no
mlakit side; a new operation adds a family here, a generator in data.py and a reference in
reference.py, and names its sides (the GQA decode: PyTorch SDPA on cuDNN against mlakit; the
MHA prefill, forward and backward: SDPA on cuDNN and on its flash backend against mlakit (the
backward also against mlakit's deterministic mode); the merge of partial states: the eager
PyTorch merge an engine would write against mlakit).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Dict, List, Optional, Sequence, Tuple

SIDES = ("flashmla", "mlakit", "mlakit_deterministic", "mlakit_sm90", "mlakit_sm90_deterministic", "sdpa_cudnn",
         "sdpa_flash", "torch")


@dataclasses.dataclass(frozen=True)
class Family:
    name: str
    label: str  # for the table and the chart
    sides: Tuple[str, ...]  # round order of round 0 (reversed in odd rounds); baseline first
    subject: str
    default: bool  # in a run without --families
    on_request: Tuple[str, ...] = ()  # sides run only when --sides names them (after `sides` in a round)

    @property
    def baseline(self) -> str:
        return self.sides[0]

    @property
    def every_side(self) -> Tuple[str, ...]:
        return self.sides + self.on_request


FAMILIES: Dict[str, Family] = {
    f.name: f
    for f in (
        Family("dense_decode", "dense MLA decode", ("flashmla", "mlakit"), "mlakit", True),
        Family("sparse_decode", "sparse FP8 MLA decode", ("flashmla", "mlakit"), "mlakit", True),
        Family("sparse_prefill", "sparse MLA prefill", ("flashmla", "mlakit"), "mlakit", True),
        # DeepSeek V4's sparse decode (issue 31): d_qk 512 over the 584-byte cache, with a second
        # cache (a window of recent tokens) under the same softmax, on FlashMLA's V4 shapes.
        Family("sparse_decode_v4", "sparse FP8 MLA decode, DeepSeek V4", ("flashmla", "mlakit"), "mlakit", True),
        # The GQA decode over a paged cache against PyTorch SDPA (cuDNN backend forced,
        # enable_gqa) over a contiguous cache holding the same values.
        Family("gqa", "GQA decode (paged bf16 / int8 / fp8 cache)", ("sdpa_cudnn", "mlakit"), "mlakit", True),
        # The MHA prefill over packed rows + cu_seqlens against PyTorch SDPA with the cuDNN and
        # with the flash backend forced (issue 26), on the same values: [b, h, s, d] where every
        # sequence is s long, one call per sequence on views of the very same packed rows for
        # the varlen mix. A backend that cannot run a case is reported as not supported there.
        Family("mha_prefill", "MHA prefill forward (bf16)", ("sdpa_cudnn", "sdpa_flash", "mlakit"), "mlakit", True),
        # Its backward (dq, dk, dv from dout and the forward's out and lse) on the same cases and
        # tensors: SDPA's autograd backward of a graph built once (cuDNN, the baseline, and the
        # flash backend), mlakit's mha_prefill_backward and its deterministic mode (the ratio
        # mlakit_deterministic / mlakit is that mode's cost). Not in the default run, as the
        # merge: the default run fills most of the GPU script's time limit already, and these
        # cases take four sides each.
        Family("mha_backward", "MHA prefill backward (bf16)",
               ("sdpa_cudnn", "sdpa_flash", "mlakit", "mlakit_deterministic"), "mlakit", False,
               on_request=("mlakit_sm90", "mlakit_sm90_deterministic")),
        # The merge of partial attention states (issue 30) against the eager PyTorch merge
        # (logsumexp, weights, a float32 weighted sum): memory-bound, judged by its fraction of
        # the copy ceiling. Not in the default run: no library competes for it, and the default
        # run fills most of the GPU script's time limit already.
        Family("merge", "merge of partial states", ("torch", "mlakit"), "mlakit", False),
        # Not an mlakit operation: cuDNN against PyTorch's flash backend on the brief's cuDNN
        # shapes (cuDNN's figures of the same run beside PyTorch's own kernel).
        Family("sdpa_mha", "SDPA MHA forward (cuDNN vs flash)", ("sdpa_cudnn", "sdpa_flash"), "sdpa_flash", False),
    )
}


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    family: str
    params: Dict[str, Any]
    quick: bool = False  # in the --quick smoke run


def _dense(b: int, h_q: int, s_q: int, s_k: int, causal: bool = False, quick: bool = False) -> Case:
    name = f"dense_b{b}_hq{h_q}_sq{s_q}_sk{s_k}" + ("_causal" if causal else "")
    params = dict(b=b, s_q=s_q, h_q=h_q, h_kv=1, s_k=s_k, page=64, causal=causal, varlen=True)
    return Case(name, "dense_decode", params, quick)


def _sparse_decode(b: int, quick: bool = False) -> Case:
    # Each sequence owns s_k = 32768 cached tokens; each query token picks topk of them.
    params = dict(b=b, s_q=2, h_q=128, topk=2048, s_k=32768, page=64)
    return Case(f"sparse_decode_b{b}_hq128_sq2_topk2048_sk32768", "sparse_decode", params, quick)


def _sparse_decode_v4(b: int, h_q: int, topk: int, page: int, s_k: int, extra_topk: int = 0, extra_page: int = 64,
                      quick: bool = False) -> Case:
    """FlashMLA's V4 decode shapes: s_q 2, lengths ~ s_k; topk over a page-`page` cache plus,
    with extra_topk, a window of that many recent tokens in a page-`extra_page` second cache."""
    params = dict(b=b, s_q=2, h_q=h_q, topk=topk, page=page, s_k=s_k, extra_topk=extra_topk, extra_page=extra_page)
    name = f"sparse_decode_v4_b{b}_hq{h_q}_sq2_topk{topk}_page{page}_sk{s_k}"
    if extra_topk:
        name += f"_extra{extra_topk}_page{extra_page}"
    return Case(name, "sparse_decode_v4", params, quick)


def _sparse_prefill(s_kv: int, near_end: bool, quick: bool = False, h_q: int = 128, topk: int = 2048,
                    d_qk: int = 576) -> Case:
    # "Near the end": 90% of each token's indices in the last 20000 rows (the project's
    # benchmark convention, bench/sparse_prefill_measure.cpp); at s_kv <= 20000 that is all rows.
    params = dict(s_q=4096, h_q=h_q, topk=topk, s_kv=s_kv, indices="near_end" if near_end else "uniform",
                  window=20000 if near_end else 0, d_qk=d_qk)
    name = f"sparse_prefill_sq4096_hq{h_q}_topk{topk}_skv{s_kv}_" + ("near_end" if near_end else "uniform")
    return Case(name + ("" if d_qk == 576 else f"_d{d_qk}"), "sparse_prefill", params, quick)


def _gqa(b: int, s_k: int, cache: str = "bf16", append: bool = False, quick: bool = False) -> Case:
    """q [b, 1, 32, 128] over K/V of 8 kv heads and s_k tokens per sequence (every sequence
    full: SDPA's contiguous cache has no lengths), paged (page 64, shuffled block table) for
    mlakit. cache: bf16, or int8 / fp8 with one scale per (token, kv head). append: this
    step's k_new / v_new written at position s_k - 1 with NeoX RoPE (q rotated too), fused in
    mlakit's call, done with PyTorch ops before SDPA on its side."""
    params = dict(b=b, s_q=1, h_q=32, h_kv=8, s_k=s_k, d=128, page=64, cache=cache, append=append)
    name = f"gqa_b{b}_hq32_hkv8_sk{s_k}_d128_{cache}" + ("_append_rope" if append else "")
    return Case(name, "gqa", params, quick)


def _sdpa_mha(causal: bool) -> Case:
    params = dict(b=4, h=32, s=4096, d=128, causal=causal)
    return Case("sdpa_mha_b4_h32_s4096_d128" + ("_causal" if causal else ""), "sdpa_mha", params, not causal)


def _mha_prefill(b: int, s: int, d_qk: int, d_v: int, h: int, causal: bool, quick: bool = False,
                 family: str = "mha_prefill") -> Case:
    """b sequences of s tokens each, h_q = h_kv = h, bf16 (family mha_prefill: the forward,
    mha_backward: its backward)."""
    params = dict(b=b, h=h, s=s, d_qk=d_qk, d_v=d_v, causal=causal, varlen=False)
    name = f"{family}_b{b}_h{h}_s{s}_d{d_qk}_{d_v}" + ("_causal" if causal else "")
    return Case(name, family, params, quick)


def _mha_prefill_varlen(tokens: int, min_s: int, max_s: int, d: int, h: int, causal: bool,
                        family: str = "mha_prefill") -> Case:
    """`tokens` tokens in sequences of min_s..max_s tokens each, drawn from the case's seed
    (data.varlen_lengths: the same list on every device and for causal and not)."""
    params = dict(tokens=tokens, min_s=min_s, max_s=max_s, h=h, d_qk=d, d_v=d, causal=causal, varlen=True)
    name = f"{family}_varlen_t{tokens}_h{h}_d{d}_{d}" + ("_causal" if causal else "")
    return Case(name, family, params)


def _mha_issue_list(family: str) -> List[Case]:
    """Issue 26's list, forward (mha_prefill) or backward (mha_backward): b4 s4096 h32 at d 128
    and 192/128, b1 s16384, and the varlen mix of as many tokens (16384, lengths 512-8192), each
    causal and not; b4 s4096 d128 non-causal in --quick."""
    cases = []
    for b, s, d_qk, d_v in ((4, 4096, 128, 128), (4, 4096, 192, 128), (1, 16384, 128, 128)):
        for causal in (False, True):
            quick = (b, s, d_qk, causal) == (4, 4096, 128, False)
            cases.append(_mha_prefill(b, s, d_qk, d_v, 32, causal, quick, family))
    return cases + [_mha_prefill_varlen(16384, 512, 8192, 128, 32, causal, family) for causal in (False, True)]


def _merge(n: int, rows: Tuple[int, ...], d: int, dtype: str = "bf16", out_dtype: str = "bf16",
           lse_layout: str = "rows", quick: bool = False) -> Case:
    """n states [rows..., d] of `dtype` (bf16 / fp32) merged into `out_dtype`. lse_layout
    'rows': rows (tokens, h), LSEs [n, tokens, h]; 'decode': rows (b, s_q, h_q), LSEs in the
    decode's [n, b, h_q, s_q] memory passed as the [n, b, s_q, h_q] view (context-parallel
    decode)."""
    params = dict(n=n, rows=list(rows), d=d, dtype=dtype, out_dtype=out_dtype, lse_layout=lse_layout)
    if lse_layout == "decode":
        b, s_q, h_q = rows
        name = f"merge_cp_decode_b{b}_sq{s_q}_hq{h_q}_d{d}_n{n}_{dtype}"
    else:
        tokens, h = rows
        name = f"merge_t{tokens}_h{h}_d{d}_n{n}_{dtype}"
    return Case(name + ("" if out_dtype == dtype else f"_to_{out_dtype}"), "merge", params, quick)


def all_cases() -> List[Case]:
    """The listed cases (docs/benchmarking.md) of every operation that exists, in table order."""
    cases: List[Case] = []
    for s_k in (4096, 8192, 16384, 32768):
        cases.append(_dense(128, 128, 1, s_k, quick=s_k == 4096))
    for causal in (False, True):
        for s_k in (4096, 8192, 16384, 32768):
            cases.append(_dense(128, 128, 2, s_k, causal))
    for b, s_k in ((32, 8192), (32, 32768), (128, 8192), (128, 32768)):
        cases.append(_dense(b, 16, 1, s_k, quick=(b, s_k) == (32, 8192)))
    cases += [_sparse_decode(64, quick=True), _sparse_decode(128)]
    for near_end in (True, False):
        for s_kv in (8192, 32768, 131072):
            cases.append(_sparse_prefill(s_kv, near_end, quick=(s_kv, near_end) == (8192, False)))
    # DeepSeek V4 (issue 31): FlashMLA's V4 decode shapes (lengths ~16k, topk 128 over page 256
    # plus a window of 512 or 1024 over page 64 or 2; one cache of topk 16384 at lengths ~32k)
    # and the d_qk 512 prefill (h_q 64 topk 512, h_q 128 topk 1024).
    for b in (64, 128, 148, 256):
        cases.append(_sparse_decode_v4(b, 128 if b != 256 else 64, 128, 256, 16384, 512, 64, quick=b == 64))
    cases += [_sparse_decode_v4(128, 64, 128, 256, 16384, 1024, 64), _sparse_decode_v4(128, 128, 128, 256, 16384, 1024, 2),
              _sparse_decode_v4(148, 128, 16384, 64, 32768)]
    for s_kv in (8192, 65536):
        cases += [_sparse_prefill(s_kv, False, h_q=64, topk=512, d_qk=512),
                  _sparse_prefill(s_kv, False, h_q=128, topk=1024, d_qk=512)]
    cases += [_gqa(64, 4096, "bf16", quick=True), _gqa(64, 4096, "int8"), _gqa(64, 4096, "fp8"),
              _gqa(64, 4096, "bf16", append=True), _gqa(1, 131072, "bf16")]
    # MHA prefill, issue 26's list.
    cases += _mha_issue_list("mha_prefill")
    # The other head sizes, b4 s4096: d 64 at h 32 (half d 128's FLOPs, still 128 (batch, head)
    # pairs of 4096 queries: far more query tiles than SMs); d 256 at h 16 (h * d = 4096 as in the
    # d 128 cases: the same FLOPs and bytes; Gemma-7B's 16 heads of 256).
    cases += [_mha_prefill(4, 4096, 64, 64, 32, False), _mha_prefill(4, 4096, 256, 256, 16, False)]
    # The MHA prefill's backward on the same list (the same tensors as the forward's cases, dout
    # added), and on the other head sizes (the portable backward's on Hopper).
    cases += _mha_issue_list("mha_backward")
    cases += [_mha_prefill(4, 4096, 64, 64, 32, False, family="mha_backward"),
              _mha_prefill(4, 4096, 256, 256, 16, False, family="mha_backward")]
    cases += [_sdpa_mha(False), _sdpa_mha(True)]
    # Merge (issue 30): the states of a context-parallel MLA decode (b = 128 tokens, h_q 128,
    # d 512) from 2, 4, 8 GPUs; large merges of 16384 tokens x 32 heads x d 128 (cascade /
    # prefill states), bf16 from 2 and 4 states, float32 partials into bf16 from 8.
    cases += [_merge(n, (128, 1, 128), 512, lse_layout="decode", quick=n == 2) for n in (2, 4, 8)]
    cases += [_merge(n, (16384, 32), 128, quick=n == 4) for n in (2, 4)] + [_merge(8, (16384, 32), 128, "fp32")]
    return cases


def select(
    cases: Sequence[Case], families: Optional[Sequence[str]] = None, pattern: Optional[str] = None, quick: bool = False
) -> List[Case]:
    """The cases of the given families (default: the default families), whose name matches
    `pattern` (a regular expression, searched; a plain substring works), and the quick ones
    with `quick`. Unknown family names raise ValueError."""
    if families:
        unknown = sorted(set(families) - set(FAMILIES))
        if unknown:
            raise ValueError(f"unknown families {unknown}: expected some of {sorted(FAMILIES)}")
        wanted = set(families)
    else:
        wanted = {name for name, f in FAMILIES.items() if f.default}
    regex = None
    if pattern:
        try:
            regex = re.compile(pattern)
        except re.error:
            regex = re.compile(re.escape(pattern))
    return [
        c
        for c in cases
        if c.family in wanted and (regex is None or regex.search(c.name)) and (not quick or c.quick)
    ]


def describe(case: Case) -> str:
    """One line for --list."""
    f = FAMILIES[case.family]
    params = " ".join(f"{k}={v}" for k, v in case.params.items())
    return f"{case.name:58s} {f.name:15s} sides {','.join(f.sides):29s} {params}"
