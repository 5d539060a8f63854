"""Scheduled retraining with champion / challenger promotion.

Trains a challenger on the current data version (the same steps as ``pipeline``), evaluates
the registered ``champion`` on the challenger's split and data, and moves the alias only when
the challenger is better by ``margin`` on ``metric``. The challenger is registered either way
(a version that is not the champion), so every trained policy can be found again.
One MLflow run per flow run in experiment ``agentr1-retrain``.

Two retrain flows may overlap (the nightly schedule and a manual run): the alias moves by
compare-and-set under the store's lock, so the later move sees the earlier one, and each
run's summary names the champion the registry held after its own move.

    make serve   # deployment "retrain/nightly" runs on its cron schedule (prefect.yaml)
"""
from __future__ import annotations

from prefect import flow

from flows.pipeline import run_training_flow
from flows.forms import RetrainParams


@flow(name="retrain", description="Train a challenger; promote it over the champion only if better by a margin.")
def retrain(params: RetrainParams = RetrainParams()) -> dict:
    """Retrain on the current data and promote only a clearly better policy."""
    return run_training_flow("retrain", params)
