"""Real video through the whole job: sources, flow, transfer and fusion on a miniature UCF101.

Fast tests (no Ray) pin the pieces: length fitting, the flow flip in block assembly, the validation
hold-out and the class-balanced subset, flow of consecutive-frame pairs, the real source's handling of
a lying header and of a video that fails to decode, catalog selection, and the model factory's
``init_from``. The Ray tests (one local cluster for the module) run jobs/ucf101.py three times on the
miniature set, as the README tells a user to: rgb -> flow with --init-from -> fuse.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from video_fixtures import (
    frame_indices,
    make_mini_hmdb51,
    make_mini_ucf101,
    plant_corrupt,
    plant_header_frames,
    plant_truncated,
    ramp_frames,
    write_video,
)

from raytrain_seq import checkpoint
from raytrain_seq.algorithms.augment import resize_video
from raytrain_seq.config import Config, RunSetupError
from raytrain_seq.data.flow import FLOW_BOUND, compute_flow, dequantize, flow_method, pair_flow
from raytrain_seq.data.geometry import load_catalogs
from raytrain_seq.data.sources import RealVideos, fit_length, flow_offset, get_source, source_kwargs
from raytrain_seq.data.splits import balanced_subset, holdout
from raytrain_seq.data.task_bodies import flow_videos, window_videos
from raytrain_seq.data.video import decode, decode_pairs
from raytrain_seq.models import build_model
from raytrain_seq.models.factory import build_model_for, load_run_state
from raytrain_seq.outputs.summary import RunSummary, format_table
from raytrain_seq.parts import Parts
from raytrain_seq.rounds.state import AveragedState
from raytrain_seq.rows.assembly import RowFormat, assemble_rows
from raytrain_seq.seeds import final_rng, partial_rng

ROOT = Path(__file__).resolve().parents[1]
SIZE = 20


@pytest.fixture(scope="module")
def mini(tmp_path_factory):
    """Mini UCF101 (3 classes x 6 groups x 2 clips); fold 1 has a corrupt, a truncated and a lying video."""
    ds = make_mini_ucf101(tmp_path_factory.mktemp("ucf"))
    bad = {
        "corrupt": ds.path(ds.train[1][0]),  # unreadable: skipped at catalog time
        "truncated": ds.path(ds.train[1][5]),  # header fine, no frame decodes: zero clip in the task
        "lying": ds.path(ds.test[1][1]),  # header says 30 frames, the file has fewer
    }
    plant_corrupt(bad["corrupt"])
    plant_truncated(bad["truncated"])
    plant_header_frames(bad["lying"], 30)
    ds.bad = bad
    return ds


def _config(ds, **overrides) -> Config:
    base = dict(dataset="ucf101", data_root=str(ds.root), stride=2, cache_size=SIZE, crop=16, run_name="x")
    return Config.from_preset(None, **{**base, **overrides})


# ------------------------------------------------------------------------------------------ pure pieces
def test_fit_length_cuts_or_repeats_the_last_frame():
    """fit_length(frames, n): the first n frames, or all of them then the last one repeated up to n."""
    frames = np.arange(5)[:, None, None, None].astype(np.uint8) * np.ones((5, 2, 2, 1), np.uint8)
    assert fit_length(frames, 7)[:, 0, 0, 0].tolist() == [0, 1, 2, 3, 4, 4, 4]
    assert fit_length(frames, 3)[:, 0, 0, 0].tolist() == [0, 1, 2]
    assert np.array_equal(fit_length(frames, 5), frames)
    with pytest.raises(ValueError, match="catalog length"):
        fit_length(frames, 0)


def test_block_assembly_negates_x_flow_when_it_flips():
    """A 2-channel (flow) sequence flipped in block assembly gets u -> 255 - u; v and RGB only mirror."""
    rng = np.random.default_rng(3)
    video = rng.integers(0, 256, (4, 8, 8, 2), dtype=np.uint8)
    batch = {
        "block": np.array([0]), "ids": np.array([[7]]), "starts": np.array([[0]]), "lengths": np.array([[4]]),
        "offsets": np.array([[0]]), "labels": np.array([[1]]), "num_sequences": np.array([1]),
        "plan_index": np.array([0]), "weight": np.array([1.0], np.float32),
    }  # fmt: skip
    # Epochs whose seeded final augmentation flips / keeps (full-frame crop, so only the flip varies).
    flips = {e: _flips(final_rng(0, e, 0, 0)) for e in range(20)}
    epoch, kept = min(e for e in flips if flips[e]), min(e for e in flips if not flips[e])
    unflipped = assemble_rows(batch, {7: video}, RowFormat("train", kept, 0, 4, 1, 8, 2, False))["frames"][0]
    assert np.array_equal(unflipped, video)  # no flip: flow passes untouched
    row = assemble_rows(batch, {7: video}, RowFormat("train", epoch, 0, 4, 1, 8, 2, False))["frames"][0]
    mirrored = video[:, :, ::-1]
    assert np.array_equal(row[..., 0], 255 - mirrored[..., 0])
    assert np.array_equal(row[..., 1], mirrored[..., 1])
    # In flow units (dequantised) the x component is exactly negated, the y component unchanged.
    assert np.allclose(dequantize(row[..., 0]), -dequantize(mirrored[..., 0]), atol=1e-5)
    rgb = np.repeat(video[..., :1], 3, axis=3)
    out = assemble_rows(batch, {7: rgb}, RowFormat("train", epoch, 0, 4, 1, 8, 3, False))["frames"][0]
    assert np.array_equal(out, rgb[:, :, ::-1])  # images are mirrored, never negated


def _flips(rng: np.random.Generator) -> bool:
    """final_augment's flip decision for an 8x8 crop of an 8x8 frame: its draws are top, left, flip."""
    rng.integers(0, 1)
    rng.integers(0, 1)
    return bool(rng.random() < 0.5)


def test_holdout_takes_whole_groups_and_keeps_every_class_in_training():
    """holdout: per class, whole groups up to max(1, round(f * n)) videos, never all of a class's groups."""
    labels = np.array([0] * 8 + [1] * 6 + [2] * 2)
    groups = [f"g{k // 2}" for k in range(8)] + ["a", "a", "a", "b", "b", "c"] + ["solo", "solo"]
    mask = holdout(labels, groups, 0.1, seed=0)
    keys = np.array(groups)
    for label in (0, 1):
        held = set(keys[mask & (labels == label)])
        kept = set(keys[~mask & (labels == label)])
        assert held and kept and not held & kept  # whole groups, both sides non-empty
    assert (mask & (labels == 0)).sum() == 2  # target max(1, round(0.8)) = 1 -> one group of 2
    assert not mask[labels == 2].any()  # one group only: nothing to hold out
    half = holdout(labels, groups, 0.5, seed=0)
    assert (half & (labels == 0)).sum() == 4  # target 4 -> two groups of 2
    others = [holdout(labels, groups, 0.1, seed=s) for s in range(1, 8)]
    assert any(not np.array_equal(mask, o) for o in others)  # the seed picks the groups


def test_balanced_subset_deals_round_robin_over_classes():
    """balanced_subset: the docstring example, class counts within one, all when the limit is None."""
    labels = np.array([0, 0, 0, 1, 2, 2])
    picked = balanced_subset(labels, 4, seed=0)
    assert sorted(labels[picked].tolist()) == [0, 0, 1, 2]
    assert np.array_equal(picked, np.sort(picked))
    many = np.repeat(np.arange(5), 20)
    counts = np.bincount(many[balanced_subset(many, 23, seed=1)], minlength=5)
    assert counts.sum() == 23 and counts.max() - counts.min() <= 1
    assert np.array_equal(balanced_subset(labels, None, seed=0), np.arange(6))


def test_decode_pairs_gives_each_kept_frame_its_successor(tmp_path):
    """decode_pairs: stride 5 of 13 frames keeps 0, 5, 10 paired with 1, 6, 11; at the end last=False."""
    path = write_video(tmp_path / "ramp.avi", ramp_frames(13))
    first, second, last = decode_pairs(path, stride=5)
    assert frame_indices(first) == [0, 5, 10] and frame_indices(second) == [1, 6, 11] and last
    assert np.array_equal(first, decode(path, stride=5))
    first, second, last = decode_pairs(path, stride=4)  # keeps 0, 4, 8, 12; 12 is the last frame
    assert frame_indices(first) == [0, 4, 8, 12] and frame_indices(second) == [1, 5, 9, 12] and not last


def test_pair_flow_of_consecutive_frames_equals_compute_flow():
    """pair_flow(frames, frames shifted by one, last=False) is exactly compute_flow(frames)."""
    rng = np.random.default_rng(0)
    base = rng.integers(0, 256, (40, 40), dtype=np.uint8)
    frames = np.stack([np.roll(base, 2 * t, axis=1) for t in range(5)])[..., None].repeat(3, axis=3)
    second = np.concatenate([frames[1:], frames[-1:]])
    expected = compute_flow(frames, method="farneback")
    assert np.array_equal(pair_flow(frames, second, last=False, method="farneback"), expected)
    assert np.median(dequantize(expected[0, 10:30, 10:30, 0])) > 1.0  # real rightward motion was measured
    with_last = pair_flow(frames, second, last=True, method="farneback")
    assert (np.abs(dequantize(with_last[-1, ..., 0])) < 0.2).mean() > 0.9  # (f4, f4): a true zero flow


# ------------------------------------------------------------------------------------- the real source
def test_catalogs_select_classes_hold_out_val_and_list_skipped(mini):
    """load_catalogs: first num_classes classes, val apart from train, max_videos balanced, skipped listed."""
    loaded = load_catalogs(_config(mini, num_classes=2, max_videos=6).data)
    cats = loaded["catalogs"]
    assert loaded["class_names"] == ["ApplyEyeMakeup", "ApplyLipstick"] and loaded["channels"] == 3
    assert loaded["skipped"] == [mini.bad["corrupt"]] and loaded["flow_method"] is None
    assert not set(cats["train"].ids) & set(cats["val"].ids)
    for split, catalog in cats.items():
        assert len(catalog) <= 6 and set(catalog.labels.tolist()) == {0, 1}, split
        assert abs(int((catalog.labels == 0).sum()) - int((catalog.labels == 1).sum())) <= 1
    everything = load_catalogs(_config(mini, stream="flow").data)
    assert everything["channels"] == 2 and everything["flow_method"] == flow_method()
    assert sum(len(c) for c in everything["catalogs"].values()) == len(mini.videos) - 1  # the corrupt one
    with pytest.raises(ValueError, match="num_classes=4 but ucf101"):
        load_catalogs(_config(mini, num_classes=4).data)


def test_bad_split_file_is_a_setup_error_naming_file_and_line(mini, tmp_path):
    """A label out of range in trainlist01.txt stops the run at start: RunSetupError with file:line."""
    import shutil

    root = tmp_path / "ucf"
    shutil.copytree(mini.root / "ucfTrainTestlist", root / "ucfTrainTestlist")
    (root / "UCF-101").mkdir()
    path = root / "ucfTrainTestlist" / "trainlist01.txt"
    lines = path.read_text().splitlines()
    lines[2] = lines[2].rsplit(" ", 1)[0] + " 9"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(RunSetupError, match=r"trainlist01\.txt:3: label 9 is out of range"):
        load_catalogs(_config(mini, data_root=str(root)).data)


def test_source_fits_a_lying_header_and_zero_fills_a_failed_decode(mini):
    """load(): catalog length always; a short decode is padded by its last frame, a failed one is all zero."""
    catalogs = load_catalogs(_config(mini).data)["catalogs"]
    length = {p: int(n) for c in catalogs.values() for p, n in zip(c.paths, c.lengths, strict=True)}
    ids = {p: int(i) for c in catalogs.values() for p, i in zip(c.paths, c.ids, strict=True)}
    rgb, flow = (get_source(source_kwargs(_config(mini, stream=s).data)) for s in ("rgb", "flow"))
    lying = mini.bad["lying"]
    assert length[lying] == 15  # the header's 30 frames at stride 2, not the file's
    frames, report = rgb.load(ids[lying], None, 0, SIZE)
    real = mini.videos[os.path.relpath(lying, mini.root / "UCF-101").replace(os.sep, "/")][1]
    decoded = -(-real // 2)
    assert real < 30 and frames.shape == (15, SIZE, SIZE, 3) and report["refit"] == [[lying, decoded, 15]]
    assert all(np.array_equal(frames[k], frames[decoded - 1]) for k in range(decoded, 15))
    truncated = mini.bad["truncated"]
    for source, channels in ((rgb, 3), (flow, 2)):
        frames, report = source.load(ids[truncated], 0, 0, SIZE)
        assert frames.shape == (length[truncated], SIZE, SIZE, channels) and not frames.any()
        assert report["failed"][0][0] == truncated and "zero frames" in report["failed"][0][1]


def test_a_decode_opens_its_video_once_and_only_a_failed_one_probes_it(mini, monkeypatch):
    """A miss decodes with one open: the catalog length comes from the header that decode read (a probe
    first parsed the container a second time). A failed decode still probes, for its black frames'
    length; the lying header's refit is unchanged (the header of the same open)."""
    from raytrain_seq.data import video

    catalogs = load_catalogs(_config(mini).data)["catalogs"]
    length = {p: int(n) for c in catalogs.values() for p, n in zip(c.paths, c.lengths, strict=True)}
    ids = {p: int(i) for c in catalogs.values() for p, i in zip(c.paths, c.ids, strict=True)}
    probed: list[str] = []
    real_probe = video.probe
    monkeypatch.setattr(video, "probe", lambda path, **kw: probed.append(path) or real_probe(path, **kw))
    sources = [get_source(source_kwargs(_config(mini, stream="rgb", frame_cache_gib=0).data))]
    sources.append(get_source(source_kwargs(_config(mini, stream="flow").data)))
    good = catalogs["train"].paths[3]
    for source, channels in zip(sources, (3, 2), strict=True):
        frames, report = source.load(ids[good], 0, 0, SIZE)
        assert (
            frames.shape == (length[good], SIZE, SIZE, channels) and frames.any() and "failed" not in report
        )
        if channels == 3:
            assert report["frame_cache"] == {"hits": 0, "misses": 1}  # decoded, not read from a cache
    assert probed == []
    lying = mini.bad["lying"]
    _, report = sources[0].load(ids[lying], 0, 0, SIZE)
    assert report["refit"][0][2] == length[lying] == 15 and probed == []
    truncated = mini.bad["truncated"]
    frames, report = sources[0].load(ids[truncated], 0, 0, SIZE)
    assert probed == [truncated] and frames.shape[0] == length[truncated] and not frames.any()


def test_source_rgb_and_flow_are_seeded_and_the_same_length(mini):
    """Same (seed, video, epoch): same bytes; another epoch: another window; flow is 2-channel, same T."""
    catalog = load_catalogs(_config(mini).data)["catalogs"]["train"]
    video, length = int(catalog.ids[3]), int(catalog.lengths[3])
    rgb, flow = (get_source(source_kwargs(_config(mini, stream=s).data)) for s in ("rgb", "flow"))
    a, b, c = (rgb.load(video, epoch, 0, SIZE)[0] for epoch in (1, 1, 2))
    assert a.shape == (length, SIZE, SIZE, 3) and np.array_equal(a, b) and not np.array_equal(a, c)
    f1, f2 = (flow.load(video, epoch, 0, SIZE)[0] for epoch in (1, 1))
    assert f1.shape == (length, SIZE, SIZE, 2) and f1.dtype == np.uint8 and np.array_equal(f1, f2)
    # The clip's white square moves right 2 px per source frame (scaled by 20/24): flow x > 0 on it.
    assert dequantize(f1[..., 0]).max() > 0.8 and abs(float(dequantize(f1[..., 1]).mean())) < 0.5


def test_flow_is_computed_once_and_each_refurbish_is_a_window_of_it(mini):
    """The flow-once contract: RealVideos.flow depends on neither seed nor epoch, and load(video, epoch)
    is exactly flow_window(flow, size, flow_offset(seed, video, epoch)): the window partial_augment's
    first draw places (the centre for evaluation), cut from one whole-frame flow."""
    catalog = load_catalogs(_config(mini).data)["catalogs"]["train"]
    video = int(catalog.ids[3])
    source = get_source(source_kwargs(_config(mini, stream="flow").data))
    flow, report = source.flow(video, SIZE)
    assert flow.shape == (int(catalog.lengths[3]), SIZE, 27, 2) and report == {}  # 32x24 at short side 20
    assert np.array_equal(source.flow(video, SIZE)[0], flow)
    starts = set()
    for seed in (0, 5):
        for epoch in (0, 1, 2, 3, None):
            offset = flow_offset(seed, video, epoch)
            if epoch is None:
                assert offset is None
            else:
                assert offset == partial_rng(seed, video, epoch).uniform(0.0, 1.0)
            start = round((0.5 if offset is None else offset) * (27 - SIZE))
            starts.add(start)
            expect = flow[:, :, start : start + SIZE]
            assert np.array_equal(source.load(video, epoch, seed, SIZE)[0], expect), (seed, epoch)
    assert len(starts) >= 3  # the epochs really cut different windows of the one stored flow
    with pytest.raises(ValueError, match="flow stream"):
        get_source(source_kwargs(_config(mini).data)).flow(video, SIZE)


def test_flow_task_bodies_give_load_bytes_and_report_flow_seconds(mini):
    """flow_videos (once) then window_videos (per refurbish) give load()'s bytes, a zero clip for the
    video that fails to decode, and report each video's CPU seconds of decoding and flow."""
    config = _config(mini, stream="flow")
    catalogs = load_catalogs(config.data)["catalogs"]
    source = source_kwargs(config.data)
    id_of = {p: int(v) for c in catalogs.values() for p, v in zip(c.paths, c.ids, strict=True)}
    ids = [int(catalogs["train"].ids[k]) for k in (0, 2)] + [id_of[mini.bad["truncated"]]]
    ids.append(int(catalogs["test"].ids[0]))
    epochs = [0, 1, 2, None]
    *flows, info = flow_videos(source, ids, epochs, SIZE)
    assert info["kind"] == "flow" and info["ids"] == ids and info["epochs"] == epochs
    assert len(info["flow_seconds"]) == 4 and all(s > 0 for s in info["flow_seconds"][:2])
    assert [path for path, _ in info["failed"]] == [mini.bad["truncated"]]
    assert info["flow_method"] == flow_method()
    *windows, winfo = window_videos(ids, epochs, 7, SIZE, 0.0, *flows)
    assert winfo["kind"] == "window" and winfo["epochs"] == epochs and winfo["failed"] == []
    for video, epoch, window in zip(ids, epochs, windows, strict=True):
        assert np.array_equal(window, get_source(source).load(video, epoch, 7, SIZE)[0]), (video, epoch)
    assert windows[0].any() and not windows[2].any()  # the truncated video: a zero clip
    with pytest.raises(ValueError, match="one flow per video"):
        window_videos(ids, epochs, 7, SIZE, 0.0, *flows[:2])


def test_whole_frame_flow_differs_from_window_first_flow_only_near_the_borders(mini):
    """What flow once changed: the window of the whole frame's flow is not the flow of the window (the
    solver sees past the window's edge), but away from the edges the two agree to a quantisation step."""
    size, margin = 64, 10
    config = _config(mini, stream="flow", cache_size=size)
    source = get_source(source_kwargs(config.data))
    catalog = load_catalogs(config.data)["catalogs"]["train"]
    inner, edges = [], []
    for video in catalog.ids[:4].tolist():
        offset = flow_offset(0, video, 1)
        new = source.load(video, 1, 0, size)[0]
        first, second, last = decode_pairs(source.paths[video], stride=2, size=size, threads=1)
        old = pair_flow(resize_video(first, size, offset), resize_video(second, size, offset), last=last)
        diff = np.abs(dequantize(new) - dequantize(fit_length(old, new.shape[0])))
        inner.append(diff[:, margin:-margin, margin:-margin].ravel())
        edges.append(diff[:, :, :3].ravel())
    inner, edges = np.concatenate(inner), np.concatenate(edges)
    assert (inner <= 2 * FLOW_BOUND / 255 + 1e-6).mean() > 0.97
    assert edges.mean() > inner.mean()  # the difference sits at the window's edge


def test_the_frame_cache_serves_the_bytes_of_a_decode_to_every_process(mini, tmp_path, monkeypatch):
    """An RGB source with a frame cache gives the bytes of one without, for training (any epoch) and
    evaluation; it decodes each video once, and another process on the folder (a restarted feed's
    task, a --resume) reads it without decoding."""
    options = dict(source_kwargs(_config(mini, frame_cache_dir=str(tmp_path), frame_cache_gib=1).data))
    cached, plain = RealVideos(**options), RealVideos(**{**options, "frame_cache_gib": 0})
    ids = cached.catalogs()["catalogs"]["train"].ids.tolist()[:4]
    for epoch in (None, 0, 3):
        for video in ids:
            got, report = cached.load(video, epoch, 0, SIZE)
            assert np.array_equal(got, plain.load(video, epoch, 0, SIZE)[0]), (video, epoch)
            assert set(report["stages"]) == {"decode", "cache_read", "partial_augment"}
    assert (cached.frame_cache.stats.misses, cached.frame_cache.stats.hits) == (4, 8)
    assert plain.frame_cache.stats.hits == 0 and plain.frame_cache.stats.unwritten == 12

    def opened(*args, **kwargs):
        raise AssertionError("a cached video was opened")

    again = RealVideos(**options)
    monkeypatch.setattr("raytrain_seq.data.video.probe", opened)  # a hit neither probes nor decodes
    monkeypatch.setattr("raytrain_seq.data.video.decode", opened)
    for video in ids:
        assert np.array_equal(again.load(video, 1, 0, SIZE)[0], cached.load(video, 1, 0, SIZE)[0])
    assert (again.frame_cache.stats.misses, again.frame_cache.stats.hits) == (0, 4)


def test_hmdb51_with_fps_resampling_through_the_source(tmp_path):
    """HMDB51 catalogs (each clip its own group) and --fps 10: every loaded clip has its catalog length."""
    ds = make_mini_hmdb51(tmp_path / "hmdb")
    config = Config.from_preset(
        None, dataset="hmdb51", data_root=str(ds.root), stride=1, fps=10.0, cache_size=SIZE, crop=16,
        val_fraction=0.3, run_name="x",
    )  # fmt: skip
    loaded = load_catalogs(config.data)
    cats = loaded["catalogs"]
    assert loaded["class_names"] == list(ds.class_names) and loaded["skipped"] == []
    assert len(cats["train"]) + len(cats["val"]) == len(ds.train[1]) and len(cats["test"]) == len(ds.test[1])
    assert set(cats["val"].labels.tolist()) == {0, 1, 2}  # max(1, round(0.3 * 3)) = 1 clip of each class
    source = get_source(source_kwargs(config.data))
    for catalog in cats.values():
        for video, length, path in zip(catalog.ids, catalog.lengths, catalog.paths, strict=True):
            frames = ds.videos[os.path.relpath(path, ds.root).replace(os.sep, "/")][1]
            assert length == (frames - 1) * 10 // 25 + 1  # floor((n - 1) * f / F) + 1 at F = 25
            out, report = source.load(int(video), 0, 0, SIZE)
            assert out.shape == (length, SIZE, SIZE, 3) and not {"failed", "refit"} & set(report), path


# ----------------------------------------------------------------------------------- model factory
def _fake_run(folder: Path, config: Config, model: torch.nn.Module) -> Path:
    state = AveragedState(round=3, params=model.state_dict(), batch_size=4)
    checkpoint.save(folder / checkpoint.folder_name(3), state=state, config=config.to_dict())
    return folder


def test_init_from_copies_rgb_weights_and_checks_the_head(tmp_path):
    """build_model_for(init_from=RGB run): flow conv1 = grouped mean, rest copied; class count must match."""
    model_args = dict(width=4, depth=2, hidden=6, run_name="x")
    rgb_config = Config.from_preset(None, **model_args)
    torch.manual_seed(1)
    rgb = build_model(3, 3, width=4, depth=2, hidden=6)
    run = _fake_run(tmp_path / "rgb", rgb_config, rgb)
    torch.manual_seed(2)
    flow = build_model_for(
        Config.from_preset(None, init_from=str(run), **model_args).model, num_classes=3, in_channels=2
    )
    key, source = "encoder.features.0.weight", rgb.state_dict()
    got = flow.state_dict()
    assert got[key].shape[1] == 4 and source[key].shape[1] == 6
    assert torch.equal(got[key][:, :2], source[key][:, :3].mean(1, keepdim=True).expand(-1, 2, -1, -1))
    assert torch.equal(got[key][:, 2:], source[key][:, 3:].mean(1, keepdim=True).expand(-1, 2, -1, -1))
    assert list(got) == list(source)
    for name in source:
        if name != key:
            assert torch.equal(got[name], source[name]), name
    fresh = build_model(3, 2, width=4, depth=2, hidden=6).state_dict()
    assert not torch.equal(fresh["temporal.gru.weight_hh_l0"], got["temporal.gru.weight_hh_l0"])
    same = build_model_for(
        Config.from_preset(None, init_from=str(run), **model_args).model, num_classes=3, in_channels=3
    )
    assert all(torch.equal(v, source[k]) for k, v in same.state_dict().items())
    with pytest.raises(ValueError, match="its classifier has 3 classes but this run has 5"):
        build_model_for(
            Config.from_preset(None, init_from=str(run), **model_args).model, num_classes=5, in_channels=2
        )
    wider = {**model_args, "hidden": 8}
    with pytest.raises(ValueError, match=r"model\.hidden=6, this one 8: pass --hidden 6"):
        build_model_for(
            Config.from_preset(None, init_from=str(run), **wider).model, num_classes=3, in_channels=2
        )
    with pytest.raises(ValueError, match="holds no checkpoint_round"):
        load_run_state(tmp_path)


def test_fuse_table_shows_both_streams():
    """format_table of a fuse summary: fused, rgb and flow accuracies, stream, flow method, skipped count."""
    summary = RunSummary(
        dataset="ucf101", learners=0, epochs=0, test_accuracy=0.75, stream="fuse", flow_method="farneback",
        videos={"train": 17, "val": 6, "test": 12, "skipped": ["/d/bad.avi"]},
        extra={"fuse": {"rgb_accuracy": 0.5, "flow_accuracy": 0.25, "rgb_run": "/r/rgb", "test_videos": 12}},
    )  # fmt: skip
    table = format_table(summary)
    for text in (
        "75.0 %",
        "rgb stream",
        "50.0 %",
        "flow stream",
        "25.0 %",
        "farneback",
        "17/6/12",
        "1 skipped",
    ):
        assert text in table, text
    assert "frames trained" not in table  # nothing was trained


# ------------------------------------------------------------------------------------------------ Ray
# tests/conftest.py's ray_cluster (a private local cluster even when another one runs on this machine).
RAY_CLUSTER = {"num_cpus": 4, "namespace": "raytrain_seq"}


@pytest.fixture(scope="module")
def runs(ray_cluster, mini, tmp_path_factory, ucf101_job):
    """The README's three commands on the miniature set: rgb, flow --init-from rgb, fuse, swapped fuse."""
    storage = tmp_path_factory.mktemp("runs")
    job = ucf101_job
    # The README's commands with one epoch instead of the preset's 4: this checks plumbing, not learning.
    common = ["--preset", "mini-video", "--dataset", "ucf101", "--data-root", str(mini.root), "--epochs", "1"]
    common += ["--storage-path", str(storage)]
    codes = {"rgb": job.main([*common, "--run-name", "rgb"])}
    codes["flow"] = job.main(
        [*common, "--run-name", "flow", "--stream", "flow", "--init-from", str(storage / "rgb")]
    )
    fuse = ["--stream", "fuse", "--fuse", str(storage / "rgb"), str(storage / "flow")]
    codes["fuse"] = job.main([*common, "--run-name", "fuse", *fuse])
    codes["swapped"] = job.main(
        [*common, "--run-name", "swapped", "--stream", "fuse", "--fuse", *fuse[3:][::-1]]
    )
    return storage, codes


def _summary(storage: Path, name: str) -> dict:
    return json.loads((storage / name / "summary.json").read_text())


@pytest.mark.ray
def test_flow_feed_computes_each_flow_once_and_counts_the_cpu_saved(ray_cluster, mini):
    """A flow feed over 3 epochs, r = 2: each training video's flow is computed once (epoch 0), epochs 1
    and 2 only cut windows (exactly the evicted ids), the served arrays equal load(video, computing
    epoch) and evaluation's load(video, None), and the CPU saved is the flow seconds of the evicted ids:
    with r = 2 epochs 1 and 2 evict every id once, so together they save all of epoch 0's flow seconds."""
    from raytrain_seq.algorithms.refurbish import RefurbishSchedule
    from raytrain_seq.runtime.feed import create_feed
    from raytrain_seq.runtime.partial_tasks import fetch_arrays

    ray = ray_cluster
    config = _config(mini, stream="flow", reuse=2, epochs=3, learners=1)
    catalogs = load_catalogs(config.data)["catalogs"]
    train = catalogs["train"].ids.tolist()
    schedule = RefurbishSchedule(len(train), reuse=2, seed=config.data.seed)
    evicted = {e: sorted(np.asarray(train)[schedule.evicted(e)].tolist()) for e in (1, 2)}
    assert sorted(evicted[1] + evicted[2]) == sorted(train)  # r = 2: each id once in epochs 1..2
    source = get_source(source_kwargs(config.data))
    feed = create_feed(Parts.of(config).feed, videos_per_task=4)
    for epoch in range(3):
        ray.get(feed.epoch_shard.remote(epoch, 0, 1))
        arrays = fetch_arrays(ray.get(feed.refs.remote(train, epoch)))
        computing = epoch - schedule.age(epoch)
        for k, (video, got) in enumerate(zip(train, arrays, strict=True)):
            expect = source.load(video, int(computing[k]), config.data.seed, SIZE)[0]
            assert np.array_equal(got, expect), (epoch, video)
    held = []
    for split in ("val", "test"):
        ray.get(feed.eval_shard.remote(split))
        ids = catalogs[split].ids.tolist()
        for video, got in zip(ids, fetch_arrays(ray.get(feed.refs.remote(ids, None))), strict=True):
            assert np.array_equal(got, source.load(video, None, config.data.seed, SIZE)[0]), video
        held += ids
    stats = ray.get(feed.stats.remote(wait=True, ids=True))
    epochs, totals = stats.epochs, stats.totals
    assert stats.flow_once and totals["tasks_pending"] == 0
    assert epochs[0]["flow_videos"] == len(train) == epochs[0]["partial_videos"]
    assert epochs[0]["flow_seconds"] > 0 and epochs[0]["flow_seconds_saved"] == 0
    for epoch in (1, 2):
        assert epochs[epoch]["partial_ids"] == evicted[epoch] == sorted(evicted[epoch])
        assert epochs[epoch]["flow_videos"] == 0 and epochs[epoch]["flow_seconds"] == 0
        assert epochs[epoch]["flow_seconds_saved"] > 0
    saved = epochs[1]["flow_seconds_saved"] + epochs[2]["flow_seconds_saved"]
    assert saved == pytest.approx(epochs[0]["flow_seconds"]) and totals["flow_videos"] == len(train)
    # The video that fails to decode (a zero clip) is reported once, by its flow task.
    assert stats.eval["videos"] == len(held) and mini.bad["truncated"] in stats.videos["skipped"]


@pytest.mark.ray
def test_rgb_feed_reads_the_frame_cache_within_its_budget_and_after_a_restart(ray_cluster, mini, tmp_path):
    """An RGB feed over 3 epochs, r = 1, with a frame cache that holds about half the training videos:
    every epoch serves load(video, epoch)'s bytes for every video, the cache stays within its budget,
    the videos past it are decoded again (never a failure), and a new feed on the same folder (a
    restarted feed, a --resume) reads every cached video and decodes exactly the others."""
    from raytrain_seq.runtime.feed import create_feed
    from raytrain_seq.runtime.partial_tasks import fetch_arrays

    ray = ray_cluster
    probe = _config(mini, reuse=1, epochs=3, learners=1)
    train = load_catalogs(probe.data)["catalogs"]["train"]
    plain = RealVideos(**{**dict(source_kwargs(probe.data)), "frame_cache_gib": 0})
    files = [decode(plain.paths[v], stride=2, size=SIZE).nbytes + 128 for v in train.ids]
    budget = sum(sorted(files)[: len(files) // 2]) + 64
    config = _config(
        mini, reuse=1, epochs=3, learners=1, frame_cache_dir=str(tmp_path), frame_cache_gib=budget / 2**30
    )
    ids = train.ids.tolist()

    def served_by(feed, epochs) -> list[dict]:
        for epoch in epochs:
            ray.get(feed.epoch_shard.remote(epoch, 0, 1))
            for video, got in zip(ids, fetch_arrays(ray.get(feed.refs.remote(ids, epoch))), strict=True):
                assert np.array_equal(got, plain.load(video, epoch, config.data.seed, SIZE)[0]), (
                    epoch,
                    video,
                )
        stats = ray.get(feed.stats.remote(wait=True))
        ray.kill(feed)
        return [stats.epochs[e]["frame_cache"] for e in epochs]

    first = served_by(create_feed(Parts.of(config).feed, videos_per_task=3), range(3))
    cached = sum(1 for _ in tmp_path.glob("*.npy"))
    assert 0 < cached < len(ids) and sum(_.stat().st_size for _ in tmp_path.glob("*.npy")) <= budget
    # Each epoch computes every video (r = 1), from the cache or by a decode; epoch e + 1's tasks start
    # while epoch e is served, so an epoch may already read what the next one wrote.
    assert all(counts["hits"] + counts["misses"] == len(ids) for counts in first)
    assert first[0]["misses"] >= len(ids) - cached and first[2]["hits"] >= 1
    (restarted,) = served_by(create_feed(Parts.of(config).feed, videos_per_task=3), [0])
    assert restarted == {"hits": cached, "misses": len(ids) - cached}


@pytest.mark.ray
def test_rgb_run_trains_on_readable_videos_and_lists_the_bad_ones(runs, mini):
    """The rgb run finishes; its summary lists the corrupt and the undecodable video; test scored."""
    storage, codes = runs
    assert codes["rgb"] == 0
    summary = _summary(storage, "rgb")
    assert summary["stream"] == "rgb" and summary["flow_method"] is None
    assert {mini.bad["corrupt"], mini.bad["truncated"]} <= set(summary["videos"]["skipped"])
    assert summary["videos"]["test"] == len(mini.test[1])
    assert 0.0 <= summary["test_accuracy"] <= 1.0
    assert set(summary["per_class_accuracy"]) <= {"ApplyEyeMakeup", "ApplyLipstick", "Archery"}
    # The feed's cost: every kept frame served, the CPU of its actor and tasks, the learners' wait.
    feed = summary["feed"]
    assert {
        "kept_frames",
        "cpu_s",
        "cpu_s_per_kept_frame_cold",
        "cpu_s_per_kept_frame_warm",
        "learner_wait_s",
    } <= set(feed)
    assert feed["kept_frames"] > 0 and feed["cpu_s"] > 0 and feed["learner_wait_s"] >= 0
    assert feed["cpu_s_per_kept_frame_cold"] > 0 and feed["cpu_s_per_kept_frame_warm"] is None  # 1 epoch
    assert feed["stages_cpu_s"]["decode"] > 0
    table = format_table(RunSummary.load(storage / "rgb"))
    assert "feed CPU a frame" in table and "feed per learner" in table


@pytest.mark.ray
def test_flow_run_takes_two_channels_from_the_rgb_model(runs):
    """The flow run takes 2 channels (conv1 sees 4: flow + differences), starting from the rgb model."""
    storage, codes = runs
    assert codes["flow"] == 0
    summary = _summary(storage, "flow")
    assert summary["stream"] == "flow" and summary["flow_method"] == flow_method()
    flow_params = load_run_state(storage / "flow").state.params
    assert flow_params["encoder.features.0.weight"].shape[1] == 4
    # What the flow learners started from: the rgb run's final model, cross-modality initialised.
    rgb_params = load_run_state(storage / "rgb").state.params
    config = Config.from_dict(load_run_state(storage / "flow").config)
    start = build_model_for(config.model, num_classes=3, in_channels=2).state_dict()
    conv = rgb_params["encoder.features.0.weight"]
    assert torch.equal(start["encoder.features.0.weight"][:, 0], conv[:, :3].mean(1))
    assert torch.equal(start["encoder.features.0.weight"][:, 3], conv[:, 3:].mean(1))
    for name, value in rgb_params.items():
        if name != "encoder.features.0.weight":
            assert torch.equal(start[name], value), name
    assert not torch.equal(flow_params["head.weight"], rgb_params["head.weight"])  # then it trained


@pytest.mark.ray
def test_fuse_reports_rgb_flow_and_fused_accuracy(runs):
    """fuse: each stream's accuracy equals its run's own test accuracy; fused (softmax mean) is in [0, 1]."""
    storage, codes = runs
    assert codes["fuse"] == 0
    fused, rgb, flow = (_summary(storage, name) for name in ("fuse", "rgb", "flow"))
    assert fused["stream"] == "fuse" and fused["flow_method"] == flow_method()
    # The driver's evaluation reproduces the learners' (same final model, same evaluation rows).
    assert fused["fuse"]["rgb_accuracy"] == pytest.approx(rgb["test_accuracy"])
    assert fused["fuse"]["flow_accuracy"] == pytest.approx(flow["test_accuracy"])
    assert 0.0 <= fused["test_accuracy"] <= 1.0 and fused["test_accuracy"] == fused["fuse"]["fused_accuracy"]
    assert fused["fuse"]["test_videos"] == fused["videos"]["test"] == 12
    assert set(fused["per_class_accuracy"]) == {"ApplyEyeMakeup", "ApplyLipstick", "Archery"}
    assert fused["videos"]["skipped"][0].endswith(".avi")
    assert codes["swapped"] == 2  # flow run given as the RGB run: refused before any work


@pytest.mark.ray
def test_export_and_predict_see_what_the_runs_evaluation_saw(runs, mini, tmp_path, capsys):
    """export writes the run's final model as a plain state_dict + spec that rebuild it; predict feeds each
    test video exactly the frames the run's own evaluation fed (decode, resize, centre crop) and ranks the
    run's classes by the model's softmax."""
    from raytrain_seq.algorithms.augment import center_crop
    from raytrain_seq.inference.export import export, load_exported
    from raytrain_seq.inference.export import main as export_main
    from raytrain_seq.inference.predict import Predictor
    from raytrain_seq.inference.predict import main as predict_main

    storage, codes = runs
    assert codes["rgb"] == 0
    out, meta_path = export(storage / "rgb", tmp_path / "model.pt")
    meta = json.loads(meta_path.read_text())
    assert meta["class_names"] == list(mini.class_names) and meta["input"]["center_crop"] == 16
    final = load_run_state(storage / "rgb")
    saved = torch.load(out, weights_only=True)
    assert saved.keys() == final.state.params.keys()
    assert all(torch.equal(saved[k], v) for k, v in final.state.params.items())
    model, _ = load_exported(out)
    assert all(torch.equal(model.state_dict()[k], v) for k, v in final.state.params.items())

    predictor = Predictor(storage / "rgb")
    config = predictor.config
    source = get_source(source_kwargs(config.data))
    test = load_catalogs(config.data)["catalogs"]["test"]
    compared = 0
    for video, path in zip(test.ids, test.paths, strict=True):
        if path == mini.bad["lying"]:
            continue  # its header lies: the run pads it to the header's length, predict takes the real frames
        ran, _ = source.load(int(video), None, config.data.seed, config.data.cache_size)
        assert np.array_equal(predictor.frames(path), center_crop(ran, config.data.crop)), path
        ranked = predictor.top(path, 5)
        assert [name for name, _ in ranked] != [] and len(ranked) == 3  # 3 classes: all of them, ranked
        assert sum(p for _, p in ranked) == pytest.approx(1.0, abs=1e-5)
        assert [p for _, p in ranked] == sorted((p for _, p in ranked), reverse=True)
        compared += 1
    assert compared == len(test) - 1

    assert export_main([str(storage / "rgb"), "--out", str(tmp_path / "again.pt")]) == 0
    assert predict_main([str(storage / "rgb"), test.paths[0], mini.bad["corrupt"]]) == 1  # one unreadable
    printed = capsys.readouterr()
    assert test.paths[0] in printed.out and mini.bad["corrupt"] in printed.err
    assert export_main([str(tmp_path), "--out", str(tmp_path / "x.pt")]) == 2  # not a run folder


@pytest.mark.ray
def test_predict_on_the_flow_run_sees_the_flow_its_evaluation_saw(runs, mini):
    """predict's flow path is the evaluation's flow-once bytes: the whole frame's flow, centred window."""
    from raytrain_seq.algorithms.augment import center_crop
    from raytrain_seq.inference.predict import Predictor

    storage, codes = runs
    assert codes["flow"] == 0
    predictor = Predictor(storage / "flow")
    config = predictor.config
    assert config.data.stream == "flow"
    source = get_source(source_kwargs(config.data))
    test = load_catalogs(config.data)["catalogs"]["test"]
    compared = 0
    for video, path in zip(test.ids, test.paths, strict=True):
        if path == mini.bad["lying"]:
            continue  # the run pads it to the header's length, predict takes the real frames
        ran, _ = source.load(int(video), None, config.data.seed, config.data.cache_size)
        assert ran.shape[-1] == 2 and np.array_equal(
            predictor.frames(path), center_crop(ran, config.data.crop)
        )
        compared += 1
    assert compared == len(test) - 1
