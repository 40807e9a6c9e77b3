"""Decoder backends' rates: kept frames per CPU-second of ``video.decode`` with each backend, one thread.

What ``data.decoders.PREFERENCE`` (the order ``--decoder auto`` picks in) rests on. For each backend,
codec and stride, ``video.decode(path, stride=s, size=size, threads=1, decoder=backend)`` runs over every
clip of that codec (what a feed task's decode pays), timed by this process's CPU clock with OpenMP and
OpenCV at one thread; each case runs ``repeats`` times and the cheapest is kept.

    python bench/decoder_rates.py --encode SRC.mp4 [--json]     # SRC re-encoded to 320x240 .avi and .mp4
    python bench/decoder_rates.py CLIP.avi CLIP.mp4 [--backends pyav opencv] [--strides 1 8] [--json]

``--encode`` needs PyAV (MPEG-4 Part 2 in ``.avi``, H.264 in ``.mp4``). ``measure`` is what other
benches call.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # before numpy and OpenCV load their thread pools

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Sequence
from fractions import Fraction
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from raytrain_seq.data import decoders, video  # noqa: E402

KEYS = ("backend", "version", "codec", "stride", "kept_frames", "cpu_s", "frames_per_cpu_s")


def codec_of(path: str | os.PathLike[str]) -> str:
    """The codec of ``path``'s first video stream: FFmpeg's name with PyAV ("mpeg4", "h264"), else the
    FourCC OpenCV reports ("FMP4", "avc1")."""
    if decoders.available("pyav"):
        import av

        with av.open(os.fspath(path)) as container:
            return container.streams.video[0].codec_context.name
    import cv2

    capture = cv2.VideoCapture(os.fspath(path), cv2.CAP_FFMPEG)
    fourcc = int(capture.get(cv2.CAP_PROP_FOURCC))
    capture.release()
    return "".join(chr((fourcc >> (8 * k)) & 0xFF) for k in range(4)).strip() or "unknown"


def _one_thread() -> None:
    if decoders.available("opencv"):
        import cv2

        cv2.setNumThreads(1)


def measure(
    paths: Sequence[str | os.PathLike[str]],
    backends: Sequence[str] | None = None,
    strides: Sequence[int] = (1, 8),
    size: int = 128,
    repeats: int = 3,
) -> list[dict[str, Any]]:
    """One row per (backend, codec, stride): ``{"backend", "version", "codec", "stride", "kept_frames",
    "cpu_s", "frames_per_cpu_s", "videos"}``.

    ``paths``: the clips (grouped by their codec, ``codec_of``); ``backends``: names of
    ``data.decoders.BACKENDS`` (None: every installed one; a missing one raises ImportError naming its
    ``pip install``); ``size``: the short side decoded to. ``kept_frames`` and ``cpu_s`` are summed over the
    clips of the codec, ``cpu_s`` from the cheapest of ``repeats`` runs, all with one decoder thread.
    """
    _one_thread()
    names = list(decoders.installed() if backends is None else backends)
    by_codec: dict[str, list[str]] = {}
    for path in paths:
        by_codec.setdefault(codec_of(path), []).append(os.fspath(path))
    rows = []
    for name in names:
        version = decoders.version(name)
        for codec, clips in by_codec.items():
            for stride in strides:
                kept, best = 0, float("inf")
                for _ in range(max(1, repeats)):
                    began, kept = time.process_time(), 0
                    for clip in clips:
                        kept += len(video.decode(clip, stride=stride, size=size, threads=1, decoder=name))
                    best = min(best, time.process_time() - began)
                rows.append({
                    "backend": name, "version": version, "codec": codec, "stride": int(stride),
                    "kept_frames": kept, "cpu_s": round(best, 4),
                    "frames_per_cpu_s": round(kept / best, 1) if best > 0 else float("inf"),
                    "videos": len(clips),
                })  # fmt: skip
    return rows


def encode_footage(source: str | os.PathLike[str], folder: str | os.PathLike[str]) -> list[Path]:
    """``source`` re-encoded with PyAV at 320x240, 25 fps: ``clip.avi`` (MPEG-4 Part 2, as UCF101) and
    ``clip.mp4`` (libx264), in ``folder``."""
    import av

    out = []
    for name, codec in (("clip.avi", "mpeg4"), ("clip.mp4", "libx264")):
        target = Path(folder) / name
        with av.open(os.fspath(source)) as src, av.open(str(target), "w") as dst:
            stream = dst.add_stream(codec, rate=25)
            stream.width, stream.height, stream.pix_fmt = 320, 240, "yuv420p"
            if codec == "mpeg4":
                stream.bit_rate = 1_500_000
            for index, frame in enumerate(src.decode(video=0)):
                scaled = frame.reformat(width=320, height=240, format="yuv420p", interpolation="AREA")
                scaled.pts, scaled.time_base = index, Fraction(1, 25)
                dst.mux(stream.encode(scaled))
            dst.mux(stream.encode())
        out.append(target)
    return out


def table(rows: list[dict[str, Any]]) -> str:
    """A markdown table: one line per backend, one column per (codec, stride)."""
    columns = sorted({(r["codec"], r["stride"]) for r in rows})
    head = "| backend | " + " | ".join(f"{c} stride {s}" for c, s in columns) + " |"
    lines = [head, "|---|" + "---:|" * len(columns)]
    for name in dict.fromkeys(r["backend"] for r in rows):
        rate = {(r["codec"], r["stride"]): r["frames_per_cpu_s"] for r in rows if r["backend"] == name}
        version = next(r["version"] for r in rows if r["backend"] == name)
        cells = " | ".join(f"{rate[c]:,.0f}" if c in rate else "" for c in columns)
        lines.append(f"| {name} {version} | {cells} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("clips", nargs="*", help="video files to decode (or --encode SRC)")
    parser.add_argument(
        "--encode", metavar="SRC", help="re-encode SRC to 320x240 .avi and .mp4 and use those"
    )
    parser.add_argument(
        "--backends", nargs="+", choices=decoders.BACKENDS, help="default: every installed one"
    )
    parser.add_argument("--strides", nargs="+", type=int, default=[1, 8])
    parser.add_argument("--size", type=int, default=128, help="short side decoded to [default 128]")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", action="store_true", help="the rows as one JSON last line")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as scratch:
        clips = list(args.clips) + (encode_footage(args.encode, scratch) if args.encode else [])
        if not clips:
            parser.error("give video files, or --encode SRC")
        rows = measure(clips, args.backends, args.strides, args.size, args.repeats)
    print(f"kept frames per CPU-second, one thread, short side {args.size} (decode + resize + RGB)")
    print(table(rows))
    print("auto picks:", decoders.resolve("auto"), f"(preference {', '.join(decoders.PREFERENCE)})")
    if args.json:
        print(json.dumps({"decoders": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
