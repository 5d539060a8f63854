"""The trained agent as an MLflow pyfunc, logged as *models-from-code*: MLflow stores this
file with the model and runs it when loading, so loading a registered model unpickles nothing.

``tracking.log_policy_model`` logs it with the policy directory, the dataset's resources its
tools read (the corpus, the SQL world's database, a plug-in generator's files), the run's plug-in
``.py`` files (which register its tools) and its MCP servers' scripts as artifacts, and the run's
own settings as ``model_config`` (``tracking.agent_config``):

- ``config``: the run's ``seed``, ``env`` (environment kind and tools), ``reward`` and ``rollout``
  sections, and its plug-ins;
- ``corpus``: None (the logged corpus), or another ``corpus.jsonl`` of the same format,
  given at load time: ``mlflow.pyfunc.load_model(uri, model_config={"corpus": path})``, or
  for ``mlflow models serve`` through ``MLFLOW_PYFUNC_INFERENCE_CONFIG='{"corpus": path}'``;
- ``device``: the run's (``auto``: CUDA where there is one), ``cpu`` or ``cuda``;
- ``trace_experiment``: None, or an experiment name: each served episode is recorded there as an
  MLflow trace (``adapters/traces.py``), e.g. ``MLFLOW_PYFUNC_INFERENCE_CONFIG='{"trace_experiment":
  "agentr1-served"}'``.

``predict(DataFrame with a "question" column, params={"temperature": 0.0, "seed": 0})``
returns one ``agentr1.agent`` result dict per question (answer, tool calls with results,
turns, finish); a function-calling agent's rows also need a ``functions`` column (each row's
function documents as JSON text), and its result is the call. It also answers MLflow's agent requests, one conversation each, whose last
user message is the question: ``{"input": [{"role": "user", "content": ...}]}`` (the
``ResponsesAgent`` shape) returns the episode as Responses output items
(``agentr1.agent.responses_output``), ``{"messages": [...]}`` (``ChatAgent``) as chat messages
(``chat_agent_output``); ``mlflow models serve`` takes both as plain JSON bodies. A bad input is an ``MlflowException`` with ``INVALID_PARAMETER_VALUE``, which
MLflow's scoring server answers with HTTP 400.

The project (``agentr1``, ``models``, ``adapters``) must be installed where the model is loaded.
"""
from __future__ import annotations

import copy

import mlflow
import pandas as pd
from mlflow.exceptions import MlflowException
from mlflow.protos.databricks_pb2 import INVALID_PARAMETER_VALUE

from agentr1.agent import chat_agent_output, check_request, question_of, responses_output, transcript
from adapters.tracking import (CHAT_MESSAGES, CORPUS_ARTIFACT, FUNCTIONS, MCP_ARTIFACT, PLUGIN_ARTIFACT, POLICY_ARTIFACT,
                            QUESTION, RESOURCES_ARTIFACT, RESPONSES_INPUT)


class AgentModel(mlflow.pyfunc.PythonModel):
    """See the module docstring."""

    def load_context(self, context) -> None:
        from agentr1.agent import Agent
        from agentr1.config import Config

        conf = context.model_config
        # The resources directory (corpus, database, a plug-in's files); a model logged before
        # resources travelled carries its corpus file alone. ``corpus`` (agentr1 ask --corpus) swaps the corpus.
        resources = context.artifacts.get(RESOURCES_ARTIFACT) or context.artifacts[CORPUS_ARTIFACT]
        if conf.get("corpus"):
            resources = conf["corpus"]
        plugins = [path for key, path in sorted(context.artifacts.items()) if key.startswith(PLUGIN_ARTIFACT)]
        config = copy.deepcopy({**conf["config"], "plugins": [*conf["config"].get("plugins", []), *plugins]})
        for key, path in context.artifacts.items():  # an MCP server's script: the logged copy
            if key.startswith(MCP_ARTIFACT):
                server, arg = map(int, key[len(MCP_ARTIFACT):].split("_"))
                config["env"]["mcp"][server]["command"][arg] = path
        self.agent = Agent(Config.model_validate(config), context.artifacts[POLICY_ARTIFACT], resources,
                           device=conf.get("device"))
        self.trace_experiment = None
        if conf.get("trace_experiment"):  # each served episode as an MLflow trace in this experiment
            from adapters import tracking

            self.trace_experiment = tracking.experiment_id(conf["trace_experiment"])

    def predict(self, context, model_input: pd.DataFrame, params: dict | None = None) -> list[dict] | dict:
        params = params or {}
        columns = list(model_input.columns) if isinstance(model_input, pd.DataFrame) else []
        shape = next((c for c in (QUESTION, RESPONSES_INPUT, CHAT_MESSAGES) if c in columns), None)
        if shape is None:
            # MLflow's signature check drops the columns it does not name before predict runs, so a
            # misnamed column arrives as none at all.
            got = columns or "no column it knows (the server drops columns the model's signature does not name)"
            raise MlflowException(f"input needs a {QUESTION!r} column (or an agent request's {RESPONSES_INPUT!r} or "
                                  f"{CHAT_MESSAGES!r} messages), got {got}", INVALID_PARAMETER_VALUE)
        try:  # a bad question or parameter is the caller's error (4xx), not the server's
            temperature, seed = float(params.get("temperature", 0.0)), int(params.get("seed", 0))
            functions = None
            if shape == QUESTION:
                questions = check_request(model_input[QUESTION].tolist(), temperature)
                if FUNCTIONS in columns and model_input[FUNCTIONS].notna().any():
                    functions = model_input[FUNCTIONS].tolist()
            else:  # one conversation: its last user message is the question
                rows = model_input[shape].dropna().tolist()
                if len(rows) != 1:
                    raise ValueError(f"field {shape!r}: one conversation per request, got {len(rows)}")
                questions = check_request([question_of(rows[0], shape)], temperature)
            functions = self.agent.check_functions(functions, len(questions))
        except (TypeError, ValueError, OverflowError) as exc:  # OverflowError: int(float("inf"))
            raise MlflowException(str(exc), INVALID_PARAMETER_VALUE) from None
        episodes = self.agent.play(questions, temperature=temperature, seed=seed,
                                   functions=None if functions[0] is None else functions)
        if self.trace_experiment:
            from adapters import traces

            for question, trajectory in episodes:
                traces.log_episode(None, self.trace_experiment, trajectory, question, {traces.TAG_KIND: "served"})
        results = [transcript(q, t, self.agent.env) for q, t in episodes]
        if shape == QUESTION:
            return results
        return (responses_output if shape == RESPONSES_INPUT else chat_agent_output)(results[0])


mlflow.models.set_model(AgentModel())
