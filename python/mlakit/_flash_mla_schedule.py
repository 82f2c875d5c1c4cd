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

A sparse plan covers exactly the keys of its index lists (topk, extra_topk of a second cache,
and whether topk_length / extra_topk_length were given): a call with other lists is an
error, not a silent re-plan. ``get_mla_metadata(*args)`` takes no length arrays and no second
cache, so its sparse schedules serve only calls without them.

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


@dataclasses.dataclass(frozen=True)
class KeyLists:
    """The index lists a flash_mla_with_kvcache call schedules: ``topk`` (None: dense
    attention), whether ``topk_length`` is given, the second cache's ``extra_topk`` (0: none)
    and whether ``extra_topk_length`` is given. A sparse schedule serves only calls of equal
    lists: its parts cover exactly these keys."""

    topk: Optional[int]
    has_topk_length: bool = False
    extra_topk: int = 0
    has_extra_topk_length: bool = False

    @staticmethod
    def of_call(
        indices: Optional[Any], topk_length: Optional[Any], extra_indices: Optional[Any], extra_topk_length: Optional[Any]
    ) -> "KeyLists":
        return KeyLists(
            topk=None if indices is None else int(indices.shape[-1]),
            has_topk_length=topk_length is not None,
            extra_topk=0 if extra_indices is None else int(extra_indices.shape[-1]),
            has_extra_topk_length=extra_topk_length is not None,
        )


# What get_mla_metadata(*args) cannot know, for the errors of a schedule it made.
_FROM_ARGS_HINT = " (get_mla_metadata(*args) cannot know it: use get_mla_metadata())"


@dataclasses.dataclass
class Schedule:
    """One step's plan: dense (split over cache_seqlens) or sparse (over the keys of
    ``lists``: topk / topk_length, plus extra_topk / extra_topk_length of a second cache)."""

    workspace: Any
    plan: MlaDecodePlan
    lists: KeyLists
    #: Made by get_mla_metadata(*args), which knows no length array and no second cache.
    from_metadata_args: bool = False

    def views(self) -> Tuple[Any, Any]:
        """FlashMLA's (tile_scheduler_metadata [num_parts, 8], num_splits [b + 1]) int32,
        viewing the workspace."""
        p = self.plan
        return (
            arrays.int32_view(self.workspace, p.part_ranges_offset, (p.num_parts, 8)),
            arrays.int32_view(self.workspace, p.split_prefix_offset, (p.b + 1,)),
        )

    def plan_for(self, q: Any, lists: KeyLists) -> MlaDecodePlan:
        """The plan for a call with query ``q`` and index lists ``lists``, after checking the
        call is of this schedule's kind and lists."""
        made = self.lists
        if (lists.topk is None) != (made.topk is None):
            kinds = ("dense", "sparse") if made.topk is None else ("sparse", "dense")
            raise ValueError(
                f"tile_scheduler_metadata: made for {kinds[0]} attention, used for {kinds[1]} attention "
                "(indices given or not): get new metadata for this call"
            )
        self._check_lengths("topk_length", made.has_topk_length, lists.has_topk_length)
        if lists.topk is None:
            s_q, h_q = int(q.shape[1]), int(q.shape[2])
            return self.plan if (s_q, h_q) == (self.plan.s_q, self.plan.h_q) else self.plan.with_query_shape(s_q, h_q)
        # The library's sparse plan covers exactly topk (+ extra_topk) keys per row.
        if lists.topk != made.topk:
            raise ValueError(
                f"indices.shape[-1] (topk): expected {made.topk} (the schedule's), got {lists.topk}: "
                "get new metadata for this call"
            )
        if lists.extra_topk != made.extra_topk:
            if made.extra_topk == 0:
                raise ValueError(
                    "extra_indices_in_kvcache: the schedule was made without a second cache, this call has one "
                    f"(extra_topk {lists.extra_topk}): get new metadata for this call"
                    + (" (get_mla_metadata(*args) has no extra arguments: use get_mla_metadata())"
                       if self.from_metadata_args else "")
                )
            raise ValueError(
                f"extra_indices_in_kvcache.shape[-1] (extra_topk): expected {made.extra_topk} (the schedule's), "
                f"got {lists.extra_topk or 'no second cache'}: get new metadata for this call"
            )
        self._check_lengths("extra_topk_length", made.has_extra_topk_length, lists.has_extra_topk_length)
        return self.plan

    def _check_lengths(self, name: str, made: bool, given: bool) -> None:
        if made != given:
            hint = _FROM_ARGS_HINT if self.from_metadata_args and not made else ""
            raise ValueError(
                f"{name}: the schedule was made {'with' if made else 'without'} {name} and depends on it: pass it "
                "to every call of the step, or to none" + hint
            )


def schedule_for_call(
    q: Any,
    k_cache: Any,
    cache_seqlens: Any,
    lists: KeyLists,
    topk_length: Optional[Any],
    extra_topk_length: Optional[Any],
) -> Schedule:
    """A plan made from the arguments of a flash_mla_with_kvcache call (device arrays)."""
    b, s_q, h_q = int(q.shape[0]), int(q.shape[1]), int(q.shape[2])
    if lists.topk is not None:
        workspace, plan = mla_sparse_decode_plan(
            b, s_q, h_q, lists.topk, q, topk_length, lists.extra_topk, extra_topk_length
        )
        return Schedule(workspace, plan, lists)
    workspace, plan = mla_decode_plan(cache_seqlens, s_q, h_q, int(k_cache.shape[2]))
    return Schedule(workspace, plan, lists)


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
