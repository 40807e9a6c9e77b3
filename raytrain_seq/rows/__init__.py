"""The row stream, Ray-free: block rows assembled from packing plans and cached partial augmentations,
and the stream that hands them to a learner in its consumption order."""
