"""Chaos soak: one training run takes many faults of every kind; its own accounting says what was lost.

On a several-raylet local cluster (``ray.cluster_utils.Cluster``, one learner slot a worker raylet) a run
takes ``--events N`` faults of a seeded schedule (``FAULTS``: ``node_killed``, ``node_added``,
``averager_killed``, ``feed_killed``, ``shard_killed``, ``learner_stalled``: SIGSTOP until dropped),
each 1..``MAX_GAP`` rounds after the last recovered; the same seed also runs undisturbed. The verdict
reads the run's records: ``every_row_once_per_epoch`` (per epoch the trained ids' {count, sum, sum of
squares} against the plan's), ``rounds_contiguous`` (``events.jsonl``: rounds 1..N once, in order); ``ok``
is false (exit 1) when fewer faults were injected, a stall dropped nobody, a check fails or a run's first
group was not both learners (``first_group``: the undisturbed run is the baseline). Survivor
figures (chaos_figures.py): ``survivor_restarts``; per event ``survivor_steps_ratio`` (recovery over
before), ``survivor_longest_stall_s`` and ``replacement_first_step_s``. Last line: one JSON.

    python bench/chaos.py --events 8 --json   # --kinds picks the kinds; --own-cores: bench/core_pins.py
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import signal
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from chaos_figures import NOTES, Probe, event_figures, round_steps, total_restarts
from core_pins import CorePins, confine

if TYPE_CHECKING:
    from raytrain_seq.outputs.reports import AveragingReport

SLOT = "learner_slot"
WAIT_S = 150.0  # the longest wait for a recovery before the soak gives up on that event
MAX_GAP = 2  # rounds averaged between an event's recovery and the next event: 1..MAX_GAP, seeded
RECOVERY_ROUNDS = 2  # rounds averaged after an event before it counts as recovered
# Rounds an event takes beyond its gap and recovery: the rounds that go by while the soak polls, waits for
# a group of 2 (a stall) and while a recovery runs (the others train on). What an event took in all on the
# 2-core box: docs/LOG.md, 2026-11-24, figures moved out of comments.
SLACK_ROUNDS = 2
# Epochs at one learner that a node's arrival spans: the lone survivor steps on while the newcomer's
# process starts, imports torch, builds its model and joins, wall-clock work that the rounds of this small
# set do not pace (docs/LOG.md, 2026-11-28, 17:14-18:30 UTC: a default-size 8-event soak ended in one).
JOIN_EPOCHS = 4
# And at least this many rounds at one learner (the synthetic set's JOIN_EPOCHS): the real-footage set has
# a round an epoch, whose JOIN_EPOCHS epochs went by long before the newcomer joined (its run ended first).
JOIN_ROUNDS = 64


@dataclass(frozen=True)
class Fault:
    """One kind of fault: when it can be injected, how, and what recovery the soak waits for after it."""

    feasible: Callable[[dict[str, int]], bool]  # on the modelled cluster {"slots": n}
    effect: Callable[[dict[str, int]], None]  # its effect on the model
    inject: Callable[[Soak], str] | None  # returns a detail line; None: the kind does not exist yet
    note: str = ""


def _unchanged(model: dict[str, int]) -> None:
    return None


FAULTS: dict[str, Fault] = {
    "node_killed": Fault(
        feasible=lambda m: m["slots"] >= 2,
        effect=lambda m: m.update(slots=m["slots"] - 1),
        inject=lambda soak: soak.kill_node(),
    ),
    "node_added": Fault(
        feasible=lambda m: m["slots"] < 2,
        effect=lambda m: m.update(slots=m["slots"] + 1),
        inject=lambda soak: soak.add_node(),
    ),
    "averager_killed": Fault(
        feasible=lambda m: True, effect=_unchanged, inject=lambda soak: soak.kill_actor("averager")
    ),
    "feed_killed": Fault(
        feasible=lambda m: True, effect=_unchanged, inject=lambda soak: soak.kill_actor("feed")
    ),
    "learner_stalled": Fault(
        feasible=lambda m: m["slots"] >= 2, effect=_unchanged, inject=lambda soak: soak.stall_learner()
    ),
    "shard_killed": Fault(feasible=lambda m: True, effect=_unchanged, inject=lambda soak: soak.kill_shard()),
}


def schedule(events: int, kinds: list[str], seed: int) -> list[tuple[int, str]]:
    """``events`` (gap, kind) pairs: gap (1..MAX_GAP, seeded) is the rounds averaged after the previous
    event's recovery (the first: after round 1) before this one; each kind is picked among the feasible
    ones with the fewest events so far (ties broken by the seed), so the kinds mix."""
    rng = random.Random(seed)
    model, counts, out = {"slots": 2}, dict.fromkeys(kinds, 0), []
    for i in range(events):
        at = rng.randint(1, MAX_GAP)
        feasible = [k for k in kinds if FAULTS[k].inject is not None and FAULTS[k].feasible(model)]
        if not feasible:
            raise ValueError(
                f"no kind of {kinds} can be injected at event {i}: add node_added or node_killed"
            )
        fewest = min(counts[k] for k in feasible)
        kind = rng.choice([k for k in feasible if counts[k] == fewest])
        counts[kind] += 1
        FAULTS[kind].effect(model)
        out.append((at, kind))
    return out


class Soak:
    """The cluster, the run under test in a thread, and the injections."""

    def __init__(self, cluster, namespace: str, averager_timeout_s: float) -> None:
        import ray

        self.ray, self.cluster, self.namespace = ray, cluster, namespace
        self.timeout_s = averager_timeout_s
        self.slots: list[Any] = []
        self.result: dict[str, Any] = {}
        self.thread: threading.Thread | None = None  # the run under test (start)
        self.handles: dict[str, Any] = {}
        self.stall_drops: list[bool] = []  # per stall: whether the averager dropped the frozen learner
        self.earlier: set[str] = set()  # ids of the actors alive when the run under test started
        self.lost_nodes: list[str] = []  # the nodes whose learner the last injection took (killed, stalled)
        self.added_node: str | None = None  # the node the last node_added brought
        self.probes: list[Probe] = []  # per event injected: what the soak saw around it
        self.pins: CorePins | None = None  # --own-cores: reset at each run's start

    # ------------------------------------------------------------------------------------ cluster
    def add_node(self) -> str:
        node = self.cluster.add_node(num_cpus=1, resources={SLOT: 1})
        self.cluster.wait_for_nodes()
        self.slots.append(node)
        self.added_node = node.node_id
        return f"node added ({len(self.slots)} learner slots)"

    def kill_node(self) -> str:
        node = self.slots.pop()
        self.lost_nodes.append(node.node_id)
        self.cluster.remove_node(node, allow_graceful=False)
        return f"learner node killed ({len(self.slots)} learner slots)"

    def kill_actor(self, which: str) -> str:
        self.ray.kill(self.handle(which), no_restart=False)
        return f"{which} actor killed"

    def alive(self, class_name: str) -> list[Any]:
        """The live actors of ``class_name`` (``ray.util.state.ActorState``s, in actor id order), from the
        GCS actor table through Ray's public state API, which the head's dashboard serves."""
        from ray.util.state import list_actors

        filters = [("class_name", "=", class_name), ("state", "=", "ALIVE")]
        return list_actors(address=self.cluster.address, filters=filters)

    def run_actors(self, class_name: str) -> list[Any]:
        """This run's live actors of ``class_name``: alive and not among those alive at ``start`` (an
        earlier run's may linger). A restarted actor keeps its id, so a shard Ray restarted still counts."""
        return [a for a in self.alive(class_name) if a.actor_id not in self.earlier]

    def processes(self) -> tuple[tuple[str, str | None], ...] | None:
        """(incarnation, node) of each learner process in the averager's report; None while it restarts."""
        state = self.state()
        return None if state is None else tuple((p.incarnation, p.node) for p in state.processes)

    def joined_nodes(self) -> set[str] | None:
        """The nodes of the learner processes in the averager's group (``--own-cores``); None before the
        run starts or while its averager restarts."""
        if self.thread is None or self.done:
            return None
        processes = self.processes()
        return None if processes is None else {node for _, node in processes if node is not None}

    def learner_nodes(self, pids: list[int]) -> dict[int, str]:
        """pid -> node of this run's live learner processes among ``pids`` (``--own-cores``)."""
        return {int(a.pid): a.node_id for a in self.run_actors("LearnerProcess") if int(a.pid) in pids}

    def learner_pids(self) -> list[int]:
        """The pids of this run's live learner processes (runtime/fleet.py's actors; any will do)."""
        return [int(a.pid) for a in self.run_actors("LearnerProcess")]

    def kill_shard(self) -> str:
        """SIGKILL one of this run's averager shard actors (found in the GCS actor table); Ray
        restarts it and re-runs an interrupted merge (max_restarts, max_task_retries)."""
        live = self.run_actors("AveragingShard")
        if not live:
            return "no averager shard alive yet: nothing killed"
        victim = live[0]
        os.kill(int(victim.pid), signal.SIGKILL)
        return f"averager shard (pid {victim.pid}) killed"

    def stall_learner(self, attempts: int = 3) -> str:
        """Freeze one learner until the averager drops it, then thaw it. A fixed freeze of a little over
        the timeout may end before the others' round times out on it: the deadline runs from the round's
        FIRST arrival, which comes only after the others' K steps, so the thawed learner would still make
        the round. A freeze that drops nobody (the run moved on without a round, or ended) is capped (twice
        the timeout and 20 s), the learner thawed, and the stall tried again once the group has moved on,
        up to ``attempts`` times."""
        workers = self.run_actors("LearnerProcess")  # this run's live learner processes (runtime/fleet.py)
        if len(workers) < 2:
            pids = [a.pid for a in workers]
            raise RuntimeError(f"a stall needs 2 learners, found {pids}: the schedule's model is off")
        pid, cap = int(workers[0].pid), 2 * self.timeout_s + 20.0
        self.lost_nodes.append(workers[0].node_id)
        began, dropped, tries = time.monotonic(), False, 0
        while not dropped and tries < attempts and not self.done:
            if tries:
                # Thawed: let the barrier clear and the group average a round (at most the timeout; the
                # run's rounds may be a tenth of a second, and a fixed wait could outlast the run).
                since, thawed = averaged_round(self), time.monotonic()
                while (
                    not self.done
                    and time.monotonic() - thawed < self.timeout_s
                    and (since is None or (averaged_round(self) or 0) <= since)
                ):
                    time.sleep(0.2)
            tries += 1
            drops, frozen = self.drops(), time.monotonic()
            os.kill(pid, signal.SIGSTOP)
            try:
                while (
                    not (dropped := self.drops() > drops)
                    and not self.done
                    and time.monotonic() - frozen < cap
                ):
                    time.sleep(0.5)
            finally:
                os.kill(pid, signal.SIGCONT)
        self.stall_drops.append(dropped)
        seconds = time.monotonic() - began
        return (
            f"learner process {pid} stalled {tries} time(s) over {seconds:.0f} s (averager timeout "
            f"{self.timeout_s:g} s): "
            + ("dropped from its round, thawed" if dropped else f"NOT dropped ({cap:.0f} s a try)")
        )

    def drops(self) -> int:
        state = self.state()
        return 0 if state is None else sum(r["kind"] == "dropped" for r in state.recoveries)

    # ------------------------------------------------------------------------------------ the run
    def start(self, config, before: set[str]) -> None:
        from raytrain_seq.runtime.driver import run

        self.result, self.handles, self._before = {}, {}, before
        self.earlier = {a.actor_id for name in ("LearnerProcess", "AveragingShard") for a in self.alive(name)}
        self.began = time.monotonic()
        if self.pins is not None:
            self.pins.reset()

        def target() -> None:
            try:
                self.result["summary"] = run(config, learner_resources={SLOT: 1})
            except BaseException as exc:  # handed to the main thread, which re-raises it
                self.result["error"] = exc
            self.result["seconds"] = time.monotonic() - self.began

        self.thread = threading.Thread(target=target, daemon=True)
        self.thread.start()

    def named(self) -> set[str]:
        actors = self.ray.util.list_named_actors(all_namespaces=True)
        return {a["name"] for a in actors if a["namespace"] == self.namespace}

    def handle(self, which: str):
        """The run's averager or feed (``averager-...``, ``feed-...``), looked up once: a restarted actor
        keeps its handle."""
        if which not in self.handles:
            names = self.wait(
                lambda: [n for n in self.named() - self._before if n.startswith(f"{which}-")], which
            )
            self.handles[which] = self.ray.get_actor(names[0], namespace=self.namespace)
        return self.handles[which]

    def state(self) -> AveragingReport | None:
        """The averager's summary; None while it restarts."""
        from ray.exceptions import GetTimeoutError, RayActorError

        try:
            return self.ray.get(self.handle("averager").summary.remote(), timeout=20)
        except (RayActorError, GetTimeoutError):
            return None

    @property
    def done(self) -> bool:
        return not self.thread.is_alive()

    def wait(self, condition: Callable[[], Any], what: str, timeout: float = WAIT_S) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if "error" in self.result:
                raise self.result["error"]
            value = condition()
            if value or self.done:
                return value
            time.sleep(0.2)
        raise TimeoutError(f"waited {timeout:g} s for {what}")

    def finish(self, timeout: float = 600.0):
        self.thread.join(timeout)
        if "error" in self.result:
            raise self.result["error"]
        if "summary" not in self.result:
            raise TimeoutError(f"the run did not finish within {timeout:g} s")
        return self.result["summary"], self.result["seconds"]


def make_config(storage: str, name: str, args: argparse.Namespace, epochs: int):
    """The fault tests' small run (the smoke model on --videos synthetic videos, B=2, tiny timeouts),
    elastic 1:2, with restarts enough for every event."""
    from raytrain_seq.config import Config

    fast = {
        "max_videos": args.videos,
        "batch_size": 2,
        "micro_batch_size": 2,
        "lr": 0.01,
        "k": args.k,
        "epochs": epochs,
        "validate_every": args.validate_every,
        "adaptive_batch": False,
        # The fleet starts its first group with the learners up by then: both, here, or the undisturbed run
        # is not the baseline it stands for (``first_group`` checks it). Waiting costs nothing once both
        # are up; a cold box (a fresh install's first imports) took longer than 8 s.
        "worker_start_timeout_s": 30.0,
        "averager_timeout_s": args.timeout,
        "checkpoint_every": 4,
        "max_failures": args.events + 5,
        "averager_max_restarts": args.events + 2,
        "feed_max_restarts": args.events + 2,
        "learners": "1:2",
        "seed": args.seed,
    }
    if args.real:
        # The real-footage set through the frame cache (one folder for both runs: the chaos run's feed
        # restarts read it), decoded at the smoke preset's tiny size.
        from raytrain_seq.data.footage import make_footage

        root = Path(storage) / "footage"
        if not (root / "avi").is_dir():
            make_footage(root, clips_per_class=4, codecs=("avi",))
        avi = root / "avi"
        fast.update(
            dataset="list", data_root=str(avi), train_list=str(avi / "train.txt"), test_list=str(avi / "test.txt"),
            class_names=str(avi / "classes.txt"), num_classes=None, max_videos=None, stride=8,
            frame_cache_dir=str(Path(storage) / "frames"),
        )  # fmt: skip
    return Config.from_preset("smoke", storage_path=storage, run_name=name, **fast)


def plan_checksums(config) -> dict[int, dict[str, int]]:
    """Per epoch, the checksum of the video ids of the epoch's BLoad plan (what the feed serves)."""
    from raytrain_seq.algorithms.packing import pack
    from raytrain_seq.outputs.accounting import checksum
    from raytrain_seq.rows.assembly import plan_specs
    from raytrain_seq.runtime.feed import feed_geometry
    from raytrain_seq.seeds import plan_seed

    geometry = feed_geometry(config.data, warn=False)
    train = geometry.catalogs["train"]
    out = {}
    for epoch in range(config.train.epochs):
        seed = plan_seed(config.data.seed, epoch)
        plan = pack(train.lengths, geometry.t_max, strategy=config.data.packing, seed=seed)
        [specs] = plan_specs(plan, 1, train.ids.tolist(), train.labels.tolist(), None)
        out[epoch] = checksum(i for spec in specs for i in spec.ids)
    return out


def size_epochs(
    config, events: int, stalls: int = 0, arrivals: int = 0, feed_kills: int = 0
) -> tuple[int, int]:
    """Epochs enough for ``events`` events MAX_GAP + RECOVERY_ROUNDS + SLACK_ROUNDS rounds apart (and 3 at
    least), counting the rounds of an epoch at 2 learners (fewer learners make more rounds); and that
    count of rounds an epoch. Each of the ``stalls`` adds an epoch at one learner (twice the rounds): the
    survivor trains on alone until the dropped learner rejoins, and a run that used those rounds up ended
    before the next events (seen once in the 4-event soak of tests/test_chaos.py, docs/LOG.md). Each of
    the ``arrivals`` (node_added events with an event after them) adds ``JOIN_EPOCHS`` epochs at one
    learner (``JOIN_ROUNDS`` rounds at least), for the same reason. Each of the ``feed_kills`` adds an
    epoch: its recovery ends in the next epoch (``next_epoch_trained``)."""
    from raytrain_seq.algorithms.packing import pack
    from raytrain_seq.rows.assembly import plan_specs
    from raytrain_seq.runtime.feed import feed_geometry
    from raytrain_seq.seeds import plan_seed

    geometry = feed_geometry(config.data, warn=False)
    train = geometry.catalogs["train"]
    plan = pack(
        train.lengths, geometry.t_max, strategy=config.data.packing, seed=plan_seed(config.data.seed, 0)
    )
    [shard, _] = plan_specs(plan, 2, train.ids.tolist(), train.labels.tolist(), None)
    per_round = config.train.batch_size * config.train.k
    rounds = max(1, math.ceil(len(shard) / per_round))
    needed = 2 + events * (MAX_GAP + RECOVERY_ROUNDS + SLACK_ROUNDS) + 2  # from round 1, a margin
    needed += (
        stalls * 2 * rounds + arrivals * max(JOIN_EPOCHS * 2 * rounds, JOIN_ROUNDS) + feed_kills * rounds
    )
    return max(3, math.ceil(needed / rounds)), rounds


def first_group(summary) -> int | None:
    """How many learners the run's first group had (its round log's first ``group`` record); None: no
    such record."""
    from raytrain_seq.rounds.events import EVENTS_FILE

    log = Path(summary.path) / EVENTS_FILE
    for line in log.read_text().splitlines():
        record = json.loads(line) if line.strip() else {}
        if record.get("type") == "membership" and record.get("event") == "group":
            return record.get("learners")
    return None


def accounting(summary, config) -> dict[str, Any]:
    """The run's per-epoch trained-ids checksums against the plan's, and the round log's order."""
    from raytrain_seq.rounds.events import EVENTS_FILE

    plan = plan_checksums(config)
    trained = {int(e): c for e, c in summary.extra.get("trained_ids", {}).items()}
    epochs = {e: {"plan": plan[e], "trained": trained.get(e)} for e in plan}
    every_row = all(v["trained"] == v["plan"] for v in epochs.values()) and set(trained) == set(plan)
    # A diagnostic that must be 0 everywhere: rows of the plan no averaged round holds (negative: repeated).
    short = {e: v["plan"]["count"] - (v["trained"] or {}).get("count", 0) for e, v in epochs.items()}
    log = Path(summary.path) / EVENTS_FILE
    records = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    # A record marked "redo" replaces the one before of its round: the averager logged that round and died
    # before any learner took its result, so the learners sent it again (no learner saw it twice).
    rounds, redone, unmarked, lossless = [], 0, 0, set()
    for record in (r for r in records if r.get("type") == "round"):
        if record["round"] in rounds:
            redone += 1
            unmarked += not record.get("redo", False)
        else:
            rounds.append(record["round"])
        if math.isnan(record.get("loss", 0.0)):  # only fillers stepped (a make-up layout's): no loss to plot
            lossless.add(record["round"])
    drops = [r["round"] for r in records if r.get("type") == "membership" and r.get("event") == "drop"]
    # The rows the averaged positions recorded as missed (a dropped learner's rows, which the group then
    # trained again): the union of the ranges per (epoch, layout, rank) over the round log.
    missed: dict[tuple[int, int, int], set[int]] = {}
    for record in (r for r in records if r.get("type") == "round" and r.get("position")):
        where = record["position"]
        layouts = [
            *where.get("history", ()),
            [where.get("world_size"), where.get("rows_done"), where.get("missed", ())],
        ]
        for index, (_, _, *rest) in enumerate(layouts):
            for rank, first, end in rest[0] if rest else ():
                missed.setdefault((where["epoch"], index, rank), set()).update(range(first, end))
    missed_rows = sum(len(rows) for rows in missed.values())
    history = [h["round"] for h in summary.loss_history]  # the summary leaves the lossless rounds out
    expect = list(range(1, len(rounds) + 1))
    contiguous = rounds == expect and history == [r for r in rounds if r not in lossless]
    contiguous = contiguous and len(rounds) == summary.rounds and not unmarked
    return {
        "every_row_once_per_epoch": every_row,
        "rounds_contiguous": contiguous,
        "rows_short": {str(e): n for e, n in short.items()},
        "epochs": {str(e): v for e, v in epochs.items()},
        "rounds": len(rounds),
        "rounds_redone": redone,
        "drops": len(drops),
        "missed_rows": missed_rows,
    }


def survivor_figures(summary, probes: list[Probe], injected: list[dict[str, Any]]) -> int | None:
    """Each injected event's ``survivor_steps_ratio``, ``replacement_first_step_s`` and
    ``survivor_restarts`` (chaos_figures.py) from its probe and the run's round log, added to its entry;
    returns the survivor restarts summed (None when an event's count is unknown)."""
    from raytrain_seq.rounds.events import EVENTS_FILE, EventLog

    if len(probes) != len(injected):
        raise RuntimeError(f"{len(injected)} events injected but {len(probes)} probed: the soak lost one")
    figures = event_figures(probes, round_steps(EventLog(Path(summary.path) / EVENTS_FILE).read()))
    for entry, figure in zip(injected, figures, strict=True):
        entry.update(figure)
    return total_restarts(figures)


def averaged_round(soak: Soak) -> int | None:
    """The latest averaged round (None while the averager restarts)."""
    state = soak.state()
    return None if state is None else state.next_round - 1


def averaged_place(soak: Soak) -> tuple[int, int] | None:
    """(epoch, rows done in it) of the latest averaged round (None while the averager restarts or before
    the first round)."""
    state = soak.state()
    if state is None or not state.position:
        return None
    return int(state.position["epoch"]), int(state.position["rows_done"])


def next_epoch_trained(at: tuple[int, int] | None) -> Callable[[tuple[int, int] | None], bool]:
    """Whether a place is past a round of the first epoch that starts after ``at``: at (3, 12) a round of
    epoch 4 (4, 4); at (3, 0), epoch 3 not begun, a round of epoch 3 (3, 4). The learners read a killed
    feed's replacement there at the latest (the rows they had read ahead are trained first)."""
    if at is None:
        return lambda place: place is not None
    epoch = at[0] + (at[1] > 0)
    return lambda place: place is not None and (place[0] > epoch or (place[0] == epoch and place[1] > 0))


def soak_run(soak: Soak, config, plan: list[tuple[int, str]]) -> tuple[Any, float, list[dict[str, Any]]]:
    """Start the run and inject ``plan``'s faults, each ``gap`` rounds after the last one recovered."""
    soak.start(config, soak.named())
    injected: list[dict[str, Any]] = []
    last = 1  # the round the next gap counts from
    every = config.train.checkpoint_every
    for gap, kind in plan:

        def reached(at=last + gap) -> bool:
            done = averaged_round(soak)
            return done is not None and done >= at

        soak.wait(reached, f"round {last + gap}")
        if kind == "learner_stalled":
            # A group of 2 that averaged a round together, and not at a checkpoint round (where rank 0
            # writes the checkpoint before it steps on).
            def calm() -> bool:
                state = soak.state()
                return state is not None and state.world_size == 2 and (state.next_round - 1) % every != 0

            soak.wait(lambda: (s := soak.state()) is not None and s.world_size == 2, "a group of 2")
            now = averaged_round(soak) or 0
            soak.wait(lambda now=now: (averaged_round(soak) or 0) > now and calm(), "a round of 2 learners")
        if soak.done:
            print(f"  run finished before round {last + gap}: {kind} not injected", flush=True)
            break
        # The learner processes before the fault (the survivor figures, chaos_figures.py).
        before = soak.wait(soak.processes, "the learner processes in the averager's report") or ()
        soak.lost_nodes, soak.added_node = [], None
        round_at, place_at = averaged_round(soak) or 0, averaged_place(soak)
        began, injected_at = time.monotonic(), time.time()
        detail = FAULTS[kind].inject(soak)
        up_at = time.time()  # a node_added's node is up once its injection returns
        print(f"  [{time.monotonic() - soak.began:5.0f} s] round {round_at}: {kind}: {detail}", flush=True)
        injected.append({"kind": kind, "round": round_at, "detail": detail})

        # Recovered: the group has the size the learner slots allow (a node's loss or gain has taken
        # effect: a round's close changed the live group), then RECOVERY_ROUNDS more rounds were averaged.
        size = min(2, len(soak.slots))
        grouped = soak.wait(
            lambda n=size: (s := soak.state()) is not None and s.world_size == n, f"a group of {size}"
        )
        if kind == "feed_killed":
            # A restarted feed recomputes what the learners ask of it, the next epoch's copies at the
            # latest; they train on the rows they read ahead meanwhile, so rounds alone would call it
            # recovered before its cost came and charge that to the next event.
            trained = next_epoch_trained(place_at)
            grouped = grouped and soak.wait(
                lambda t=trained: t(averaged_place(soak)), "the next epoch's rows"
            )
        settled = max(averaged_round(soak) or 0, round_at)
        enough = soak.wait(
            lambda r=settled: (averaged_round(soak) or 0) >= r + RECOVERY_ROUNDS, f"recovery from {kind}"
        )
        injected[-1]["recovered_s"] = round(time.monotonic() - began, 1)
        recovered_at = time.time() if grouped and enough else None  # None: the run ended first
        after = soak.wait(soak.processes, "the learner processes in the averager's report") or ()
        added = (soak.added_node, up_at) if kind == "node_added" and soak.added_node else None
        lost = tuple(soak.lost_nodes)
        soak.probes.append(Probe(kind, injected_at, recovered_at, tuple(before), after, lost, added))
        last = averaged_round(soak) or last
    summary, seconds = soak.finish()
    return summary, seconds, injected


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args, kinds = parse_args(argv)
    runs = soak_both(args, kinds)
    out, checks = outcome(args, runs)
    print_outcome(out, checks, runs)
    if args.json:
        print(json.dumps(out))
    return out


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    """The bench's flags, checked, and the fault kinds asked for."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=8, help="faults injected into the run")
    parser.add_argument("--seed", type=int, default=0, help="seed of the schedule and of the run")
    parser.add_argument("--kinds", default=",".join(k for k, f in FAULTS.items() if f.inject is not None))
    parser.add_argument(
        "--epochs", type=int, default=None, help="epochs of both runs (default: sized from --events)"
    )
    parser.add_argument("--videos", type=int, default=240, help="synthetic videos (all splits)")
    parser.add_argument("--k", type=int, default=2, help="local steps between rounds")
    # 10 s: a round waits this long for a learner that answers the averager's probes (a slow one); a
    # stopped learner is dropped once its process fails to answer one (train.averager_probe_s, the
    # default). A killed node's learner leaves the rounds as soon as Ray reports its actor dead (lose).
    parser.add_argument("--timeout", type=float, default=10.0, help="averager timeout (s)")
    parser.add_argument(
        "--validate-every",
        type=int,
        default=1000,
        help="rounds between validations (the default skips their cost: recovery is what the soak "
        "looks at; a lower m measures a restarted averager's evaluator build on the survivors' rounds)",
    )
    parser.add_argument("--storage", default=None, help="run folders (default: a temporary folder)")
    parser.add_argument(
        "--real",
        action="store_true",
        help="train on the real-footage set (data.footage) with the frame cache on",
    )
    parser.add_argument(
        "--own-cores",
        action="store_true",
        help="both runs with the joined learners on half the CPUs and everything else on the other "
        "half (bench/core_pins.py: a restart then takes no CPU from the learners, as on a cluster)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    args = parser.parse_args(argv)
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    unknown = [k for k in kinds if k not in FAULTS]
    if unknown or args.events < 0:
        parser.error(f"--kinds {unknown} unknown (known: {sorted(FAULTS)}) or --events < 0")
    if args.validate_every < 1:
        parser.error(f"--validate-every {args.validate_every}: use a round count >= 1 (1000: skip them)")
    return args, kinds


def soak_both(args: argparse.Namespace, kinds: list[str]) -> dict[str, Any]:
    """On a private cluster of three nodes: the undisturbed run, then the chaos run with its faults
    injected on the schedule; both summaries, their seconds and what was injected."""
    import ray
    from ray.cluster_utils import Cluster

    from raytrain_seq.runtime.connect import DEATH_AT_ONCE_ENV, NAMESPACE, WORKER_REUSE

    storage = args.storage or tempfile.mkdtemp(prefix="chaos-")
    # Dead raylets are noticed after ~5 missed 1-second health checks instead of Ray's default ~30 s.
    system = {**WORKER_REUSE, "health_check_period_ms": 1000, "health_check_failure_threshold": 5}
    # As cluster.yaml's `ray start` does (connect.DEATH_AT_ONCE): every process of the cluster inherits it,
    # and the run's driver, in this process, sees it (connect.death_at_once).
    os.environ[DEATH_AT_ONCE_ENV] = "0"
    # The dashboard serves Ray's state API (ray.util.state), where the soak finds the learner and shard
    # processes it stalls and kills; on a free port, since another cluster on the box may hold Ray's.
    head = {"num_cpus": 3, "include_dashboard": True, "dashboard_port": free_port(), "_system_config": system}
    learner_cpus = confine() if args.own_cores else None  # before the cluster: its processes inherit it
    cluster = Cluster(initialize_head=True, head_node_args=head)
    ray.init(address=cluster.address, namespace=NAMESPACE, log_to_driver=False)
    pins = None
    try:
        soak = Soak(cluster, NAMESPACE, args.timeout)
        if learner_cpus is not None:
            soak.pins = pins = CorePins(
                learner_cpus, joined_nodes=soak.joined_nodes, node_of=soak.learner_nodes
            )
            pins.start()
        for _ in range(2):
            soak.add_node()
        plan = schedule(args.events, kinds, args.seed)
        stalls = sum(kind == "learner_stalled" for _, kind in plan)
        arrivals = sum(kind == "node_added" for _, kind in plan[:-1])  # a last one has no event to wait
        sizing = make_config(storage, "sizing", args, 1)
        feed_kills = sum(kind == "feed_killed" for _, kind in plan)
        sized, per_epoch = size_epochs(sizing, args.events, stalls, arrivals, feed_kills)
        epochs = args.epochs or sized
        print(f"{epochs} epochs ({per_epoch} rounds an epoch at 2 learners); undisturbed run ...", flush=True)
        calm_config = make_config(storage, f"undisturbed-{args.seed}", args, epochs)
        soak.start(calm_config, soak.named())
        calm, calm_seconds = soak.finish()
        print(
            f"undisturbed: {calm.rounds} rounds, accuracy {calm.test_accuracy:.3f}, {calm_seconds:.0f} s",
            flush=True,
        )
        print(f"chaos run, schedule (gap, kind) {plan} ...", flush=True)
        while len(soak.slots) < 2:
            soak.add_node()
        config = make_config(storage, f"chaos-{args.seed}", args, epochs)
        summary, seconds, injected = soak_run(soak, config, plan)
    finally:
        if pins is not None:
            pins.stop()
        ray.shutdown()
        cluster.shutdown()
    return {
        "calm": calm,
        "calm_seconds": calm_seconds,
        "summary": summary,
        "seconds": seconds,
        "injected": injected,
        "config": config,
        "epochs": epochs,
        "stall_drops": soak.stall_drops,
        "probes": soak.probes,
        "own_cores": None
        if pins is None
        else {"learners": sorted(pins.learners), "pinned": len(pins.pinned), "poll_errors": len(pins.errors)},
    }


def free_port() -> int:
    """A TCP port of 127.0.0.1 that nothing listens on now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def outcome(args: argparse.Namespace, runs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """What the chaos run shows against the undisturbed one (every row once per epoch, contiguous rounds,
    accuracy within 5 points), the problems found, and the accounting checks behind them."""
    summary, calm, injected = runs["summary"], runs["calm"], runs["injected"]
    seconds, calm_seconds, epochs = runs["seconds"], runs["calm_seconds"], runs["epochs"]
    stall_drops = runs["stall_drops"]
    checks = accounting(summary, runs["config"])
    survivor_restarts = survivor_figures(summary, runs["probes"], injected)
    by_kind = {k: sum(e["kind"] == k for e in injected) for k in FAULTS}
    scores = (summary.test_accuracy, calm.test_accuracy)
    within = None not in scores and abs(scores[0] - scores[1]) <= 0.05
    # Both runs must start with the two learners, the undisturbed one above all: it is the baseline.
    started = {"undisturbed": first_group(calm), "chaos": first_group(summary)}
    short_start = [f"{name} {n}" for name, n in started.items() if n != 2]
    problems = [
        f"{len(injected)} of {args.events} events injected" if len(injected) < args.events else "",
        f"{stall_drops.count(False)} stalls not dropped" if not all(stall_drops) else "",
        "" if summary.test_accuracy is not None else "not finished",
        "" if checks["every_row_once_per_epoch"] else f"rows short per epoch {checks['rows_short']}",
        "" if checks["rounds_contiguous"] else "rounds not contiguous",
        "" if within else "accuracy more than 5 points from the undisturbed run",
        f"first group not 2 learners: {', '.join(short_start)}" if short_start else "",
    ]
    problems = [p for p in problems if p]
    out = {
        "events": len(injected),
        "by_kind": by_kind,
        "finished": summary.test_accuracy is not None,
        "every_row_once_per_epoch": checks["every_row_once_per_epoch"],
        "rounds_contiguous": checks["rounds_contiguous"],
        "accuracy": summary.test_accuracy,
        "undisturbed_accuracy": calm.test_accuracy,
        "seconds": round(seconds, 1),
        "undisturbed_seconds": round(calm_seconds, 1),
        "survivor_restarts": survivor_restarts,
        "first_group": started,
        "ok": not problems,
        "problems": problems,
        "events_requested": args.events,
        "accuracy_within_5_points": within,
        "rows_short": checks["rows_short"],
        "drops": checks["drops"],
        "missed_rows": checks["missed_rows"],
        "stalls_dropped": stall_drops,
        "epochs": epochs,
        "rounds": checks["rounds"],
        "rounds_redone": checks["rounds_redone"],
        "undisturbed_rounds": calm.rounds,
        "recoveries": sorted({r["kind"] for r in summary.recoveries}),
        "schedule": injected,
        "notes": {**{k: f.note for k, f in FAULTS.items() if f.note}, **NOTES},
        "seed": args.seed,
        "own_cores": runs["own_cores"],
    }
    return out, checks


def print_outcome(out: dict[str, Any], checks: dict[str, Any], runs: dict[str, Any]) -> None:
    """The events, recoveries, rows per epoch, accuracy and the verdict, for the terminal."""
    summary, calm, seconds, calm_seconds = (
        runs["summary"],
        runs["calm"],
        runs["seconds"],
        runs["calm_seconds"],
    )
    by_kind, problems = out["by_kind"], out["problems"]
    print(f"events {out['events']} {by_kind}")
    print(f"recoveries: {out['recoveries']}")
    for e in out["schedule"]:
        print(
            f"  round {e['round']} {e['kind']}: recovered {e.get('recovered_s')} s, survivor restarts "
            f"{e.get('survivor_restarts')}, survivor steps ratio {e.get('survivor_steps_ratio')}, "
            f"longest survivor stall {e.get('survivor_longest_stall_s')} s, survivors' CPU wait share "
            f"{e.get('survivor_cpu_wait_share')} (before {e.get('survivor_cpu_wait_share_before')}), "
            f"replacement's first step {e.get('replacement_first_step_s')} s"
        )
    print(f"survivor restarts: {out['survivor_restarts']}")
    for epoch, v in checks["epochs"].items():
        print(f"epoch {epoch}: plan {v['plan']}, trained {v['trained']}")
    print(
        f"accuracy {summary.test_accuracy:.3f} (undisturbed {calm.test_accuracy:.3f}), "
        f"{seconds:.0f} s (undisturbed {calm_seconds:.0f} s), rounds contiguous {checks['rounds_contiguous']}, "
        f"every row once per epoch {checks['every_row_once_per_epoch']}"
    )
    print("verdict: " + ("ok" if not problems else "FAILED: " + "; ".join(problems)))


if __name__ == "__main__":
    sys.exit(0 if main()["ok"] else 1)
