"""AAVG on the synthetic set with 2 learners: K, the DDP peer, the averager's bandwidth; the AAVG1..4 ablation.

Every run is the real job (``driver.run``) on a local Ray cluster: 1. K in {1, 4, 16, -1 (epoch)} ->
test accuracy, learners' wall time, its share averaging; 2. the ablation (``bench/ablation.py``,
``--only ablation``, its own result ``averaging_ablation``); 3. the DDP peer on Ray Train's
``TorchTrainer`` (all-reduce every step) with the same feed, model and ``step.InnerStep``, so only the
synchronisation differs: time to the same validation accuracy, DDP / AAVG; 4. the data plane: one round
of n = 1, 2, 4, 8 learner processes against a numpy mean of the same bytes and the library arithmetic,
the busiest actor's bytes per round (sharded and star), where a round's time goes, and a cost model for
16 ResNet-152 learners; the store is preallocated (``--only bandwidth`` also times Ray's default store).

    python bench/averaging.py            # default size (the one make bench runs)
    python bench/averaging.py --tiny     # one short run of each kind
    python bench/averaging.py --only bandwidth --json   # the data plane only (or --only ablation)
"""

from __future__ import annotations

import argparse
import itertools
import logging
import math
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import ablation
import ddp_peer
from averager_cost import bandwidth, cost_model
from benchlib import (
    LocalData,
    Result,
    add_size_flags,
    command_line,
    fmt,
    new_figure,
    spread_keys,
    try_plot,
    write_results,
)

from raytrain_seq.algorithms.packing import pack, shard
from raytrain_seq.config import Config
from raytrain_seq.parts import Parts

logger = logging.getLogger(__name__)

NAMESPACE = "raytrain_seq"
SIZES = {
    "tiny": {"videos": 40, "epochs": 2, "batch": 1, "ks": [4, -1], "ddp": True, "mb": 4},
    "default": {"videos": 500, "epochs": 5, "batch": 1, "ks": [1, 4, 16, -1], "ddp": True, "mb": 100},
    "full": {"videos": 9537, "epochs": 20, "batch": 4, "ks": [1, 4, 16, -1], "ddp": True, "mb": 400},
}  # fmt: skip
# The paper's speed-up (2067 min of single-GPU SGD against 61 min on 16 GPUs).
PAPER_SPEEDUP = 2067 / 61
RESNET152_PARAMS = 60.2e6


# -------------------------------------------------------------------------------------- pure helpers
def steps_per_epoch(lengths: np.ndarray, t_max: int, learners: int, batch: int) -> int:
    """Optimizer steps of each learner in one epoch: its equal share of the plan's blocks / batch."""
    blocks = len(shard(pack(lengths, t_max, strategy="optimal"), learners)[0])
    return max(1, math.ceil(blocks / batch))


def validate_every(k: int, steps: int, per_epoch: int = 1) -> int:
    """m such that validation runs about ``per_epoch`` times an epoch whatever K is: ceil(steps / (K per_epoch)).

    32 steps an epoch, once: K=1 -> 32, K=4 -> 8, K=16 -> 2, K=-1 -> 1 (one round per epoch, the most
    there is); four times: K=4 -> 2 (a validation every 8 steps).
    """
    return 1 if k < 0 else max(1, math.ceil(steps / (k * per_epoch)))


def best_before_growth(val_history: list[dict], batch_history: list[dict]) -> tuple[int, float] | None:
    """(round, best validation accuracy of the rounds before it) where the batch size first grew; None if never.

    Batch sizes (1, 1, 2 at rounds 1-3) and validations 0.10, 0.09 at rounds 1-2 give (3, 0.10): the
    rule fired while validation was still at chance on a 10-class set.
    """
    entries = sorted(batch_history, key=lambda e: e["round"])
    for before, after in itertools.pairwise(entries):
        if after["batch_size"] > before["batch_size"]:
            seen = [
                h["accuracy"]
                for h in val_history
                if h["round"] < after["round"] and h["accuracy"] is not None
            ]
            return int(after["round"]), max(seen, default=0.0)
    return None


def time_to_reach(history: list[dict], target: float) -> float | None:
    """The first ``time_s`` whose ``accuracy`` is >= target, or None if the run never got there."""
    entry = _first_reaching(history, target)
    return None if entry is None else float(entry["time_s"])


def epoch_to_reach(history: list[dict], target: float) -> int | None:
    """The ``epoch`` (counted from 1) of the first entry whose ``accuracy`` is >= target, or None."""
    entry = _first_reaching(history, target)
    return None if entry is None or entry.get("epoch") is None else int(entry["epoch"])


def _first_reaching(history: list[dict], target: float) -> dict | None:
    for entry in sorted(history, key=lambda e: e["time_s"]):
        if entry["accuracy"] is not None and entry["accuracy"] >= target - 1e-12:
            return entry
    return None


# ------------------------------------------------------------------------------------------ the runs
def base_config(size: dict, storage: str, name: str, **overrides) -> Config:
    return Config.from_preset(
        "demo", max_videos=size["videos"], epochs=size["epochs"], batch_size=size["batch"],
        micro_batch_size=size["batch"], learners=2, checkpoint_every=10**9, storage_path=storage,
        run_name=name, seed=size["seed"], **overrides,
    )  # fmt: skip


def run_aavg(size: dict, storage: str, name: str, k: int, steps: int, checks: int = 1, **switches) -> dict:
    from raytrain_seq.runtime.driver import run

    m = validate_every(k, steps, checks)
    config = base_config(size, storage, name, k=k, validate_every=m, **switches)
    began = time.perf_counter()
    summary = run(config)
    wall = time.perf_counter() - began
    learner_s = summary.extra.get("learner_seconds") or summary.seconds.get("compute", 0.0)
    # A validation scores a round's averaged model off the learners' path and lands later: its point on
    # the time-to-accuracy curve is when that model existed (the round's time), as DDP's is its epoch end.
    round_s = {h["round"]: h["time_s"] for h in summary.loss_history if "time_s" in h}
    history = [
        {**h, "time_s": round_s.get(h.get("round"), h["time_s"])} for h in summary.val_accuracy_history
    ]
    sizes = [h["batch_size"] for h in summary.batch_size_history] or [size["batch"]]
    out = {
        "name": name, "k": k, "m": config.train.validate_every, "test": summary.test_accuracy,
        "val": history[-1]["accuracy"] if history else None, "best_val": max((h["accuracy"] for h in history), default=None),
        "history": history, "rounds": summary.rounds, "learner_s": learner_s, "total_s": wall,
        "averaging_s": summary.seconds.get("averaging", 0.0), "final_b": sizes[-1], "max_b": max(sizes),
        "adaptive": config.train.adaptive_batch, "merge": config.train.merge_moments,
        "first_growth": best_before_growth(history, summary.batch_size_history),
        "steps": summary.steps,
    }  # fmt: skip
    mean_s = summary.extra.get("learners_mean_s", {})
    # The learners' mean averaging time and its part spent waiting for the round's last arrival.
    out["mean_averaging_s"], out["waiting_s"] = (
        mean_s.get("averaging", 0.0),
        mean_s.get("averaging_wait", 0.0),
    )
    out["share"] = out["averaging_s"] / learner_s if learner_s else None
    print(f"{name}: test {fmt(out['test'], '.3f')}, learners {learner_s:.1f} s, averaging {out['averaging_s']:.1f} s, "
          f"B {sizes[0]}->{sizes[-1]}", flush=True)  # fmt: skip
    return out


def run_ddp(size: dict, storage: str, name: str) -> dict:
    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    from raytrain_seq.runtime.feed import create_feed

    config = base_config(size, storage, name, adaptive_batch=False, merge_moments=False)
    began = time.perf_counter()
    feed = create_feed(Parts.of(config).feed, name=f"feed-{name}", namespace=NAMESPACE)
    # ddp_peer is not importable on the workers (bench/ is no package): ship the loop by value.
    ray.cloudpickle.register_pickle_by_value(ddp_peer)
    trainer = TorchTrainer(
        ddp_peer.ddp_loop,
        train_loop_config={"config": config.to_dict(), "feed": f"feed-{name}", "namespace": NAMESPACE},
        scaling_config=ScalingConfig(num_workers=2, use_gpu=False, resources_per_worker={"CPU": 1}),
        run_config=RunConfig(name=name, storage_path=storage),
    )
    result = trainer.fit()
    ray.kill(feed)
    if result.error is not None:
        raise result.error
    m = result.metrics or {}
    history = m.get("history", [])
    out = {
        "name": name, "test": m.get("test_accuracy"), "history": history, "learner_s": m.get("learner_seconds"),
        "total_s": time.perf_counter() - began, "val": history[-1]["accuracy"] if history else None,
        "best_val": max((h["accuracy"] for h in history), default=None),
    }  # fmt: skip
    print(f"{name}: test {fmt(out['test'], '.3f')}, learners {fmt(out['learner_s'], '.1f')} s", flush=True)
    return out


def run(args) -> dict:
    import ray

    size = dict(SIZES[args.size])
    size["seed"] = args.seed
    for key in ("videos", "epochs", "batch", "ks"):
        if getattr(args, key) is not None:
            size[key] = getattr(args, key)
    data = LocalData(Config.from_preset("demo", max_videos=size["videos"], seed=size["seed"]))
    steps = steps_per_epoch(data.catalogs["train"].lengths, data.t_max, 2, size["batch"])
    storage = tempfile.mkdtemp(prefix="bench-averaging-")
    from raytrain_seq.runtime.connect import store_options

    ray.init(
        address="local",
        num_cpus=4,
        namespace=NAMESPACE,
        include_dashboard=False,
        log_to_driver=False,
        **store_options(store_gb(size["mb"])),
    )
    logging.getLogger("ray").setLevel(logging.WARNING)
    try:
        ks = [run_aavg(size, storage, f"aavg-k{k}", k, steps) for k in size["ks"]]
        aavg3 = next(r for r in ks if r["k"] == -1)
        ddp = run_ddp(size, storage, "ddp") if size["ddp"] else None
        band = bandwidth(size["mb"])
    finally:
        ray.shutdown()
        shutil.rmtree(storage)  # the runs' checkpoints: the summaries are already read
    return {
        "size": size,
        "steps": steps,
        "ks": ks,
        "ddp": ddp,
        "aavg": aavg3,
        "bandwidth": band,
    }


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f} %"


Table = tuple[str, list[str], list[list[str]]]  # (title, header, rows)


def tables(res: dict, args) -> list[Table]:
    """The K table, AAVG against DDP (when run), the bandwidth and round tables and the cost model."""
    out = [_k_table(res)]
    if res["ddp"] is not None:
        out.append(_ddp_table(res))
    out += _bandwidth_tables(res["bandwidth"])
    out.append(_cost_table(res, args))
    return out


def _k_table(res: dict) -> Table:
    header = [
        "K",
        "m",
        "rounds",
        "test acc",
        "best val",
        "learners s",
        "averaging s",
        "averaging share",
        "B first->last",
    ]
    rows = [
        ["epoch (-1)" if r["k"] < 0 else str(r["k"]), str(r["m"]), str(r["rounds"]), _pct(r["test"]), _pct(r["best_val"]),
         fmt(r["learner_s"], ".1f"), fmt(r["averaging_s"], ".1f"), _pct(r["share"]), f"{res['size']['batch']}->{r['final_b']}"]
        for r in res["ks"]
    ]  # fmt: skip
    return "K (local steps between averaging rounds):", header, rows


def _ddp_table(res: dict) -> Table:
    target, t_a, t_d = res["target"], res["t_aavg"], res["t_ddp"]
    header = ["run", "test acc", "best val", f"s to val >= {_pct(target)}", "learners s", "vs AAVG"]
    rows = [
            ["AAVG (K = epoch, adaptive, merge)", _pct(res["aavg"]["test"]), _pct(res["aavg"]["best_val"]), fmt(t_a, ".1f"),
             fmt(res["aavg"]["learner_s"], ".1f"), "1.00x"],
            ["Ray Train TorchTrainer + DDP (all-reduce every step)", _pct(res["ddp"]["test"]), _pct(res["ddp"]["best_val"]),
             fmt(t_d, ".1f"), fmt(res["ddp"]["learner_s"], ".1f"), fmt(t_d / t_a if t_a and t_d else None, ".2f") + "x"],
        ]  # fmt: skip
    return "Time to the same validation accuracy, AAVG vs DDP:", header, rows


def _bandwidth_tables(b: dict) -> list[Table]:
    """The paths' bandwidth, and the rounds by learners when --only bandwidth measured them."""
    out = []
    header = ["path", "MB per round", "seconds", "MB/s", "vs numpy"]
    names = {"numpy": "numpy mean, one process", "library": "average_states + merge_adam_states, one process",
             "actor": "sharded data plane, one round of 2 learner processes"}  # fmt: skip
    rows = [
        [
            names[k],
            f"{b['mb']:.0f}",
            f"{b['seconds'][k]:.3f}",
            f"{b['mbps'][k]:,.0f}",
            f"{b['mbps'][k] / b['mbps']['numpy']:.2f}x",
        ]
        for k in names
    ]
    out.append(
        (
            "Averager bandwidth (weights + 2 Adam moments, fp32; the median of 9 rounds, and of 9 passes of numpy and "
            "of the library, one pass just before each round):",
            header,
            rows,
        )
    )
    if "round_s" in b:
        header = ["learners", "round s (median)", "busiest actor, payloads/round", "one shard (star)"]
        rows = [
            [n, f"{t:.3f}", f"{b['hub_load'][n]:.2f}", fmt(b.get("hub_load_star", {}).get(n), ".2f")]
            for n, t in b["round_s"].items()
        ]
        out.append(
            ("Averaging rounds by learners (100 MB per learner, one shard per learner):", header, rows)
        )
    return out


def _cost_table(res: dict, args) -> Table:
    header = [
        "NIC",
        "payload per learner",
        "averager wire s/round",
        "arithmetic s/round",
        "round s",
        "sharded round s",
        f"DDP ring s/epoch ({res['cost_steps']} steps)",
    ]
    rows = [
        [f"{c['nic']:g} Gbit/s", f"{c['payload_mb']:.1f} MB", f"{c['wire_s']:.2f}", f"{c['mean_s']:.2f}", f"{c['round_s']:.2f}",
         f"{c['sharded_round_s']:.2f}", f"{c['ring_epoch_s']:.2f}"]
        for c in res["cost"]
    ]  # fmt: skip
    return (
        f"Cost model, {args.cost_learners} learners of ResNet-152 size ({RESNET152_PARAMS / 1e6:.1f}M params):",
        header,
        rows,
    )


def verdicts(res: dict) -> tuple[list[str], dict]:
    """The verdict lines (K, DDP, bandwidth, cost model) and the headline numbers they quote."""
    out, head = [], {}
    out += _k_verdict(res, head)
    out += _ddp_verdict(res, head)
    _baseline_head(res, head)
    b = res["bandwidth"]["mbps"]
    head.update(actor_mbps=b["actor"], numpy_mbps=b["numpy"])
    out.append(_bandwidth_verdict(res))
    out.append(_cost_verdict(res))
    return out, head


def _baseline_head(res: dict, head: dict) -> None:
    """Beside the averaging share, from the same run: the test accuracy of AAVG at K = epoch and K = 1 and
    of DDP, and the run's n (one seed: the figures have no spread over seeds)."""
    ks = {r["k"]: r for r in res["ks"]}
    head["test_aavg_k_epoch"] = ks[-1]["test"]
    head["test_aavg_k1"] = ks[1]["test"] if 1 in ks else None
    head["test_ddp"] = res["ddp"]["test"] if res["ddp"] is not None else None
    head["runs"], head["seed"] = 1, res["size"]["seed"]
    for key in (
        "test_aavg_k_epoch",
        "test_aavg_k1",
        "test_ddp",
        "share_k_epoch",
        "share_k1",
        "ddp_over_aavg_time",
    ):
        if key in head:
            spread_keys(head, key, 1, None)


def _k_verdict(res: dict, head: dict) -> list[str]:
    from benchlib import compare_accuracy

    out = []
    ks = {r["k"]: r for r in res["ks"]}
    head["share_k_epoch"] = ks[-1]["share"]
    if 1 in ks:
        a, b = ks[-1], ks[1]
        head["share_k1"] = b["share"]
        _, _, word = compare_accuracy(a["test"] or 0.0, b["test"] or 0.0, res["test_videos"])
        out.append(
            f"K (one run, seed {res['size']['seed']}: no spread over seeds): averaging once per epoch spends "
            f"{_pct(a['share'])} of the learners' time averaging against "
            f"{_pct(b['share'])} at K=1 ({a['rounds']} vs {b['rounds']} rounds), and its test accuracy "
            f"{word} K=1's ({_pct(a['test'])} vs {_pct(b['test'])}); the paper: K = -1 converges well with "
            "near-linear speed-up."
        )
    return out


def _ddp_verdict(res: dict, head: dict) -> list[str]:
    """AAVG against DDP: near chance there is nothing to compare; else the speed and, when AAVG is slower,
    where its time went (the epochs each needed, the learners' waiting in the rounds)."""
    chance = 1.0 / res.get("num_classes", 10)
    if res["ddp"] is not None and res["target"] is not None and res["target"] < 1.5 * chance:
        return [
            f"Against Ray Train + DDP: the lower of the two best validation accuracies is {_pct(res['target'])}, near "
            f"chance ({_pct(chance)}): too little training at this size for a time-to-accuracy comparison."
        ]
    if res["ddp"] is None or not (res["t_aavg"] and res["t_ddp"]):
        return []
    speed = res["t_ddp"] / res["t_aavg"]
    head["ddp_over_aavg_time"] = speed
    split = _epochs_clause(res) + _waiting_clause(res) if speed < 1 else ""
    return [
        f"Against Ray Train + DDP (the same run): AAVG reaches {_pct(res['target'])} validation accuracy in "
        f"{res['t_aavg']:.1f} s of learner time, DDP in {res['t_ddp']:.1f} s ({speed:.2f}x; above 1 means AAVG is "
        f"faster); test accuracy AAVG (K = epoch) {_pct(res['aavg']['test'])}, DDP {_pct(res['ddp']['test'])}.{split} The paper's "
        f"{PAPER_SPEEDUP:.0f}x is over single-GPU SGD on 16 GPUs, not over DDP, and is not comparable at 2 CPU learners."
    ]


def _epochs_clause(res: dict) -> str:
    """When AAVG was slower: the epochs each run needed to reach the target and their lengths."""
    epochs = {run: epoch_to_reach(res[run]["history"], res["target"]) for run in ("aavg", "ddp")}
    if not all(epochs.values()):
        return ""
    # An illustration with made-up round numbers: AAVG there after epoch 5 in 12.5 s (2.5 s an
    # epoch), DDP after epoch 4 in 8.0 s (2.0 s an epoch): one epoch more for one average per epoch,
    # and epochs round(100 * (2.5 / 2.0 - 1)) = 25 % longer.
    per = {run: res[f"t_{run}"] / epochs[run] for run in ("aavg", "ddp")}
    more = epochs["aavg"] - epochs["ddp"]
    longer = round(100 * (per["aavg"] / per["ddp"] - 1))
    length = "as long as" if longer == 0 else f"{abs(longer)} % {'longer' if longer > 0 else 'shorter'} than"
    return (
        f" AAVG's averaged model first scored it after epoch {epochs['aavg']} ({per['aavg']:.2f} s of "
        f"learner time an epoch), DDP after epoch {epochs['ddp']} ({per['ddp']:.2f} s an epoch): AAVG "
        f"needed {more} epoch(s) more (one average per epoch against an all-reduce every step), and its "
        f"epochs were {length} DDP's."
    )


def _waiting_clause(res: dict) -> str:
    """When AAVG was slower: its learners' time in averaging calls, waiting against the rounds proper."""
    a = res["aavg"]
    if not a.get("mean_averaging_s"):
        return ""
    waiting, plane = a["waiting_s"], a["mean_averaging_s"] - a["waiting_s"]
    return (
        f" What stands in the way, measured: of the AAVG learners' {a['mean_averaging_s']:.1f} s (mean) inside "
        f"averaging calls, {waiting:.1f} s is waiting for the round's last learner to arrive (the two "
        f"learners' compute differs from epoch to epoch on the 2 shared cores) and {plane:.1f} s the rounds "
        f"themselves (put, merge, read back, install); without the waiting AAVG would take "
        f"{max(res['t_aavg'] - waiting, 1e-9):.1f} s ({res['t_ddp'] / max(res['t_aavg'] - waiting, 1e-9):.2f}x)."
    )


def _bandwidth_verdict(res: dict) -> str:
    b = res["bandwidth"]["mbps"]
    job_mb = res.get("job_payload_mb", 0.0)
    return (
        f"Bandwidth: a round of 2 learners through the sharded data plane averages {b['actor']:,.0f} MB/s "
        f"({b['actor'] / b['numpy']:.2f}x a one-process numpy mean at {b['numpy']:,.0f} MB/s; the library arithmetic "
        f"alone {b['library']:,.0f} MB/s). This job's model sends {job_mb:.2f} MB per learner per round, i.e. "
        f"{2 * job_mb / b['actor'] * 1e3:.1f} ms of averaging per round at that rate."
        + rounds_clause(res["bandwidth"])
    )


def _cost_verdict(res: dict) -> str:
    c = next((c for c in res["cost"] if c["nic"] == 100), res["cost"][0])
    bigger = "arithmetic" if c["mean_s"] > c["wire_s"] else "the wire"
    more = "more" if c["wire_s"] > c["ring_epoch_s"] else "fewer"
    return (
        f"Cost model (formula in the notes): at {c['nic']:g} Gbit/s one round for {res['cost_learners']} ResNet-152 "
        f"learners takes about {c['round_s']:.1f} s at the averager: {c['wire_s']:.1f} s on its NIC (the star's hot "
        f"spot) + {c['mean_s']:.1f} s of arithmetic at this machine's single-actor speed, so {bigger} dominates. DDP's "
        f"ring all-reduce of the gradients costs {c['ring_epoch_s']:.1f} s per epoch ({res['cost_steps']} steps): at "
        f"K = epoch the averager's NIC moves {more} bytes than each ring member's, and AAVG's saving is in "
        "synchronisation points (one per epoch instead of one per step), not in bytes. Sharded (one shard per "
        f"learner), the same round costs about {c['sharded_round_s']:.2f} s: each node moves 2 payloads and each shard "
        "averages one, whatever the number of learners."
    )


def rounds_clause(band: dict) -> str:
    """How the round grows with the learners and where its time goes (from --only bandwidth's numbers)."""
    if "round_s" not in band or "2" not in band["round_s"] or "8" not in band["round_s"]:
        return ""
    r = band["round_s"]
    text = (
        f" A round of 8 learners takes {r['8'] / r['2']:.2f}x a round of 2 (on this box's cores every learner's "
        f"copies share the same CPUs); the busiest averaging actor moves {band['hub_load']['8']:.2f} payloads "
        f"per round at 8 learners (one shard for all: {band.get('hub_load_star', {}).get('8', float('nan')):.2f})."
    )
    by_tensors = band.get("round_s_2_by_tensors") or {}
    if len(by_tensors) > 1:
        (few, t_few), (many, t_many) = sorted(by_tensors.items(), key=lambda item: int(item[0]))[:2]
        text += (
            f" The same bytes in {many} tensors per learner instead of {few}: a round of 2 takes {t_many:.3f} s "
            f"instead of {t_few:.3f} s ({t_many / t_few:.2f}x), the per-tensor work of the messages (the "
            "layout and each tensor's Adam step travel with every payload and every reply) and of reading "
            "the merged state back into tensors."
        )
    split = band.get("split_s", {}).get("2")
    if split:
        text += _split_clause(band, split) + _floor_clause(band) + _transport_clause(band)
        text += _after_round_clause(split)
    return text


def _split_clause(band: dict, split: dict) -> str:
    """Where a learner's time in a round of 2 goes: packing, sending, waiting for the merged state."""
    channels = band.get("transport") == "channels"
    text = ""
    send, merge, rest = (
        ("writing its slices into its channels", "read + merge + write into its channel", "and the reads of the merged slices")
        if channels
        else ("putting its slices in the object store", "read + merge", "and the merged slices' copy into the object store")
    )  # fmt: skip
    text += (
        f" At 2 learners a learner spends {1e3 * split['pack_s']:.0f} ms packing, {1e3 * split['put_s']:.0f} ms "
        f"{send} and {1e3 * split['average_s']:.0f} ms from sending to holding the "
        f"merged state, of which the slowest shard's {merge} is {1e3 * split.get('shard_merge_s', 0):.0f} ms; "
        f"the other {1e3 * (split['average_s'] - split.get('shard_merge_s', 0)):.0f} ms are the round's actor "
        f"calls (learner to control plane to shards and back) {rest}."
    )
    if "driver_round_s" in split:
        text += (
            f" (These are the learners' clocks; timed by the driver, which dispatches each round to the "
            f"learners and collects their replies, a round of 2 takes {1e3 * split['driver_round_s']:.0f} ms.)"
        )
    return text


def _floor_clause(band: dict) -> str:
    """The same round's copies and merge without Ray, beside numpy's mean."""
    text = ""
    floor = band.get("floor_s") or {}
    numpy_s = band.get("seconds", {}).get("numpy")
    if floor and numpy_s:
        text += (
            f" Without Ray, the same two processes do the round's copies and merge in {1e3 * floor['total']:.0f} ms "
            f"(the puts' copy {1e3 * floor['put']:.0f}, the shards' merge {1e3 * floor['merge']:.0f}, their "
            f"return {1e3 * floor['return']:.0f}), {floor['total'] / numpy_s:.2f}x the numpy mean's "
            f"{1e3 * numpy_s:.0f} ms: the round's other {1e3 * (band['round_s']['2'] - floor['total']):.0f} ms "
            + (
                "are Ray's part (the channel writes and reads beyond their copies, the actor calls)."
                if band.get("transport") == "channels"
                else "are Ray's part (the puts and reads beyond their copies, the actor calls, the return's "
                "serialisation)."
            )
        )
    return text


def _transport_clause(band: dict) -> str:
    """The transport the rounds went through, and the other one's round for comparison."""
    text = ""
    other_s = band.get("other_round_s")
    if other_s:
        channels = band.get("transport") == "channels"
        text += (
            f" These rounds go through {band.get('transport', 'the object store')}"
            + (
                " (Ray's shared-memory channels, written in place every round: no new objects, and no "
                "object reference in any message; raytrain_seq/dataplane/generations.py)"
                if channels
                else ""
            )
            + f"; through {'the object store' if channels else 'the channels'} instead, the same learners "
            f"take {1e3 * other_s:.0f} ms a round, {other_vs_numpy(band):.2f}x numpy's bandwidth."
        )
    return text


def _after_round_clause(split: dict) -> str:
    """What a learner does once per run or after each round, outside the round's own time."""
    text = ""
    if "install_s" in split:
        text += (
            f" After the round a learner writes the merged state into its flat buffers in "
            f"{1e3 * split['install_s']:.0f} ms (not part of the round)."
        )
    if "populate_s" in split:
        text += (
            f" Each learner mapped the object store's memory once before the rounds measured "
            f"({split['populate_s']:.2f} s; in training, in the K steps after its first round), each shard after "
            f"its first merge ({split.get('shard_populate_s', float('nan')):.2f} s): without it, every "
            "round of a run's first ones pays a page fault per 4 KiB it puts or reads "
            "(raytrain_seq/runtime/store_memory.py)."
        )
    return text


def plot(res: dict):
    fig, (a1, a2) = new_figure(2)
    for r in res["ks"]:
        label = "K=epoch" if r["k"] < 0 else f"K={r['k']}"
        a1.plot(
            [h["time_s"] for h in r["history"]],
            [100 * h["accuracy"] for h in r["history"]],
            "o-",
            label=label,
        )
    if res["ddp"] is not None:
        h = res["ddp"]["history"]
        a1.plot([e["time_s"] for e in h], [100 * e["accuracy"] for e in h], "s--", color="black", label="DDP")
    a1.set_xlabel("learner seconds")
    a1.set_ylabel("validation accuracy %")
    a1.legend(fontsize=7)
    names = ["epoch" if r["k"] < 0 else str(r["k"]) for r in res["ks"]]
    a2.bar(names, [100 * (r["share"] or 0) for r in res["ks"]], color="#1f77b4")
    a2.set_xlabel("K")
    a2.set_title("time spent averaging, % of the learners'")
    fig.suptitle("AAVG on the synthetic set, 2 learners")
    return fig


def store_gb(megabytes: float, learners: int = 8) -> float:
    """The preallocated object store of the bench's cluster (``run.object_store_gb``): a round of
    ``learners`` through the store holds their slices and the merged ones (about 2 payloads each), and
    the channels they link after it one more payload each (their channels to the shards) and two for the
    shards' (two buffers of a slice each), with a tenth to spare: 2.9 GB for 8 learners of 100 MB."""
    return max(1.0, round(1.1 * (3 * learners + 2) * megabytes / 1e3, 1))


def other_vs_numpy(band: dict) -> float | None:
    """The round of 2 through the other transport against numpy's passes timed beside it (else the run's
    numpy median)."""
    other_s = band.get("other_round_s")
    if not other_s:
        return None
    return (band.get("other_numpy_s") or band["seconds"]["numpy"]) / other_s


def bandwidth_headline(band: dict) -> dict:
    """The JSON line of ``--only bandwidth --json`` (names as issue 12 asks for them)."""
    mbps = band["mbps"]
    return {
        "actor_mb_s": mbps["actor"],
        "numpy_mb_s": mbps["numpy"],
        "library_mb_s": mbps["library"],
        "actor_vs_numpy": mbps["actor"] / mbps["numpy"],
        # The same round against numpy's fastest pass (the statistic of this line before the passes were
        # interleaved with the rounds): a stricter reference, kept beside the like-for-like one.
        "numpy_best_mb_s": mbps["numpy_best"],
        "actor_vs_numpy_best": mbps["actor"] / mbps["numpy_best"],
        "numpy_faults_per_pass": band["reference_faults"]["numpy"],
        "round_s": band["round_s"],
        # The same rounds timed by the driver: with its dispatch of each round and the learners' replies.
        "round_s_driver": {n: band["split_s"].get(n, {}).get("driver_round_s") for n in band["round_s"]},
        "round_s_2_by_tensors": band.get("round_s_2_by_tensors"),
        "hub_load": band["hub_load"],
        "hub_load_star": band["hub_load_star"],
        "split_s": band["split_s"],
        "shards": band["shards"],
        "payload_mb_per_learner": band["payload_mb"],
        "object_store_gb": band.get("object_store_gb"),
        # The round of 2's copies and merge without Ray (the same processes, numpy alone), and its ratio to
        # numpy's mean: what the round would cost if Ray's part were free.
        "floor_s_2": band.get("floor_s", {}).get("total"),
        "floor_vs_numpy": band["floor_s"]["total"] / band["seconds"]["numpy"]
        if band.get("floor_s")
        else None,
        # Which transport the rounds above went through (a run's default), and the round of 2 through the
        # other one, against numpy passes timed beside it.
        "transport": band.get("transport"),
        "other": {
            "transport": "object store" if band.get("transport") == "channels" else "channels",
            "round_s_2": band.get("other_round_s"),
            "vs_numpy": other_vs_numpy(band),
        },
    }


def only_bandwidth(args) -> dict:
    """The data plane's rounds for 1, 2, 4, 8 learners on a local Ray cluster (no training runs)."""
    import json

    import ray

    from raytrain_seq.runtime.connect import store_options

    megabytes = SIZES[args.size]["mb"]
    default = {}
    # The data plane as `run.object_store_gb` sets it up (a preallocated store: the figures), then one
    # round of 2 learners on Ray's default store (mapped as objects come), to show what that costs.
    for gb in (store_gb(megabytes), None):
        options = store_options(gb)
        ray.init(address="local", num_cpus=2, namespace=NAMESPACE, include_dashboard=False, log_to_driver=False, **options)  # fmt: skip
        logging.getLogger("ray").setLevel(logging.WARNING)
        try:
            if gb is not None:
                band = bandwidth(megabytes)
                band["object_store_gb"] = gb
            else:
                default = bandwidth(megabytes, learners=(2,), star=(), many_tensors=None, other=False)
        finally:
            ray.shutdown()
    head = bandwidth_headline(band)
    head["default_store"] = {
        "round_s_2": default["round_s"]["2"],
        "actor_vs_numpy": default["seconds"]["numpy"] / default["round_s"]["2"],
    }
    for n, seconds in head["round_s"].items():
        print(
            f"{n} learner(s): round {seconds:.3f} s, busiest actor {head['hub_load'][n]:.2f} payloads",
            flush=True,
        )
    if args.json:
        print(json.dumps(head), flush=True)
    return head


def only_ablation(args, argv: list[str] | None) -> dict:
    """AAVG1..3 under both batch rules from scratch and warm over seeds, AAVG4 and the fusion
    (``bench/ablation.py``); writes the ``averaging_ablation`` result and, with ``--json``, prints its
    headline as the last line."""
    import json

    res = ablation.run(args.size, args.seeds)
    kept = Path(tempfile.mkstemp(prefix="ablation-", suffix=".json")[1])
    kept.write_text(json.dumps(res, default=str))  # the raw runs, should the tables below fail
    print(f"raw ablation results: {kept}", flush=True)
    head = ablation.headline(res)
    extra = ablation.tables(res)
    _, header, rows = extra[0]
    result = Result(
        name="averaging_ablation",
        title="AAVG ablation at equal steps: AAVG1..3 under both batch rules, AAVG4 and two streams "
        "(`bench/averaging.py --only ablation`)",
        command=command_line(argv, "averaging.py"),
        size=args.size,
        header=header,
        rows=rows,
        notes=ablation.notes(res),
        verdicts=ablation.verdicts(res),
        headline=ablation.report_headline(res),
        extra_tables=extra[1:],
    )
    write_results(result, args.results)
    if args.json:
        print(json.dumps(head), flush=True)
    return head


def main(argv: list[str] | None = None) -> dict:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.only == "bandwidth":
        return only_bandwidth(args)
    if args.only == "ablation":
        if args.seeds is not None and len(set(args.seeds)) < 2:
            parser.error(f"--seeds needs two distinct seeds or more (a standard error), got {args.seeds}")
        return only_ablation(args, argv)
    _check_sizes(parser, args)
    res = run(args)
    _derive(res, args)
    _write(res, args, argv)
    return res


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_size_flags(parser)
    parser.add_argument("--videos", type=int, default=None)
    parser.add_argument("--epochs", type=int, default=None)
    parser.add_argument("--batch", type=int, default=None, help="blocks per learner step")
    parser.add_argument("--ks", type=int, nargs="+", default=None, help="K values (must include -1)")
    parser.add_argument("--seed", type=int, default=0, help="data.seed of every run: the videos, plans, init")
    parser.add_argument(
        "--seeds",
        type=int,
        nargs="+",
        default=None,
        help="--only ablation: its seeds (>= 2; default: by size)",
    )
    parser.add_argument("--cost-learners", type=int, default=16)
    parser.add_argument(
        "--cost-batch", type=int, default=32, help="per-learner batch of the DDP ring estimate"
    )
    parser.add_argument(
        "--only",
        choices=["bandwidth", "ablation"],
        default=None,
        help="bandwidth: only the data plane's rounds (no training); ablation: AAVG1..4 at equal steps",
    )
    parser.add_argument(
        "--json", action="store_true", help="print the headline numbers as one JSON last line"
    )
    return parser


def _check_sizes(parser: argparse.ArgumentParser, args) -> None:
    """Bad sizes stop here, before any run (parser.error exits with the flag and its bound)."""
    if args.ks is not None and (-1 not in args.ks or any(k < 1 and k != -1 for k in args.ks)):
        parser.error(
            f"--ks must be -1 or ints >= 1 and include -1 (AAVG3 and the DDP reference), got {args.ks}"
        )
    for name in ("videos", "epochs", "batch"):
        value = getattr(args, name)
        if value is not None and value < (10 if name == "videos" else 1):
            parser.error(
                f"--{name} must be >= {10 if name == 'videos' else 1} (videos: one per class), got {value}"
            )


def _derive(res: dict, args) -> None:
    """What the tables and verdicts read beside the runs: the test set's size, the cost model, the target
    accuracy and each run's time to it, the job's payload."""
    res["test_videos"] = len(
        LocalData(
            Config.from_preset("demo", max_videos=res["size"]["videos"], seed=res["size"]["seed"])
        ).catalogs["test"]
    )
    steps = math.ceil(9537 / (args.cost_learners * args.cost_batch))  # UCF101 split-1 train videos
    res["cost_steps"], res["cost_learners"] = steps, args.cost_learners
    mean_gbps = res["bandwidth"]["mbps"]["library"] / 1e3
    res["cost"] = [
        {"nic": nic, **cost_model(args.cost_learners, RESNET152_PARAMS, nic, mean_gbps, steps=steps)}
        for nic in (10, 25, 100)
    ]
    if res["ddp"] is not None:
        best = [res["aavg"]["best_val"], res["ddp"]["best_val"]]
        res["target"] = min(b for b in best if b is not None) if all(b is not None for b in best) else None
        res["t_aavg"] = (
            time_to_reach(res["aavg"]["history"], res["target"]) if res["target"] is not None else None
        )
        res["t_ddp"] = (
            time_to_reach(res["ddp"]["history"], res["target"]) if res["target"] is not None else None
        )
    config = Config.from_preset("demo")
    from raytrain_seq.models.factory import build_model_for

    model = build_model_for(config.model, num_classes=10, in_channels=3)
    res["job_payload_mb"] = 3 * sum(p.numel() for p in model.parameters()) * 4 / 1e6


def _write(res: dict, args, argv: list[str] | None) -> None:
    """The averaging result: its tables, notes and verdicts, in bench/results (or --results)."""
    mean_gbps = res["bandwidth"]["mbps"]["library"] / 1e3
    steps = res["cost_steps"]
    extra = tables(res, args)
    _, header, rows = extra[0]
    lines, head = verdicts(res)
    s = res["size"]
    notes = [
        f"{s['videos']} training videos, val and test up to as many, {s['epochs']} epochs, seed {s['seed']}, 2 learners of 1 CPU "
        f"thread each on a local Ray cluster (num_cpus=4), {s['batch']} block(s) a step ({res['steps']} steps per "
        "epoch per learner), the demo model and learning rate; every run is `raytrain_seq.runtime.driver.run` "
        "except the DDP peer (a bench-local Ray Train loop over the same feed, model and InnerStep).",
        "Time to accuracy: the learners' clock (from the first join; DDP: from its loop's start) when the model "
        "that scored it existed: AAVG's averaged round (its validation runs off the learners' path and lands "
        "later), DDP's epoch end (its rank 0 scores inline, which delays the epochs after it).",
        "Learner seconds exclude Ray Train's worker start; 'averaging share' = the learners' mean time inside "
        "averager calls / their wall time (RunSummary.seconds).",
        f"Cost model: S = 60.2M x 4 B x 3 (weights + 2 Adam moments); averager round = 2 P S / B_nic + P S / B_mean "
        f"with B_mean = this machine's library arithmetic ({1e3 * mean_gbps:,.0f} MB/s, one round of 2 learners); DDP ring = steps x 2 (P-1)/P x "
        f"(60.2M x 4 B) / B_nic, {steps} steps = ceil(9537 UCF101 videos / ({args.cost_learners} x {args.cost_batch})).",
    ]
    result = Result(
        name="averaging",
        title="AAVG: averaging interval, DDP peer and the averager's cost (`bench/averaging.py`)",
        command=command_line(argv, "averaging.py"),
        size=args.size,
        header=header,
        rows=rows,
        notes=notes,
        verdicts=lines,
        headline=head,
        extra_tables=extra[1:],
    )
    write_results(result, args.results, try_plot(plot, res))


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    main()
