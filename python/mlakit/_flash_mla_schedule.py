"""Where mlakit.flash_mla keeps mlakit's plans behind FlashMLA's scheduler metadata.

FlashMLA hands its schedule around as two int32 tensors (``tile_scheduler_metadata``
[num_sm_parts, 8] and ``num_splits`` [b + 1]) or, in its newer API, as a
``FlashMLASchedMeta`` object that the first ``flash_mla_with_kvcache`` call of a step fills.
An mlakit plan is more than those two tensors: a workspace (the schedule plus the partial
results of split sequences) and a host-side ``MlaDecodePlan`` holding offsets into it.

- Tensor form: the two tensors returned by ``get_mla_metadata`` are views into the plan's
  workspace (mlakit's part ranges and split prefix have exactly FlashMLA's shapes), and the
  plan is found again from the ``tile_scheduler_metadata`` object: a registry keyed by
  ``id()`` (tensors cannot be dictionary keys, their ``==`` is elementwise), whose entry is
  dropped by ``weakref.finalize`` when the tensor dies, so a reused id never finds a stale
  plan.
- Object form: the plan is made on the first call, from that call's arguments, and stored on
  the object; later calls (the other layers of the step) reuse it.

``get_mla_metadata`` only knows ``num_q_tokens_per_head_k = s_q * h_q / h_kv``, while an
mlakit plan records (s_q, h_q). Its dense plan is made for s_q = 1 and h_q = rows * h_kv
and re-labelled on every call with q's (s_q, h_q) (``MlaDecodePlan.with_query_shape``, which
checks that the rows agree): the plan's content depends on the rows per kv head only.
"""

from __future__ import annotations

import dataclasses
import weakref
from typing import Any, Dict, Optional, Tuple

from . import _arrays as arrays
from ._decode import MlaDecodePlan, mla_decode_plan
from ._sparse_decode import mla_sparse_decode_plan


@dataclasses.dataclass
class Schedule:
    """One step's plan: dense (split over cache_seqlens) or sparse (over topk / topk_length keys)."""

    workspace: Any
    plan: MlaDecodePlan
    topk: Optional[int]  # None: dense
    has_topk_length: bool = False

    def views(self) -> Tuple[Any, Any]:
        """FlashMLA's (tile_scheduler_metadata [num_parts, 8], num_splits [b + 1]) int32,
        viewing the workspace."""
        p = self.plan
        return (
            arrays.int32_view(self.workspace, p.part_ranges_offset, (p.num_parts, 8)),
            arrays.int32_view(self.workspace, p.split_prefix_offset, (p.b + 1,)),
        )

    def plan_for(self, q: Any, topk: Optional[int], has_topk_length: bool) -> MlaDecodePlan:
        """The plan for a call with query ``q`` and ``topk`` indices per token (None: dense),
        after checking the call is of this schedule's kind."""
        if (topk is None) != (self.topk is None):
            made, called = ("dense", "sparse") if self.topk is None else ("sparse", "dense")
            raise ValueError(
                f"tile_scheduler_metadata: made for {made} attention, used for {called} attention "
                "(indices given or not): get new metadata for this call"
            )
        if has_topk_length != self.has_topk_length:
            raise ValueError(
                "topk_length: the schedule was made "
                + ("with" if self.has_topk_length else "without")
                + " topk_length and depends on it: pass it to every call of the step, or to none"
                + ("" if self.has_topk_length else " (get_mla_metadata(*args) cannot know it: use get_mla_metadata())")
            )
        if topk is not None:
            # The library's sparse plan does not record topk (its schedule covers topk keys).
            if topk != self.topk:
                raise ValueError(
                    f"indices.shape[-1] (topk): expected {self.topk} (the schedule's), got {topk}: "
                    "get new metadata for this call"
                )
            return self.plan
        s_q, h_q = int(q.shape[1]), int(q.shape[2])
        return self.plan if (s_q, h_q) == (self.plan.s_q, self.plan.h_q) else self.plan.with_query_shape(s_q, h_q)


def schedule_for_call(
    q: Any, k_cache: Any, cache_seqlens: Any, indices: Optional[Any], topk_length: Optional[Any]
) -> Schedule:
    """A plan made from the arguments of a flash_mla_with_kvcache call (device arrays)."""
    b, s_q, h_q = int(q.shape[0]), int(q.shape[1]), int(q.shape[2])
    if indices is not None:
        topk = int(indices.shape[-1])
        workspace, plan = mla_sparse_decode_plan(b, s_q, h_q, topk, q, topk_length)
        return Schedule(workspace, plan, topk, has_topk_length=topk_length is not None)
    workspace, plan = mla_decode_plan(cache_seqlens, s_q, h_q, int(k_cache.shape[2]))
    return Schedule(workspace, plan, topk=None)


# Tensor form: id(tile_scheduler_metadata) -> (weak reference to it, its schedule).
_registry: Dict[int, Tuple["weakref.ref[Any]", Schedule]] = {}


def register(tile_scheduler_metadata: Any, schedule: Schedule) -> None:
    key = id(tile_scheduler_metadata)
    _registry[key] = (weakref.ref(tile_scheduler_metadata), schedule)
    weakref.finalize(tile_scheduler_metadata, _registry.pop, key, None)


def lookup(tile_scheduler_metadata: Any) -> Optional[Schedule]:
    """The schedule whose view ``tile_scheduler_metadata`` is, or None (e.g. a copy)."""
    entry = _registry.get(id(tile_scheduler_metadata))
    if entry is None or entry[0]() is not tile_scheduler_metadata:
        return None
    return entry[1]
