"""A restarted averager serves its learners before torch has loaded.

Contracts pinned: a process whose loop thread may not import torch (an import there fails the test at
once) and whose other threads wait for it (the gate below) restarts from a run folder with a checkpoint
and an events log, takes a learner's flat re-seed (ahead of the checkpoint: adopted; of the checkpoint's
round: its bytes lent, the checkpoint's tensors never read), answers every join, and averages the next
round of flat payloads, whose checkpoint contents and a later join's state it hands out flat. Nothing in
it imports torch (no evaluator here): its TensorBoard records are on disk before the gate opens (the
tracker writes event files itself), and only the gate's control, an import of torch on another thread,
waited at the gate.
"""

from __future__ import annotations

import asyncio
import json
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from averager_fixtures import local_averager
from conftest import adam_learners
from test_tracking import read_events

from raytrain_seq import checkpoint
from raytrain_seq.dataplane.payload import FlatLayout, FlatPayload
from raytrain_seq.dataplane.stores import InProcessShards

# Run in a fresh interpreter: ``torch`` on the loop (main) thread raises; on any other thread it waits
# for the gate, which opens after the scenario. A join that needed torch would fail, not hang.
_CHILD = textwrap.dedent(
    """
    import asyncio, faulthandler, importlib.abc, importlib.machinery, json, pickle, sys, threading
    from pathlib import Path
    faulthandler.dump_traceback_later(150, exit=True)  # a hang prints every thread's stack and fails
    sys.path.insert(0, "tests")
    gate, main, late = threading.Event(), threading.main_thread(), []

    class Gated(importlib.abc.Loader):
        # Waits in exec_module, as a slow import does, holding only that module's lock (a finder runs
        # under the interpreter's global import lock: waiting there would stop every import).
        def __init__(self, loader):
            self.loader = loader

        def create_module(self, spec):
            return self.loader.create_module(spec)

        def exec_module(self, module):
            late.append(threading.current_thread().name)
            gate.wait(120)
            self.loader.exec_module(module)

    class Gate(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name not in ("torch", "tensorboardX"):
                return None
            if threading.current_thread() is main and not gate.is_set():
                raise ImportError(f"the averager's loop thread imported {name}")
            spec = importlib.machinery.PathFinder.find_spec(name, path)
            spec.loader = Gated(spec.loader)
            return spec

    sys.meta_path.insert(0, Gate())
    from averager_fixtures import local_averager

    run_dir, inputs = sys.argv[1], pickle.load(open(sys.argv[2], "rb"))

    async def scenario():
        averager = local_averager(2, timeout_s=30.0, run_dir=run_dir, actor_id=lambda: "actor-1",
                                  tracker="tensorboard")
        joins = [await averager.join(n, 2, incarnation=n + "2", seed=inputs["seed"]) for n in "ab"]
        early = sorted(set(late))
        sends = (averager.average(n, inputs["next"], 2, inputs["payloads"][k], None, position=None)
                 for k, n in enumerate("ab"))
        result = (await asyncio.gather(*sends))[0]
        contents, _ = await averager.checkpoint_contents()  # rank 0's next checkpoint: no torch either
        summary = await averager.summary()
        rejoin = await averager.join("a", 2, incarnation="a2")  # a join after that round: no torch either
        return averager, joins, result, summary, early, contents, rejoin

    averager, joins, result, summary, early, contents, rejoin = asyncio.run(asyncio.wait_for(scenario(), 60))
    torch_before = "torch" in sys.modules and sys.modules["torch"] is not None and hasattr(sys.modules["torch"], "Tensor")
    written = sorted(p.stat().st_size for p in Path(run_dir, "tensorboard").glob("events.out.tfevents.*"))
    # The gate's control: an import of torch on another thread waits at the gate (the Gate sees imports).
    control = threading.Thread(target=lambda: __import__("torch"), name="control")
    control.start()
    while "control" not in late and control.is_alive():
        control.join(0.05)
    gate.set()
    control.join(120)
    print(json.dumps({
        "joins": [[j.state.round, j.next_round, j.state.source, j.state.flat is not None] for j in joins],
        "round": result.state.round, "learners": list(result.learners),
        "recoveries": [r["kind"] for r in summary.recoveries],
        "torch_loaded_before_the_gate": torch_before, "waited": sorted(set(late)), "early": early,
        "tensorboard_before_the_gate": written,
        "checkpoint": [contents.round, contents.flat is not None and contents.flat.local],
        "rejoin": [rejoin.state.round, rejoin.state.flat is not None and rejoin.state.flat.local],
    }))
    """
)


def _payload(params, moments, shards: int) -> FlatPayload:
    layout = FlatLayout.of(params, moments)
    buffers, extras = layout.pack(params, moments)
    return FlatPayload(layout, tuple(layout.split(buffers, shards)), extras)


def _restart(tmp_path: Path, checkpointed: int) -> dict:
    """Rounds 1 and 2 in this process (a checkpoint after round ``checkpointed``), then the restart in a
    gated child whose learners rejoin with their round-2 state and send round 3."""
    params, moments = adam_learners(2, width=4)
    run_dir = tmp_path / "run"
    run_dir.mkdir()

    async def rounds():
        first = local_averager(
            2, timeout_s=30.0, run_dir=run_dir, actor_id=lambda: "actor-1", shard_pool=InProcessShards
        )
        replies = [await first.join(n, 2, incarnation=n) for n in "ab"]
        shards = replies[0].shards
        results = []
        for r in (1, 2):
            sends = (
                first.average(n, r, 2, _payload(params[k], moments[k], shards), None)
                for k, n in enumerate("ab")
            )
            results.append((await asyncio.gather(*sends))[0])
            if r == checkpointed:
                state, history = await first.checkpoint_contents()
                assert state.flat is not None and state.flat.local  # a round's state: the learner unpacks it
                state = state.materialise(lambda refs: pytest.fail("its slices are in hand"))
                checkpoint.save(run_dir / checkpoint.folder_name(1), state=state, history=history.as_dict())
        return results, shards

    results, shards = asyncio.run(asyncio.wait_for(rounds(), 30))
    seed = results[-1].state.fetched(lambda refs: pytest.fail("in-process slices are local"))
    inputs = {
        "seed": seed,
        "next": 3,
        "payloads": [_payload(params[k], moments[k], shards) for k in range(2)],
    }
    (tmp_path / "inputs.pkl").write_bytes(pickle.dumps(inputs))
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, str(run_dir), str(tmp_path / "inputs.pkl")],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=Path(__file__).parent.parent,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    report["tensorboard"] = read_events(run_dir / "tensorboard")
    report["tensorboard_sizes"] = sorted(
        p.stat().st_size for p in (run_dir / "tensorboard").glob("events.out.tfevents.*")
    )
    return report


def test_a_restarted_averager_takes_a_newer_reseed_and_averages_the_next_round_before_torch_loads(tmp_path):
    report = _restart(tmp_path, checkpointed=1)
    assert report["joins"] == [[2, 3, "seed", True], [2, 3, "seed", True]]  # adopted, handed on flat
    assert report["round"] == 3 and report["learners"] == ["a", "b"] and report["checkpoint"] == [3, True]
    assert report["rejoin"] == [3, True]  # round 3's state handed on flat: the learner unpacks it
    assert report["recoveries"] == ["averager_restart", "reseeded"]
    assert not report["torch_loaded_before_the_gate"]
    # Nothing here wants torch: no evaluator, the tracker's event files need none (outputs.event_file),
    # the checkpoint's tensors are never read (the seed is newer). Only the gate's control waited.
    assert report["early"] == [] and report["waited"] == ["control"]
    scalars, texts = report["tensorboard"]  # written before the gate opened: the same files, the same sizes
    assert report["tensorboard_before_the_gate"] == report["tensorboard_sizes"] != []
    assert scalars["recoveries/count"] == [(2, 1.0), (2, 2.0)] and len(texts) == 2
    assert [step for step, _ in scalars["train/batch_size"]] == [3]


def test_a_seed_of_the_checkpoints_round_lends_its_bytes_while_the_checkpoint_waits(tmp_path):
    report = _restart(tmp_path, checkpointed=2)
    # The checkpoint's round and source, its tensors the learner's copy (flat): nothing waited for torch.
    assert report["joins"] == [[2, 3, "checkpoint", True], [2, 3, "checkpoint", True]]
    assert report["round"] == 3 and report["learners"] == ["a", "b"]
    assert report["recoveries"] == ["averager_restart"]
    assert not report["torch_loaded_before_the_gate"] and report["waited"] == ["control"]
