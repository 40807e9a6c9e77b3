"""Micro-batch streaming vs one plain forward/backward: step time, gradient agreement, and memory.

For mini-batch sizes 16, 32, ... (powers of 2) of 3x32x32 images through a small CNN, each row times
``accumulate`` with a fixed micro-batch (16 rows) against one plain forward/backward of the whole
batch (median of several repeats after warm-up), and prints the time ratio, the overhead in percent
and the largest per-parameter relative difference between the two gradients. On CUDA it also prints
the peak memory of both, the size ``micro_batch_size='auto'`` settles on, and, with
``--memory-fraction F`` (``torch.cuda.set_per_process_memory_fraction``), the sizes where plain
training runs out of memory while streaming still runs. Imports torch and raytrain_seq.microbatch only
(no ray), so it runs on a bare GPU machine:

    python bench/microbatch.py                      # CPU: sizes 16..256, about half a minute
    python bench/microbatch.py --full               # CUDA: sizes 16..16384 (default there 16..1024)
    python bench/microbatch.py --memory-fraction 0.01 --full
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from raytrain_seq.microbatch import MicroBatchSizer, accumulate


def small_cnn(width: int) -> nn.Module:
    """Three conv layers and a linear head; no BatchNorm, so streaming must give the exact gradient."""
    return nn.Sequential(
        nn.Conv2d(3, width, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(width, 2 * width, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(2 * width, 4 * width, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(4 * width, 10),
    )


def loss_fn(model: nn.Module, mb: dict[str, torch.Tensor]):
    return F.cross_entropy(model(mb["x"]), mb["y"], reduction="sum"), mb["x"].shape[0]


def plain_step(model: nn.Module, batch: dict[str, torch.Tensor], device: torch.device) -> float:
    """The baseline: the whole mini-batch on the device at once, one forward and one backward."""
    model.zero_grad(set_to_none=True)
    x, y = batch["x"].to(device), batch["y"].to(device)
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    return loss.item()


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fns: dict, device: torch.device, warmup: int, repeats: int) -> dict[str, float | None]:
    """Median seconds of each ``fns[name]()`` after warm-up, the calls interleaved so that load on a
    shared machine hits every contender alike; None for one that runs out of device memory."""
    times: dict[str, list[float] | None] = {name: [] for name in fns}
    for rep in range(warmup + repeats):
        for name, fn in fns.items():
            if times[name] is None:
                continue
            try:
                sync(device)
                start = time.perf_counter()
                fn()
                sync(device)
            except torch.cuda.OutOfMemoryError:
                times[name] = None
            else:
                if rep >= warmup:
                    times[name].append(time.perf_counter() - start)
                continue
            # Outside the except block, so the failed step's tensors are released before emptying.
            torch.cuda.empty_cache()
    return {name: None if t is None else statistics.median(t) for name, t in times.items()}


def grads(model: nn.Module) -> list[torch.Tensor]:
    return [p.grad.detach().clone() for p in model.parameters()]


def rel_diffs(a: list[torch.Tensor], b: list[torch.Tensor]) -> tuple[float, float]:
    """Relative gradient difference over all parameters at once, and the largest per parameter."""
    flat_a, flat_b = torch.cat([x.reshape(-1) for x in a]), torch.cat([y.reshape(-1) for y in b])
    whole = float((flat_a - flat_b).norm() / flat_b.norm())
    worst = max(float((x - y).norm() / y.norm().clamp_min(1e-30)) for x, y in zip(a, b, strict=True))
    return whole, worst


def peak_mib(fn, device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    torch.cuda.reset_peak_memory_stats(device)
    try:
        fn()
    except torch.cuda.OutOfMemoryError:
        failed = True
    else:
        failed = False
    if failed:
        torch.cuda.empty_cache()
        return None
    return torch.cuda.max_memory_allocated(device) / 2**20


def fmt(value: float | None, spec: str, missing: str = "OOM") -> str:
    return missing if value is None else format(value, spec)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--micro", type=int, default=16, help="micro-batch size (rows)")
    parser.add_argument("--max-size", type=int, default=None, help="largest mini-batch (default: see --full)")
    parser.add_argument("--full", action="store_true", help="larger sizes: up to 16384 on CUDA, 1024 on CPU")
    parser.add_argument("--width", type=int, default=16, help="channels of the first conv layer")
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--memory-fraction", type=float, default=None, help="CUDA only: cap device memory")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--threads", type=int, default=1, help="CPU threads (default 1: steady timings on a shared machine)"
    )
    args = parser.parse_args()

    device = torch.device(args.device)
    cuda = device.type == "cuda"
    if not cuda:
        torch.set_num_threads(args.threads)
    if cuda and not torch.cuda.is_available():
        parser.error("--device cuda but CUDA is not available")
    default_max = (16384 if args.full else 1024) if cuda else (1024 if args.full else 256)
    max_size = args.max_size or default_max
    sizes = [2**k for k in range(4, 31) if 2**k <= max_size]

    print(f"micro-batch streaming: torch {torch.__version__}, device {device}", end="")
    print(f" ({torch.cuda.get_device_name(device)})" if cuda else f", {torch.get_num_threads()} threads")
    print(
        f"small CNN width {args.width} on 3x32x32, float32, micro-batch {args.micro}, median of {args.repeats}"
    )
    if cuda and args.memory_fraction is not None:
        torch.cuda.set_per_process_memory_fraction(args.memory_fraction, device)
        total = torch.cuda.get_device_properties(device).total_memory / 2**30
        print(f"device memory capped at {args.memory_fraction:g} of {total:.1f} GiB")
    elif not cuda:
        print("the memory part (peak memory, --memory-fraction, plain training running out) needs a GPU")

    torch.manual_seed(args.seed)
    model = small_cnn(args.width).to(device)
    sizer = MicroBatchSizer()
    head = f"{'batch':>6} {'plain ms':>9} {'stream ms':>10} {'ratio':>6} {'overhead':>9} {'grad diff':>10} {'max per param':>13}"
    if cuda:
        head += f" {'plain MiB':>10} {'stream MiB':>11} {'auto size':>10}"
    print(head)
    ratios: list[float] = []
    ran: dict[str, list[int]] = {"plain": [], "stream": []}
    for size in sizes:
        gen = torch.Generator().manual_seed(args.seed + size)
        batch = {
            "x": torch.randn(size, 3, 32, 32, generator=gen),
            "y": torch.randint(0, 10, (size,), generator=gen),
        }

        def stream(batch=batch) -> float:
            return accumulate(model, batch, loss_fn, micro_batch_size=args.micro, device=device)

        def plain(batch=batch) -> float:
            return plain_step(model, batch, device)

        # Plain runs last in each round, so after timing model.grad holds its gradient; then one more
        # streamed step gives the gradient to compare with.
        t = timed({"stream": stream, "plain": plain}, device, args.warmup, args.repeats)
        t_plain, t_stream = t["plain"], t["stream"]
        g_plain = grads(model) if t_plain is not None else None
        g_stream = None
        if t_stream is not None:
            stream()
            g_stream = grads(model)
        both = g_plain is not None and g_stream is not None
        diff, worst = rel_diffs(g_stream, g_plain) if both else (None, None)
        ratio = t_stream / t_plain if t_plain is not None and t_stream is not None else None
        if ratio is not None:
            ratios.append(ratio)
        for name, took in (("plain", t_plain), ("stream", t_stream)):
            if took is not None:
                ran[name].append(size)
        row = (
            f"{size:>6} {fmt(t_plain and t_plain * 1e3, '9.1f'):>9} {fmt(t_stream and t_stream * 1e3, '10.1f'):>10}"
            f" {fmt(ratio, '6.2f', 'n/a'):>6} {fmt(ratio and (ratio - 1) * 100, '+8.1f', 'n/a'):>8}%"
            f" {fmt(diff, '10.1e', 'n/a'):>10} {fmt(worst, '13.1e', 'n/a'):>13}"
        )
        if cuda:
            mib_plain, mib_stream = peak_mib(plain, device), peak_mib(stream, device)
            try:
                accumulate(model, batch, loss_fn, micro_batch_size="auto", device=device, sizer=sizer)
                known = sizer.known(model, batch)
                auto = "whole" if known is None or known >= size else str(known)
            except torch.cuda.OutOfMemoryError:
                auto = "OOM"
            row += f" {fmt(mib_plain, '10.0f'):>10} {fmt(mib_stream, '11.0f'):>11} {auto:>10}"
        print(row, flush=True)
    for name, label in (("plain", "plain forward/backward"), ("stream", "micro-batch streaming")):
        failed = sorted(set(sizes) - set(ran[name]))
        print(
            f"{label}: ran {len(ran[name])} of {len(sizes)} sizes"
            + (f", out of memory at {failed}" if failed else "")
        )
    if ratios:
        print(
            f"stream/plain step time where both ran: median {statistics.median(ratios):.2f}x "
            f"(min {min(ratios):.2f}x, max {max(ratios):.2f}x)"
        )


if __name__ == "__main__":
    main()
