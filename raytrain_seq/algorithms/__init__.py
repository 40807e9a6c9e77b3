"""The four papers' algorithms as pure numpy/torch modules: BLoad block packing (``packing``, its bin
fillers in ``binpack``), AAVG's averaging arithmetic (``averaging``, the shards' elementwise rules in
``elementwise``) and adaptive batch size (``batchsize``), Revamper's refurbishing schedule
(``refurbish``) and its split augmentation (``augment``: the cached partial half and the cheap final
half), and micro-batch streaming (``microbatch``). They import neither ray nor each other (house rules),
so each is tested alone and used by the Ray-free layers above it.
"""
