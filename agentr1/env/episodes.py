"""Scripted agents played through an environment: every episode of a batch stepped together (one
tool batch per turn), each one kept as a :class:`~agentr1.episode.Trajectory` of text (its turns,
observations, rewards and metrics; the warm-up encodes the ids): the warm-up's demonstrations,
and the tests' way to drive an environment."""
from __future__ import annotations

from typing import Sequence

from agentr1.data.records import QARecord
from agentr1.env.agents import ScriptedAgent
from agentr1.env.base import Environment
from agentr1.episode import Trajectory


def chat_messages(system: str, user: str, episode: Trajectory) -> list[dict]:
    """The episode as chat messages: [system, user, assistant, tool, assistant, ...] (tool contents
    are bodies without the wrapper), what a scripted agent reads."""
    messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
    for k, text in enumerate(episode.turn_texts):
        messages.append({"role": "assistant", "content": text})
        if k < len(episode.observations):
            messages.append({"role": "tool", "content": episode.observations[k]})
    return messages


def run_episodes(env: Environment, agent: ScriptedAgent, records: Sequence[QARecord]) -> list[Trajectory]:
    """Play every record to the end, all episodes stepped together (one search batch per turn)."""
    states = [env.reset(record) for record in records]
    episodes = [Trajectory(record.id, [], [], [], 0) for record in records]
    chats = [chat_messages(env.system_turn(record) or "", env.user_prompt(record), e)
             for record, e in zip(records, episodes)]
    active = list(range(len(records)))
    while active:
        texts = [agent.act(records[i], chats[i]) for i in active]
        results = env.step_batch([states[i] for i in active], texts)
        for i, text, result in zip(active, texts, results):
            episode = episodes[i]
            episode.turn_texts.append(text)
            episode.process_rewards.append(result.process_reward)
            episode.outcome_reward = result.outcome_reward
            chats[i].append({"role": "assistant", "content": text})
            if result.observation is not None:
                episode.observations.append(result.observation)
                chats[i].append({"role": "tool", "content": result.observation})
        active = [i for i, result in zip(active, results) if not result.done]
    for state, episode in zip(states, episodes):
        episode.metrics = env.episode_metrics(state)
    return episodes


def run_episode(env: Environment, agent: ScriptedAgent, record: QARecord) -> Trajectory:
    return run_episodes(env, agent, [record])[0]
