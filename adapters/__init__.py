"""The adapters: MLflow (runs, the run lifecycle, the policy model and its registry entry, traces,
studies), Great Expectations (the data and rollout suites) and Prefect's markdown artifacts. What
``tasks/`` and ``flows/`` call; the engine (``agentr1/``, ``models/``) imports none of it."""
