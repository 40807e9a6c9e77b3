"""What a run reports and writes, without Ray: the typed reports that cross processes into the run's
summary (``reports``), the summary itself (``summary``: summary.json, the result table, curves.png),
the per-epoch accounting of trained videos against the plan (``accounting``) and live tracking
(``tracking``: TensorBoard or MLflow).
"""
