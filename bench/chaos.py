"""Chaos soak: one training run takes many faults of every kind; its own accounting says what was lost.

Issue 16. The fault tests (tests/test_faults.py) inject one fault each. This script runs one training
run on a several-raylet local cluster (``ray.cluster_utils.Cluster``: a head for the driver, the actors
and the data tasks, plus worker raylets with one ``learner_slot`` each, so each learner runs on a node
that can be killed) and injects ``--events N`` faults from a seeded schedule, then runs the same seed
undisturbed on the same cluster layout. The kinds (``FAULTS``, pluggable: a kind is a name, a
feasibility rule on the cluster's state, an injection and a recovery to wait for):

* ``node_killed``: a learner's raylet is removed without a graceful shutdown (the group shrinks);
* ``node_added``: a raylet with a learner slot joins (the group grows at Ray Train's next resize);
* ``averager_killed``: ``ray.kill(averager, no_restart=False)`` (Ray restarts it, learners re-seed);
* ``feed_killed``: ``ray.kill(feed, no_restart=False)`` (Ray restarts it, it recomputes its cache);
* ``learner_stalled``: one learner process is frozen (SIGSTOP) past ``averager_timeout_s``, then thawed
  (SIGCONT): the others drop it from the round and go on, it realigns and rejoins;
* ``shard_killed``: SIGKILL of one of the run's averager shard actors (Ray restarts it, the interrupted
  merge is re-run).

The verdict comes from the run's own records, not from the schedule: ``every_row_once_per_epoch``
compares, per epoch, the {count, sum, sum of squares} of the video ids of the rows in the averaged rounds
(``summary.json`` ``trained_ids``, from the learners' round stats: ``raytrain_seq/accounting.py``) with
the same checksum of the epoch's BLoad plan; ``rounds_contiguous`` reads the averager's round log
(``events.jsonl``): rounds 1..N, each once, in order (a round the averager logged and then died before
any learner took its result is averaged again; the log marks that record ``redo`` and it replaces the
first, which ``rounds_redone`` counts). A learner dropped from a round loses the rows it
trained for the rounds it missed (the averaging protocol's rule: they are never repeated), so a run with
``learner_stalled`` events reports them in ``rows_short`` and cannot be "every row once".

Its last line is one JSON object: events, by_kind, finished, every_row_once_per_epoch, rounds_contiguous,
accuracy, undisturbed_accuracy, seconds, undisturbed_seconds (and the details).

    python bench/chaos.py --events 8 --json
    python bench/chaos.py --events 4 --kinds node_killed,node_added,averager_killed,feed_killed --json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SLOT = "learner_slot"
WAIT_S = 150.0  # the longest wait for a recovery before the soak gives up on that event


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


def schedule(events: int, kinds: list[str], rounds: int, seed: int) -> list[tuple[int, str]]:
    """``events`` (round, kind) pairs: the rounds spread over the run with seeded jitter, each kind picked
    among the feasible ones with the fewest events so far (ties broken by the seed), so the kinds mix."""
    rng = random.Random(seed)
    model, counts, out = {"slots": 2}, dict.fromkeys(kinds, 0), []
    first, last = 2, max(3, rounds - 3)
    span = (last - first) / max(events, 1)
    for i in range(events):
        at = first + int(i * span + rng.uniform(0, span * 0.5))
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
        self.handles: dict[str, Any] = {}

    # ------------------------------------------------------------------------------------ cluster
    def add_node(self) -> str:
        node = self.cluster.add_node(num_cpus=1, resources={SLOT: 1})
        self.cluster.wait_for_nodes()
        self.slots.append(node)
        return f"node added ({len(self.slots)} learner slots)"

    def kill_node(self) -> str:
        self.cluster.remove_node(self.slots.pop(), allow_graceful=False)
        return f"learner node killed ({len(self.slots)} learner slots)"

    def kill_actor(self, which: str) -> str:
        self.ray.kill(self.handle(which), no_restart=False)
        return f"{which} actor killed"

    def learner_pids(self) -> list[int]:
        """The pids of this run's live learner processes (Ray Train workers started since ``start``; an
        earlier run's may linger), newest first, from the GCS actor table: the state API (ray.util.state)
        needs the dashboard, which this cluster does not run. Newest first: pids wrap on a busy box."""
        from ray._private.state import actors

        live = [
            a
            for a in actors().values()
            if a["ActorClassName"] == "RayTrainWorker"
            and a["State"] == "ALIVE"
            and a["StartTime"] >= self.began_ms
        ]
        return [int(a["Pid"]) for a in sorted(live, key=lambda a: a["StartTime"], reverse=True)]

    def kill_shard(self) -> str:
        """SIGKILL one of this run's averager shard actors (unnamed: found in the GCS actor table); Ray
        restarts it and re-runs an interrupted merge (max_restarts, max_task_retries)."""
        from ray._private.state import actors

        live = [
            a
            for a in actors().values()
            if a["ActorClassName"] == "AveragingShard"
            and a["State"] == "ALIVE"
            and a["StartTime"] >= self.began_ms
        ]
        if not live:
            return "no averager shard alive yet: nothing killed"
        victim = max(live, key=lambda a: a["StartTime"])
        os.kill(int(victim["Pid"]), signal.SIGKILL)
        return f"averager shard (pid {victim['Pid']}) killed"

    def stall_learner(self) -> str:
        pids = self.learner_pids()
        if len(pids) < 2:
            raise RuntimeError(f"a stall needs 2 learners, found {pids}: the schedule's model is off")
        pid = pids[0]
        seconds = self.timeout_s + 4.0
        drops = self.drops()
        os.kill(pid, signal.SIGSTOP)
        try:
            time.sleep(seconds)
        finally:
            os.kill(pid, signal.SIGCONT)
        deadline = time.monotonic() + 30.0  # the others drop it when their round times out
        while not (dropped := self.drops() > drops) and not self.done and time.monotonic() < deadline:
            time.sleep(0.2)
        return (
            f"learner process {pid} frozen for {seconds:.0f} s (averager timeout {self.timeout_s:g} s): "
            + ("dropped from its round" if dropped else "NOT dropped within 30 s")
        )

    def drops(self) -> int:
        state = self.state() or {}
        return sum(r["kind"] == "dropped" for r in state.get("recoveries", []))

    # ------------------------------------------------------------------------------------ the run
    def start(self, config, before: set[str]) -> None:
        from raytrain_seq.runtime.driver import run

        self.result, self.handles, self._before = {}, {}, before
        self.began, self.began_ms = time.monotonic(), time.time() * 1000

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

    def state(self) -> dict[str, Any] | None:
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


def make_config(storage: str, name: str, args: argparse.Namespace):
    """The fault tests' small run (the smoke model on --videos synthetic videos, B=2, tiny timeouts),
    elastic 1:2, with restarts enough for every event."""
    from raytrain_seq.config import Config

    fast = {
        "max_videos": args.videos,
        "batch_size": 2,
        "micro_batch_size": 2,
        "lr": 0.01,
        "k": args.k,
        "epochs": args.epochs,
        "validate_every": 1000,  # validation is not what the soak looks at: skip its cost
        "adaptive_batch": False,
        "worker_start_timeout_s": 8.0,
        "resize_interval_s": 5.0,
        "averager_timeout_s": args.timeout,
        "checkpoint_every": 4,
        "max_failures": args.events + 5,
        "averager_max_restarts": args.events + 2,
        "feed_max_restarts": args.events + 2,
        "learners": "1:2",
        "seed": args.seed,
    }
    return Config.from_preset("smoke", storage_path=storage, run_name=name, **fast)


def plan_checksums(config) -> dict[int, dict[str, int]]:
    """Per epoch, the checksum of the video ids of the epoch's BLoad plan (what the feed serves)."""
    from raytrain_seq.accounting import checksum
    from raytrain_seq.elastic.assembly import plan_seed, plan_specs
    from raytrain_seq.packing import pack
    from raytrain_seq.runtime.feed import feed_geometry

    geometry = feed_geometry(config, warn=False)
    train = geometry["catalogs"]["train"]
    out = {}
    for epoch in range(config.train.epochs):
        seed = plan_seed(config.data.seed, epoch)
        plan = pack(train.lengths, geometry["t_max"], strategy=config.data.packing, seed=seed)
        [specs] = plan_specs(plan, 1, train.ids.tolist(), train.labels.tolist(), None)
        out[epoch] = checksum(i for spec in specs for i in spec.ids)
    return out


def accounting(summary, config) -> dict[str, Any]:
    """The run's per-epoch trained-ids checksums against the plan's, and the round log's order."""
    from raytrain_seq.elastic.events import EVENTS_FILE

    plan = plan_checksums(config)
    trained = {int(e): c for e, c in summary.extra.get("trained_ids", {}).items()}
    epochs = {e: {"plan": plan[e], "trained": trained.get(e)} for e in plan}
    every_row = all(v["trained"] == v["plan"] for v in epochs.values()) and set(trained) == set(plan)
    short = {e: v["plan"]["count"] - (v["trained"] or {}).get("count", 0) for e, v in epochs.items()}
    log = Path(summary.path) / EVENTS_FILE
    records = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    # A record marked "redo" replaces the one before of its round: the averager logged that round and died
    # before any learner took its result, so the learners sent it again (no learner saw it twice).
    rounds, redone, unmarked = [], 0, 0
    for record in (r for r in records if r.get("type") == "round"):
        if record["round"] in rounds:
            redone += 1
            unmarked += not record.get("redo", False)
        else:
            rounds.append(record["round"])
    # The epochs where a learner was dropped from a round: its rows of the rounds it missed are lost by
    # the round protocol's rule (never repeated), so there the trained count may fall short, never over.
    epoch_of = {}
    for record in (r for r in records if r.get("type") == "round" and r.get("position")):
        where = record["position"]
        epoch_of[record["round"]] = where["epoch"] - 1 if where["rows_done"] == 0 else where["epoch"]
    drops = [r["round"] for r in records if r.get("type") == "membership" and r.get("event") == "drop"]
    dropped = sorted({epoch_of.get(r, epoch_of.get(r + 1, -1)) for r in drops})
    outside = all(
        v["trained"] == v["plan"]
        if e not in dropped
        else (v["trained"] or {"count": 0})["count"] <= v["plan"]["count"]
        for e, v in epochs.items()
    )
    history = [h["round"] for h in summary.loss_history]
    expect = list(range(1, len(rounds) + 1))
    contiguous = rounds == expect == history and len(rounds) == summary.rounds and not unmarked
    return {
        "every_row_once_per_epoch": every_row,
        "rounds_contiguous": contiguous,
        "rows_short": {str(e): n for e, n in short.items()},
        "epochs": {str(e): v for e, v in epochs.items()},
        "rounds": len(rounds),
        "rounds_redone": redone,
        "epochs_with_drops": dropped,
        "every_row_once_outside_drops": outside,
    }


def soak_run(soak: Soak, config, plan: list[tuple[int, str]]) -> tuple[Any, float, list[dict[str, Any]]]:
    """Start the run and inject ``plan``'s faults at their rounds, each after the last one's recovery."""
    soak.start(config, soak.named())
    injected: list[dict[str, Any]] = []
    for at, kind in plan:

        def reached(at=at) -> bool:
            state = soak.state()
            return state is not None and state["next_round"] - 1 >= at

        soak.wait(reached, f"round {at}")
        if kind == "learner_stalled":  # a group of 2 must be training (a node added grows it later)
            soak.wait(lambda: (s := soak.state()) is not None and s["world_size"] == 2, "a group of 2")
        if soak.done:
            print(f"  run finished before round {at}: {kind} not injected", flush=True)
            break
        state = soak.state() or {}
        began = time.monotonic()
        detail = FAULTS[kind].inject(soak)
        round_at = state.get("next_round", 0) - 1
        print(f"  [{time.monotonic() - soak.began:5.0f} s] round {round_at}: {kind}: {detail}", flush=True)
        injected.append({"kind": kind, "round": round_at, "detail": detail})

        def recovered(after=round_at) -> bool:  # two rounds averaged after the fault
            state = soak.state()
            return state is not None and state["next_round"] - 1 >= after + 2

        soak.wait(recovered, f"recovery from {kind}")
        injected[-1]["recovered_s"] = time.monotonic() - began
    summary, seconds = soak.finish()
    return summary, seconds, injected


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=8, help="faults injected into the run")
    parser.add_argument("--seed", type=int, default=0, help="seed of the schedule and of the run")
    parser.add_argument("--kinds", default=",".join(k for k, f in FAULTS.items() if f.inject is not None))
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--videos", type=int, default=240, help="synthetic videos (all splits)")
    parser.add_argument("--k", type=int, default=2, help="local steps between rounds")
    # 20 s, not the fault tests' 8: a killed node's learner must be replaced by Ray Train's group restart
    # (the raylet is declared dead after ~5 s) before the survivors' round times out and drops it, since a
    # dropped learner's rows of the rounds it missed are lost (the stall kind shows that on purpose).
    parser.add_argument("--timeout", type=float, default=20.0, help="averager timeout (s)")
    parser.add_argument("--storage", default=None, help="run folders (default: a temporary folder)")
    parser.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    args = parser.parse_args(argv)
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    unknown = [k for k in kinds if k not in FAULTS]
    if unknown or args.events < 0:
        parser.error(f"--kinds {unknown} unknown (known: {sorted(FAULTS)}) or --events < 0")

    import ray
    from ray.cluster_utils import Cluster

    from raytrain_seq.runtime.connect import NAMESPACE, WORKER_REUSE

    storage = args.storage or tempfile.mkdtemp(prefix="chaos-")
    # Dead raylets are noticed after ~5 missed 1-second health checks instead of Ray's default ~30 s.
    system = {**WORKER_REUSE, "health_check_period_ms": 1000, "health_check_failure_threshold": 5}
    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 3, "include_dashboard": False, "_system_config": system},
    )
    ray.init(address=cluster.address, namespace=NAMESPACE, log_to_driver=False)
    try:
        soak = Soak(cluster, NAMESPACE, args.timeout)
        for _ in range(2):
            soak.add_node()
        print("undisturbed run ...", flush=True)
        calm_config = make_config(storage, f"undisturbed-{args.seed}", args)
        soak.start(calm_config, soak.named())
        calm, calm_seconds = soak.finish()
        plan = schedule(args.events, kinds, calm.rounds, args.seed)
        print(
            f"undisturbed: {calm.rounds} rounds, accuracy {calm.test_accuracy:.3f}, {calm_seconds:.0f} s",
            flush=True,
        )
        print(f"chaos run, schedule {plan} ...", flush=True)
        while len(soak.slots) < 2:
            soak.add_node()
        config = make_config(storage, f"chaos-{args.seed}", args)
        summary, seconds, injected = soak_run(soak, config, plan)
    finally:
        ray.shutdown()
        cluster.shutdown()

    checks = accounting(summary, config)
    by_kind = {k: sum(e["kind"] == k for e in injected) for k in FAULTS}
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
        "accuracy_within_5_points": abs(summary.test_accuracy - calm.test_accuracy) <= 0.05,
        "rows_short": checks["rows_short"],
        "epochs_with_drops": checks["epochs_with_drops"],
        "every_row_once_outside_drops": checks["every_row_once_outside_drops"],
        "rounds": checks["rounds"],
        "rounds_redone": checks["rounds_redone"],
        "undisturbed_rounds": calm.rounds,
        "recoveries": sorted({r["kind"] for r in summary.recoveries}),
        "schedule": injected,
        "notes": {k: f.note for k, f in FAULTS.items() if f.note},
        "seed": args.seed,
    }
    print(f"events {out['events']} {by_kind}")
    print(f"recoveries: {out['recoveries']}")
    for epoch, v in checks["epochs"].items():
        print(f"epoch {epoch}: plan {v['plan']}, trained {v['trained']}")
    print(
        f"accuracy {summary.test_accuracy:.3f} (undisturbed {calm.test_accuracy:.3f}), "
        f"{seconds:.0f} s (undisturbed {calm_seconds:.0f} s), rounds contiguous {checks['rounds_contiguous']}, "
        f"every row once per epoch {checks['every_row_once_per_epoch']}"
    )
    if args.json:
        print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
