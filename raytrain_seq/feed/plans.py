"""Which rows each learner reads: the training epochs' plans and the evaluation splits', from lengths only.

Training epoch e: ``pack(lengths, t_max, strategy, seed=plan_seed(seed, e))``, its equal-length videos
exchanged so every block carries its share of the epoch's fresh copies (``assembly.cache_aware_plan``),
then ``plan_specs``: equal blocks per learner (zero-weight fillers) in the ``spread_fresh`` order. A
layout ``history`` (``EpochPosition.history``) re-splits what the earlier groups left (``layout_specs``).
Validation and test are packed once each with the evaluation strategy and ``plan_seed(seed, -1 / -2)``.
Contract: a plan is a pure function of (lengths, t_max, strategy, seed, epoch, world size, history), so
a restarted feed, a resumed run and every process rebuild the same one; across a world size's learners
each training video is read exactly once an epoch (``pack`` places each once, ``shard`` each block once).
"""

from __future__ import annotations

from typing import Any

from raytrain_seq.algorithms.packing import PackPlan, pack
from raytrain_seq.algorithms.refurbish import RefurbishSchedule
from raytrain_seq.rounds.position import layout_specs
from raytrain_seq.rows.assembly import BlockSpec, cache_aware_plan, consumption_order, plan_specs
from raytrain_seq.seeds import plan_seed

__all__ = ["EVAL_KEYS", "SPLITS", "FeedPlans"]

SPLITS = ("train", "val", "test")
EVAL_KEYS = {"val": -1, "test": -2}  # plan_seed keys of the evaluation splits (epochs are >= 0)

Specs = list[list[BlockSpec]]  # per learner, its blocks in order


class FeedPlans:
    """The plans of the training epochs (the newest ``keep`` and older ones pruned) and of the
    evaluation splits, and every learner's block specs under them."""

    def __init__(
        self,
        catalogs: dict[str, Any],
        t_max: int,
        *,
        packing: str,
        eval_strategy: str,
        seed: int,
        schedule: RefurbishSchedule,
        keep: int,
    ) -> None:
        self._catalogs = catalogs
        self.t_max = t_max
        self._packing, self._eval_strategy, self._seed = packing, eval_strategy, seed
        self._schedule, self._keep = schedule, keep
        train = catalogs["train"]
        self._train_ids, self._train_labels = train.ids.tolist(), train.labels.tolist()
        self._plans: dict[tuple[int, int, tuple], tuple[PackPlan, Specs]] = {}
        self._eval: dict[str, tuple[PackPlan, dict[int, Specs]]] = {}

    def plan(self, epoch: int, world_size: int, history: tuple = ()) -> tuple[PackPlan, Specs]:
        """The epoch's plan and every learner's block specs; ``history`` (``EpochPosition.history``) gives
        the layouts the epoch ran under before this group of ``world_size`` (``layout_specs``)."""
        key = (epoch, world_size, history)
        if history and key not in self._plans:
            specs = layout_specs(lambda w: self.plan(epoch, w)[1], history, world_size)
            self._plans[key] = (self.plan(epoch, history[0][0])[0], specs)
        if key not in self._plans:
            lengths = self._catalogs["train"].lengths
            plan = pack(lengths, self.t_max, strategy=self._packing, seed=plan_seed(self._seed, epoch))
            fresh = self._schedule.is_fresh(epoch)
            plan = cache_aware_plan(plan, lengths, fresh)  # every block its share of fresh frames
            self._plans[key] = (
                plan,
                plan_specs(plan, world_size, self._train_ids, self._train_labels, fresh),
            )
            for old in [k for k in self._plans if k[0] < epoch - self._keep]:
                del self._plans[old]
        return self._plans[key]

    def order(self, epoch: int, world_size: int) -> list[int]:
        """The epoch's training videos in the order its ``world_size`` learners first need them."""
        return consumption_order(self.plan(epoch, world_size)[1])

    def packing_stats(self, epoch: int, world_size: int) -> dict[str, Any]:
        """The epoch's plan's ``PackPlan.stats`` for ``world_size`` learners."""
        return self.plan(epoch, world_size)[0].stats(world_size)

    def pack_eval(self, split: str) -> bool:
        """Pack ``split`` ("val" or "test") once; True the first time."""
        if split in self._eval:
            return False
        seed = plan_seed(self._seed, EVAL_KEYS[split])
        plan = pack(self._catalogs[split].lengths, self.t_max, strategy=self._eval_strategy, seed=seed)
        self._eval[split] = (plan, {})
        return True

    def eval_specs(self, split: str, world_size: int) -> Specs:
        """Every learner's blocks of the packed ``split`` (no fresh copies: no cache-aware order)."""
        plan, by_world = self._eval[split]
        if world_size not in by_world:
            catalog = self._catalogs[split]
            by_world[world_size] = plan_specs(
                plan, world_size, catalog.ids.tolist(), catalog.labels.tolist(), None
            )
        return by_world[world_size]
