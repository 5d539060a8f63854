"""The training recipe: data -> supervised warm-up -> masked-PPO iterations -> evaluation.

Every entry point (``agentr1 train``, the DVC stages, the Prefect tasks in ``tasks/``, the
ablation) calls these stages; each takes the resolved :class:`~agentr1.config.Config` and a
:class:`~agentr1.recipe.workspace.Workspace`, and reports metrics to an optional
``log_metrics(metrics, step)`` callback (MLflow in the pipeline), never imported here.

==================  =====================================================================
``workspace``       data made or checked, environment, device (:class:`Workspace`); the
                    rollout engine of a policy; the evaluation questions; a saved policy
``warmup``          expert demonstrations, the model and tokenizer, the supervised warm-up
``ppo``             :class:`PPOSession` (one iteration: collect -> check -> update) and
                    :func:`run_ppo`, the one loop of PPO iterations
``evaluation``      a policy greedy and sampled on a split, the untrained baselines
``outputs``         the one writer of each output: ``final/``, ``metrics.jsonl`` with the
                    learning curve, ``summary.json``
``stages``          the stages in order (:func:`train`), as ``agentr1 train --stage`` runs them
==================  =====================================================================

Run layout under ``cfg.output_dir`` (the names: :mod:`agentr1.rundir`)::

    warmup/            HF directory + value head of the warmed-up policy (the PPO reference)
    checkpoints/last/  the latest PPO checkpoint (policy, optimizer, scheduler, RNG, iteration)
    checkpoints/best/  with ``ppo.dev_every``: the policy that scored best on dev, and best.json
    final/             the trained policy (the best on dev, or the last)
    metrics.jsonl      one JSON object of metrics per PPO iteration
    eval_*.json        evaluation metrics; trajectories_*.txt  rendered sample episodes
"""
