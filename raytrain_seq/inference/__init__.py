"""A trained run's model outside training: ``export`` writes it as a plain ``state_dict`` and a small
JSON of classes and input spec (``python -m raytrain_seq.inference.export``); ``predict`` classifies
video files through the run's own transforms (``python -m raytrain_seq.inference.predict``).
"""
