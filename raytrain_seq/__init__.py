"""raytrain_seq: elastic training on Ray for models that learn from whole variable-length sequences.

The four algorithm modules (``packing``, ``microbatch``, ``averaging``, ``refurbish``) are pure
(numpy/torch only) and import neither ray nor each other; ``raytrain_seq.elastic`` holds the Ray-free
elastic-training logic and ``raytrain_seq.runtime`` is the only package that imports ray. Importing this
package does nothing else. docs/ARCHITECTURE.md describes the data flow, the layout and the contracts.
"""

__version__ = "0.1.0"
