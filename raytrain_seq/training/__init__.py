"""The learner's work inside one process, without Ray: ``staging`` collates block rows and stages them
on the device, ``step`` streams micro-batches and steps the optimizer, ``evaluation`` scores a model on
the rows ``eval_rows`` assembles ahead; ``heap`` keeps freed memory in the process so that steps reuse
pages. ``runtime.learner`` is the actor shell around them.
"""
