"""Scripted agents played through an environment: every episode of a batch stepped together (one
tool batch per turn), each one's chat, turns, observations and rewards kept as a :class:`Transcript`
(the warm-up's demonstrations, and the tests' way to drive an environment)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from agentr1.data.records import QARecord
from agentr1.env.agents import ScriptedAgent
from agentr1.env.base import Environment, StepResult


@dataclass
class Transcript:
    messages: list[dict]
    """[system, user, assistant, tool, assistant, ...]; tool contents are bodies without the wrapper."""
    metrics: dict[str, float]
    """``env.episode_metrics`` of the finished episode."""
    turn_texts: list[str]
    observations: list[str]
    process_rewards: list[float]
    """One per assistant turn."""
    outcome_reward: float


def run_episodes(env: Environment, agent: ScriptedAgent, records: Sequence[QARecord]) -> list[Transcript]:
    """Play every record to the end, all episodes stepped together (one search batch per turn)."""
    states = [env.reset(record) for record in records]
    transcripts = [
        Transcript(
            messages=[
                {"role": "system", "content": env.system_prompt()},
                {"role": "user", "content": env.user_prompt(record)},
            ],
            metrics={}, turn_texts=[], observations=[], process_rewards=[], outcome_reward=0.0,
        )
        for record in records
    ]
    active = list(range(len(records)))
    while active:
        texts = [agent.act(records[i], transcripts[i].messages) for i in active]
        results = env.step_batch([states[i] for i in active], texts)
        for i, text, result in zip(active, texts, results):
            _record_turn(transcripts[i], text, result)
        active = [i for i, result in zip(active, results) if not result.done]
    for state, transcript in zip(states, transcripts):
        transcript.metrics = env.episode_metrics(state)
    return transcripts


def _record_turn(transcript: Transcript, text: str, result: StepResult) -> None:
    transcript.messages.append({"role": "assistant", "content": text})
    transcript.turn_texts.append(text)
    transcript.process_rewards.append(result.process_reward)
    transcript.outcome_reward = result.outcome_reward
    if result.observation is not None:
        transcript.messages.append({"role": "tool", "content": result.observation})
        transcript.observations.append(result.observation)


def run_episode(env: Environment, agent: ScriptedAgent, record: QARecord) -> Transcript:
    return run_episodes(env, agent, [record])[0]
