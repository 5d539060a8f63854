"""The ``agentr1`` command (``cli/main.py``) and its Prefect commands (``cli/flows.py``): the top
floor. Nothing below imports it: the engine (``agentr1/``, ``models/``) imports neither Prefect
nor MLflow, ``tasks/`` wraps the engine for Prefect and MLflow, ``flows/`` composes the tasks."""
