"""The learner's work inside one process, without Ray: ``step`` collates block rows, streams
micro-batches and steps the optimizer; ``heap`` keeps freed memory in the process so that steps reuse
pages. ``runtime.learner`` is the actor shell around them.
"""
