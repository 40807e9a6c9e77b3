"""raytrain_seq: elastic training on Ray for models that learn from whole variable-length sequences.

The four algorithm modules (``packing``, ``microbatch``, ``averaging``, ``refurbish``) are pure
(numpy/torch only) and import neither ray nor each other; only ``raytrain_seq.dist`` imports ray.
Importing this package does nothing else.
"""

__version__ = "0.1.0"
