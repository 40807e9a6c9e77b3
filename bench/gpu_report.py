"""Issue 40's GPU targets from one ``scripts/gpu_checks.sh`` run: the Ray job beside its limit and baseline.

Reads what the script wrote (each file's JSON last line, the two runs' ``summary.json``) and prints the
targets with the figures behind them, from one machine in one session: the ``ucf101-rgb`` job's useful
frames/s >= 0.8 x one bare learner's (``bench/learner_device.py``) and >= 1.5 x the plain ``DataLoader``
loop's (``bench/dataloader_loop.py``); its validation rounds add <= 10 % to its training wall time; the
demo on the GPU starts in <= 15 s and tests >= 0.90; under a CUDA memory cap the streamed learner trains
B = 576 blocks where staging the whole batch runs out of memory. ``--md`` writes the table as Markdown, ``--json``
prints the figures as one JSON last line. A missing input is reported as not run, never guessed.

    python bench/gpu_report.py --out gpu_out --md gpu_out/job.md --json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

# The job's start-up, step by step (summary.json "timeline", from RunSummary.extra; docs/ARCHITECTURE.md
# "Observability").
STARTUP_MARKS = (
    "connected",
    "actors_started",
    "fit",
    "loop_entered",
    "learner_built",
    "joined",
    "first_step",
)


def last_json(path: Path) -> dict[str, Any] | None:
    """The JSON object on the last line of ``path`` that holds one, or None (no file, no such line)."""
    if not path.is_file():
        return None
    for line in reversed(path.read_text().splitlines()):
        line = line.strip()
        if line.startswith("{") and line.endswith("}"):
            return json.loads(line)
    return None


def summary(path: Path) -> dict[str, Any] | None:
    return json.loads(path.read_text()) if path.is_file() else None


def targets(out: Path) -> list[dict[str, Any]]:
    """One row per target: what, the figure, the bound, met or not (None: not run)."""
    limit = last_json(out / "learner_device.txt")
    capped = last_json(out / "memory_cap.txt")
    loader = last_json(out / "dataloader.txt")
    job = summary(out / "job_ucf101.json")
    demo = summary(out / "job_demo.json")
    rows: list[dict[str, Any]] = []

    def row(what: str, value: float | None, bound: str, met: bool | None, detail: str) -> None:
        rows.append({"target": what, "value": value, "bound": bound, "met": met, "detail": detail})

    job_fps = job["frames_per_second"] if job else None
    if job and limit:
        ratio = job_fps / limit["learner_frames_s"]
        row("job / bare learner", round(ratio, 3), ">= 0.8", ratio >= 0.8,
            f"{job_fps:.0f} useful frames/s (2 learners) vs {limit['learner_frames_s']:.0f}")  # fmt: skip
    else:
        row("job / bare learner", None, ">= 0.8", None, "not run")
    if job and loader:
        ratio = job_fps / loader["frames_s"]
        row("job / DataLoader loop", round(ratio, 3), ">= 1.5", ratio >= 1.5,
            f"{job_fps:.0f} vs {loader['frames_s']:.0f} useful frames/s")  # fmt: skip
    else:
        row("job / DataLoader loop", None, ">= 1.5", None, "not run")
    if job:
        seconds, learner_s = job["seconds"], job.get("learner_seconds") or 0.0
        validation = seconds.get("validation", 0.0)
        share = validation / max(learner_s - validation, 1e-9)
        row("validation added to training", round(share, 4), "<= 0.10", share <= 0.10,
            f"{validation:.1f} s of rank 0's {learner_s:.1f} s; {len(job['val_accuracy_history'])} validations")  # fmt: skip
    else:
        row("validation added to training", None, "<= 0.10", None, "not run")
    if demo:
        startup, accuracy = demo["seconds"]["startup"], demo["test_accuracy"]
        timeline = demo.get("timeline") or {}
        marks = ", ".join(f"{k} {v:.1f}" for k, v in timeline.items() if k in STARTUP_MARKS)
        row("demo start-up (s)", round(startup, 1), "<= 15", startup <= 15,
            f"total {demo['seconds']['total']:.1f} s; s from the driver's start: {marks}")  # fmt: skip
        row("demo test accuracy", accuracy, ">= 0.90", accuracy >= 0.90, f"{demo['rounds']} rounds")
    else:
        row("demo start-up (s)", None, "<= 15", None, "not run")
        row("demo test accuracy", None, ">= 0.90", None, "not run")
    if capped:
        cap = capped["memory_cap"]
        streamed, whole = cap["streamed"], cap["whole batch"]
        met = streamed["trained"] and not whole["trained"]
        row(f"B={cap['batch_size']} under a {cap['cap_gib']} GiB cap", None, "streamed trains, whole OOMs", met,
            f"streamed: {streamed}; whole batch: {whole}")  # fmt: skip
    else:
        row("B=576 under a memory cap", None, "streamed trains, whole OOMs", None, "not run")
    real_video_rows(summary(out / "job_real.json"), limit, row)
    return rows


def real_video_rows(job: dict[str, Any] | None, limit: dict[str, Any] | None, row) -> None:
    """The real-footage job (gpu_checks.sh's real_video step): its rate over the bare learner's, and
    the feed's CPU per kept frame with the CPUs a learner needs at the job's rate."""
    if not job or not limit:
        row("real-video job / bare learner", None, ">= 0.8", None, "not run")
        return
    fps = job["frames_per_second"]
    ratio = fps / limit["learner_frames_s"]
    feed = job.get("feed") or {}
    warm = feed.get("cpu_s_per_kept_frame_warm")
    wait = feed.get("learner_wait_s", 0.0)
    per_learner = fps / max(job["learners"], 1)
    needs = f"; {per_learner * warm:.2f} feed CPUs a learner" if warm else ""
    row("real-video job / bare learner", round(ratio, 3), ">= 0.8", ratio >= 0.8,
        f"{fps:.0f} vs {limit['learner_frames_s']:.0f} useful frames/s; learners waited {wait:.1f} s{needs}")  # fmt: skip


def markdown(rows: list[dict[str, Any]], device: str) -> str:
    lines = [f"## The Ray job on the GPU ({device})", "", "| target | figure | bound | met | behind it |",
             "|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        met = {True: "yes", False: "**no**", None: "not run"}[r["met"]]
        value = "" if r["value"] is None else r["value"]
        lines.append(f"| {r['target']} | {value} | {r['bound']} | {met} | {r['detail']} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("gpu_out"), help="the folder gpu_checks.sh wrote")
    parser.add_argument("--md", type=Path, default=None, help="write the table as Markdown here")
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON last line")
    args = parser.parse_args(argv)
    if not args.out.is_dir():
        parser.error(f"--out {args.out} is not a folder: run scripts/gpu_checks.sh first")
    rows = targets(args.out)
    device = (last_json(args.out / "learner_device.txt") or {}).get("device", "a GPU")
    text = markdown(rows, device)
    print(text)
    if args.md is not None:
        args.md.parent.mkdir(parents=True, exist_ok=True)
        args.md.write_text(text)
    if args.json:
        print(json.dumps({"device": device, "targets": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
