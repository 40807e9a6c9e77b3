"""Where the frames come from: the synthetic set, UCF101, HMDB51 and your own lists (catalogs of videos and
their lengths, the validation hold-out), the decoder backends and the node's frame cache, optical flow, the
run's data geometry, and the sources the feed's task bodies draw partial augmentations from;
``python -m raytrain_seq.data.check`` checks a dataset before a run.
"""
