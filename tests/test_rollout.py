"""Rollout engine and hf backend: masks, stops, seeds, reward placement, log-probs."""
from __future__ import annotations

import pytest
import torch

from agentr1.config import ModelConfig
from agentr1.env.agents import OracleAgent
from agentr1.rl.ppo import forward_tokens
from agentr1.rollout.backend import Generation, HFBackend, SamplingSpec, _GumbelStream, _sample, sample_next
from agentr1.rollout.batch import collate
from agentr1.rollout.engine import RolloutEngine, RolloutSettings
from agentr1.rollout.forced import NaiveRAGBackend
from models.policy import ModelSpec, build_policy


@pytest.fixture(scope="module")
def world(rollout_world):
    spec = ModelSpec.from_config(ModelConfig(), hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=2,
                                 intermediate_size=64)
    model = build_policy(spec, rollout_world["tok"], seed=0)
    model.eval()
    return {**rollout_world, "model": model}


def make_engine(world, backend=None, max_turn_tokens=12, max_context=400, temperature=1.0):
    backend = backend or HFBackend(world["model"].policy, world["chat"].pad_token_id)
    return RolloutEngine(backend, world["chat"], world["tok"], world["env"],
                         RolloutSettings(max_turn_tokens, max_context, temperature))


def test_tokens_are_prompt_then_sampled_turns_and_observations(world):
    chat, records = world["chat"], world["splits"]["test"][:6]
    trajs = make_engine(world).run(records, seed=0)
    for t, r in zip(trajs, records):
        assert t.token_ids[: t.prompt_len] == chat.prompt_ids(None, world["env"].user_prompt(r))
        assert all(m == 0 for m in t.action_mask[: t.prompt_len])
        # Rebuild the sequence from its turns: each turn's sampled span has mask 1, each
        # observation exactly the ids the chat format gives, mask 0.
        j = t.prompt_len
        for k, end in enumerate(t.turn_ends):
            assert all(t.action_mask[i] == 1 for i in range(j, end + 1))
            j = end + 1
            if k < len(t.observations):
                closed = t.token_ids[end] == chat.end_of_turn_id
                obs = chat.observation_ids(t.observations[k], turn_closed=closed)
                assert t.token_ids[j : j + len(obs)] == obs
                assert all(m == 0 for m in t.action_mask[j : j + len(obs)])
                j += len(obs)
        assert j == len(t.token_ids)
        assert len(t.token_ids) == len(t.action_mask) == len(t.rollout_logprobs)
        assert t.finish in ("answer", "max_turns", "context")


def test_a_slow_rollout_says_where_it_is_and_a_fast_one_stays_quiet(world, monkeypatch, caplog):
    from agentr1.rollout import engine

    records = world["splits"]["test"][:6]
    with caplog.at_level("INFO", logger="agentr1.train"):
        quiet = make_engine(world).run(records, seed=0)
    assert not [r for r in caplog.records if r.getMessage().startswith("rollout:")]
    monkeypatch.setattr(engine, "PROGRESS_EVERY_S", 0.0)  # every turn is "slow"
    with caplog.at_level("INFO", logger="agentr1.train"):
        loud = make_engine(world).run(records, seed=0)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("rollout:")]
    assert lines and lines[0].startswith("rollout: 1 turn played, ") and f"of {len(records)} episodes" in lines[0]
    assert [t.token_ids for t in loud] == [t.token_ids for t in quiet]  # reporting changes nothing played


def test_turns_stop_at_stop_tokens_or_the_limit(world):
    chat = world["chat"]
    trajs = make_engine(world, max_turn_tokens=7).run(world["splits"]["test"][:8], seed=1)
    for t in trajs:
        start = t.prompt_len
        for k, end in enumerate(t.turn_ends):
            turn = t.token_ids[start : end + 1]
            stops = [i for i, tok in enumerate(turn) if tok in chat.stop_token_ids]
            assert stops in ([], [len(turn) - 1])  # a stop token can only be the last
            assert stops or len(turn) == 7
            start = end + 1 + (len(chat.observation_ids(t.observations[k], turn[-1] == chat.end_of_turn_id))
                               if k < len(t.observations) else 0)


def test_same_seed_same_rollout_other_seed_differs(world):
    records = world["splits"]["test"][:6]
    a = make_engine(world).run(records, seed=5)
    b = make_engine(world).run(records, seed=5)
    c = make_engine(world).run(records, seed=6)
    assert [t.token_ids for t in a] == [t.token_ids for t in b]
    assert [t.rollout_logprobs for t in a] == [t.rollout_logprobs for t in b]
    assert [t.token_ids for t in a] != [t.token_ids for t in c]


def test_episode_ends_when_context_is_full_and_keeps_its_outcome_on_last_action(world):
    trajs = make_engine(world, max_turn_tokens=20, max_context=80).run(world["splits"]["test"][:6], seed=2)
    assert any(t.finish == "context" for t in trajs)
    batch = collate(trajs, world["chat"].pad_token_id)
    for b, t in enumerate(trajs):
        assert len(t.token_ids) <= 80 and t.turn_ends
        last = t.last_action_index
        assert t.action_mask[last] == 1 and all(m == 0 for m in t.action_mask[last + 1 :])
        col = batch.outcome_rewards[b].nonzero().flatten().tolist()
        if t.outcome_reward != 0:
            assert col == [last - 1]
            assert batch.action_mask[b, last - 1] == 1


class RecordingBackend:
    """The hf backend, noting each call's prompt lengths and token caps."""

    def __init__(self, inner):
        self.inner, self.calls = inner, []

    def sync_weights(self, model):  # pragma: no cover - nothing to sync
        self.inner.sync_weights(model)

    def session(self):
        return self.inner.session()

    def generate(self, prompts, spec, seeds):
        self.calls.append(([len(p) for p in prompts], spec.limits(len(prompts))))
        return self.inner.generate(prompts, spec, seeds)


def test_an_episode_near_its_context_end_does_not_cut_the_others_turns(world):
    """Each episode samples up to max_turn_tokens or its own room: one long episode once cut
    every episode of the batch to its few tokens of room (bad calls for the others)."""
    import dataclasses

    short, long_ = world["splits"]["test"][:2]
    long_ = dataclasses.replace(long_, question=long_.question + " again" * 60)
    n_short, n_long = (len(world["chat"].prompt_ids(None, world["env"].user_prompt(r))) for r in (short, long_))
    backend = RecordingBackend(HFBackend(world["model"].policy, world["chat"].pad_token_id))
    trajs = make_engine(world, backend=backend, max_turn_tokens=12, max_context=n_long + 9).run([short, long_], seed=0)
    assert backend.calls[0] == ([n_short, n_long], [12, 9])  # one call, each episode its own cap
    assert trajs[1].turn_ends[0] - trajs[1].prompt_len + 1 <= 9 and trajs[1].finish == "context"
    alone = make_engine(world, max_turn_tokens=12, max_context=n_long + 9).run([short], seed=0)[0]
    assert trajs[0].token_ids[: trajs[0].turn_ends[0] + 1] == alone.token_ids[: alone.turn_ends[0] + 1]
    assert trajs[0].turn_ends[0] - trajs[0].prompt_len + 1 > 9  # it was not cut to the long one's room


class ScriptedBackend:
    """Emits the oracle's turns as token ids (what a perfect policy would sample); it sees
    only the prompt ids, like a real backend, and keeps each episode's chat on the side."""

    def __init__(self, world, records):
        self.world, self.agent, self.records = world, OracleAgent(), records
        self.chats: dict[str, list[dict]] = {}

    def sync_weights(self, model):  # pragma: no cover - nothing to sync
        pass

    def generate(self, prompts, spec, seeds):
        chat, tok = self.world["chat"], self.world["tok"]
        out = []
        for p in prompts:
            text = tok.decode(p, skip_special_tokens=False)
            record = next(r for r in self.records if f"Question: {r.question}<" in text)
            msgs = self.chats.setdefault(record.id, [{"role": "user", "content": record.question}])
            if "<tool_response>\n" in text:
                body = text.rsplit("<tool_response>\n", 1)[1].split("\n</tool_response>")[0]
                msgs.append({"role": "tool", "content": body})
            turn = self.agent.act(record, msgs)
            msgs.append({"role": "assistant", "content": turn})
            ids = chat.turn_ids(turn)
            out.append(Generation(ids, [0.0] * len(ids), "stop"))
        return out


def test_a_perfect_policy_scores_full_marks_through_the_token_protocol(world):
    records = world["splits"]["test"]
    engine = make_engine(world, backend=ScriptedBackend(world, records), max_turn_tokens=64, max_context=1000)
    trajs = engine.run(records, seed=0)
    assert all(t.metrics["em"] == 1.0 for t in trajs)
    for t, r in zip(trajs, records):
        assert len(t.turn_ends) == r.hops + 1  # one search per hop, then the answer
        assert t.process_rewards[: r.hops] == [pytest.approx(0.2)] * r.hops


def test_sampling_logprobs_match_the_trainers_forward(world):
    trajs = make_engine(world).run(world["splits"]["test"][:6], seed=3)
    batch = collate(trajs, world["chat"].pad_token_id)
    with torch.no_grad():
        logp, _, _ = forward_tokens(world["model"], batch.input_ids, batch.attention_mask)
    gap = ((logp - batch.rollout_logprobs).abs() * batch.action_mask).max()
    assert gap < 1e-4


def test_sample_next_is_per_row_seeded_and_respects_top_p():
    logits = torch.tensor([[0.0, 5.0, 4.9, -3.0], [1.0, 1.0, 1.0, 1.0]])
    spec = SamplingSpec(1, (), temperature=1.0, top_p=0.5)
    ids = [sample_next(logits, spec, [torch.Generator().manual_seed(s), torch.Generator().manual_seed(9)])[0]
           for s in range(20)]
    assert {int(i[0]) for i in ids} == {1}  # top-p 0.5 keeps only the best token of row 0
    assert len({int(i[1]) for i in ids}) == 1  # row 1 always has the same seed
    greedy, lp = sample_next(logits, SamplingSpec(1, (), temperature=0.0), [None, None])
    assert greedy.tolist() == [1, 0] and torch.all(lp <= 0)


def test_noise_drawn_in_blocks_equals_noise_drawn_per_step(monkeypatch):
    """The backend draws a block of steps' noise per row at once; the draws must be the ones
    sample_next makes step by step, or seeded samples would change."""
    monkeypatch.setattr(_GumbelStream, "NOISE_BLOCK", 3 * 2 * 50)  # blocks of 3 steps, the last of 1
    spec = SamplingSpec(7, (), temperature=0.7)
    logits = torch.randn(7, 2, 50, generator=torch.Generator().manual_seed(0)) * 3
    stream = _GumbelStream([torch.Generator().manual_seed(s) for s in (4, 5)], 7)
    stepwise = [torch.Generator().manual_seed(s) for s in (4, 5)]
    for t in range(7):
        blocked = _sample(logits[t], spec, stream.next(50))
        one = sample_next(logits[t], spec, stepwise)
        assert torch.equal(blocked[0], one[0]) and torch.equal(blocked[1], one[1])


def test_length_bucketed_batches_cover_every_episode_once_with_similar_lengths():
    from agentr1.rollout.batch import length_bucketed_batches

    lengths = [((i * 37) % 300) + 50 for i in range(203)]
    batches = length_bucketed_batches(lengths, 16, torch.Generator().manual_seed(0), bucket=4)
    assert sorted(i for b in batches for i in b) == list(range(203))
    assert all(1 <= len(b) <= 16 for b in batches)
    spread = sum(max(lengths[i] for i in b) - min(lengths[i] for i in b) for b in batches) / len(batches)
    assert spread < 100  # random batches of 16 would span ~250 tokens
    again = length_bucketed_batches(lengths, 16, torch.Generator().manual_seed(0), bucket=4)
    assert batches == again


def test_ppo_minibatch_window_gives_a_fresh_partition_each_epoch_where_a_full_sort_does_not():
    """ppo.minibatch_window (None: the whole batch sorted by length, the default) reaches the
    update, and a window of 2 minibatches re-partitions every epoch; the full sort repeats the
    same partition (distinct lengths: no ties to reshuffle)."""
    from agentr1.config import Config
    from agentr1.recipe.ppo import ppo_hyper
    from agentr1.rollout.batch import length_bucketed_batches

    assert ppo_hyper(Config()).minibatch_window is None
    assert ppo_hyper(Config.model_validate({"ppo": {"minibatch_window": 2}})).minibatch_window == 2
    lengths = [50 + (i * 37) % 64 for i in range(64)]
    assert len(set(lengths)) == 64

    def partitions(bucket: int) -> list[set[frozenset[int]]]:
        gen = torch.Generator().manual_seed(0)
        return [set(map(frozenset, length_bucketed_batches(lengths, 8, gen, bucket=bucket))) for _ in range(2)]

    full, windowed = partitions(len(lengths)), partitions(2)
    assert full[0] == full[1]
    assert windowed[0] != windowed[1]


def test_scoring_in_chunks_of_rows_gives_the_whole_batchs_scores(world, monkeypatch):
    """ppo.score_rows scores the batch a few episodes at a time, longest first, each chunk cut to
    its longest row: the same log-probs, values and advantages as one pass over the whole padded
    batch, up to float rounding, on every position of every row (0 past its end)."""
    from dataclasses import replace

    from agentr1.config import Config
    from agentr1.recipe.ppo import ppo_hyper
    from agentr1.rl import ppo as ppo_module
    from agentr1.rl.ppo import score_batch

    batch = collate(make_engine(world).run(world["splits"]["test"][:6], seed=3), world["chat"].pad_token_id)
    lengths = batch.attention_mask.sum(dim=1)
    assert len(set(lengths.tolist())) > 1, "episodes of one length: the cut would prove nothing"
    hp = ppo_hyper(Config())
    assert hp.score_rows is None and hp.minibatch_size >= len(batch)
    shapes, forward = [], ppo_module.forward_tokens
    monkeypatch.setattr(ppo_module, "forward_tokens",
                        lambda m, ids, *a, **k: shapes.append(tuple(ids.shape)) or forward(m, ids, *a, **k))
    whole, _ = score_batch(world["model"], world["model"], batch, hp)  # one chunk: the batch, cut to its longest
    chunked, _ = score_batch(world["model"], world["model"], batch, replace(hp, score_rows=4))
    longest = sorted(lengths.tolist(), reverse=True)
    assert shapes == [(6, longest[0])] * 2 + [(4, longest[0])] * 2 + [(2, longest[4])] * 2  # policy, reference
    inside = batch.attention_mask[:, 1:].bool()
    for name in ("old_logp", "ref_logp", "old_values", "advantages", "returns"):
        a, b = getattr(whole, name), getattr(chunked, name)
        assert torch.allclose(a[inside], b[inside], atol=1e-5), name
        if name != "advantages":  # whitened advantages shift every position
            assert torch.all(b[~inside] == 0), name
    assert float(batch.action_mask.sum()) > 0 and float(whole.old_logp.abs().sum()) > 0


def test_forward_tokens_at_positions_matches_the_full_forward(world):
    trajs = make_engine(world).run(world["splits"]["test"][:4], seed=4)
    batch = collate(trajs, world["chat"].pad_token_id)
    with torch.no_grad():
        full_lp, full_v, full_ent = forward_tokens(world["model"], batch.input_ids, batch.attention_mask,
                                                   with_entropy=True)
        lp, v, ent = forward_tokens(world["model"], batch.input_ids, batch.attention_mask,
                                    with_entropy=True, positions=batch.action_mask)
    on = batch.action_mask.bool()
    assert torch.allclose(lp[on], full_lp[on], atol=1e-5) and torch.all(lp[~on] == 0)
    assert torch.allclose(ent[on], full_ent[on], atol=1e-5)
    assert torch.equal(v, full_v)


# ----------------------------------------------------------------------------- KV reuse across turns


class Fed(torch.nn.Module):
    """The policy, unchanged, noting how many tokens each forward pass is fed."""

    def __init__(self, policy):
        super().__init__()
        self.policy, self.widths = policy, []

    def forward(self, input_ids, **kwargs):
        self.widths.append(input_ids.shape[1])
        return self.policy(input_ids=input_ids, **kwargs)


@pytest.mark.parametrize("max_turn_tokens,max_context,temperature", [(12, 400, 1.0), (20, 160, 1.0), (12, 400, 0.0)])
def test_kv_reuse_samples_what_full_prefill_samples(world, max_turn_tokens, max_context, temperature):
    """The same episodes token for token (log-probs to float rounding) whether each turn
    reuses the last turn's cache or prefills the whole context; the second setting ends
    episodes after 2 or 3 turns (context full), so rows leave the cached batch."""
    records, pad = world["splits"]["test"], world["chat"].pad_token_id
    runs = {}
    for reuse in (True, False):
        spy = Fed(world["model"].policy)
        engine = make_engine(world, HFBackend(spy, pad, reuse_cache=reuse), max_turn_tokens, max_context, temperature)
        runs[reuse] = (engine.run(records, seed=11), spy.widths)
    (cached, fed_cached), (full, fed_full) = runs[True], runs[False]
    assert [t.token_ids for t in cached] == [t.token_ids for t in full]
    for a, b in zip(cached, full):
        assert a.rollout_logprobs == pytest.approx(b.rollout_logprobs, abs=1e-4)
    # The cases worth checking occurred: turns stopped early (sampling; greedy never stops
    # this model), episodes of different lengths.
    stop = set(world["chat"].stop_token_ids)
    assert temperature == 0 or any(t.token_ids[e] in stop for t in cached for e in t.turn_ends)
    if max_context < 400:
        assert len({len(t.turn_ends) for t in cached}) > 1
    # With reuse, every turn after the first prefills less than the shortest episode so far.
    prefills = [w for w in fed_cached if w > 1]
    prefills_full = [w for w in fed_full if w > 1]
    assert len(prefills) == len(prefills_full) > 1
    assert all(w < min(len(t.token_ids) for t in cached) // 2 for w in prefills[1:])
    assert all(w < v for w, v in zip(prefills[1:], prefills_full[1:]))


def test_kv_reuse_drops_rows_prefills_new_prompts_whole_and_stays_bounded(world):
    """Inside a session: episodes not continued leave the cache, a prompt extending nothing
    is prefilled whole beside reused rows, and each kept row holds exactly its sequence."""
    pad, stop = world["chat"].pad_token_id, tuple(world["chat"].stop_token_ids)
    spec = SamplingSpec(9, stop, temperature=1.0)
    prompts = [world["chat"].prompt_ids(None, world["env"].user_prompt(r)) for r in world["splits"]["test"][:5]]
    reuse, full = HFBackend(world["model"].policy, pad), HFBackend(world["model"].policy, pad, reuse_cache=False)
    with reuse.session():
        first = reuse.generate(prompts, spec, [0, 1, 2, 3, 4])
        assert len(reuse._kept.seqs) == 5
        # Episodes 1 and 3 finished; 0, 2, 4 go on (their turn and an observation), and a
        # fresh prompt joins between them.
        obs = world["chat"].observation_ids("no results", turn_closed=False)
        nxt = [prompts[i] + first[i].token_ids + obs for i in (0, 2)] + [prompts[1]] + [prompts[4] + first[4].token_ids + obs]
        kept = reuse._kept
        assert kept.match(nxt) == [0, 2, -1, 4]
        # Bounded: the call starts from the kept rows' real tokens only, right-aligned (the
        # first call's left padding and post-stop junk are gone), the fresh prompt's row empty.
        assert min(len(s) for s in kept.seqs) < kept.mask.shape[1]
        layers, mask, cached = reuse._reuse(kept, nxt, spec)
        assert cached == [len(kept.seqs[r]) for r in (0, 2)] + [0] + [len(kept.seqs[4])]
        assert mask.shape == (4, max(cached)) and mask.sum(1).tolist() == cached
        assert all(layer.keys.shape[:3] == (4, layers[0].keys.shape[1], max(cached)) for layer in layers)
        second = reuse.generate(nxt, spec, [5, 6, 7, 8])
    assert [g.token_ids for g in second] == [g.token_ids for g in full.generate(nxt, spec, [5, 6, 7, 8])]
    assert reuse._kept is None  # the session freed its cache
    with reuse.session():
        reuse.generate(nxt, spec, [5, 6, 7, 8])
        kept = reuse._kept
        assert len(kept.seqs) == 4 and kept.mask.sum(1).tolist() == [len(s) for s in kept.seqs]
        reuse.sync_weights(world["model"].policy)  # new weights: the kept keys are stale
        assert reuse._kept is None


def test_without_a_session_the_hf_backend_keeps_nothing(world):
    backend = HFBackend(world["model"].policy, world["chat"].pad_token_id)
    backend.generate([[1, 2, 3]], SamplingSpec(3, ()), [0])
    assert backend._kept is None


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_shared_prompt_prefix_is_prefilled_once_and_samples_the_same(world, monkeypatch, temperature):
    """Prompts that share a long start (a system prompt) have it prefilled once, as one row, and
    copied to every row; the samples are those of prefilling every row whole."""
    import agentr1.rollout.backend as backend

    shared = list(range(10, 10 + backend.MIN_SHARED_PREFIX + 8))
    prompts = [shared + world["chat"].prompt_ids(None, world["env"].user_prompt(r))
               for r in world["splits"]["test"][:5]] + [shared + [7]]
    spec = SamplingSpec(10, tuple(world["chat"].stop_token_ids), temperature=temperature)
    spy = Fed(world["model"].policy)
    once = HFBackend(spy, world["chat"].pad_token_id).generate(prompts, spec, list(range(6)))
    assert spy.widths[0] == len(shared)  # the prefix alone, batch of one
    monkeypatch.setattr(backend, "MIN_SHARED_PREFIX", 10**9)
    whole = HFBackend(world["model"].policy, world["chat"].pad_token_id).generate(prompts, spec, list(range(6)))
    assert [g.token_ids for g in once] == [g.token_ids for g in whole]
    for a, b in zip(once, whole):
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)


class Recorder:
    """A backend that answers every prompt with tokens [7, 8] and remembers the prompts."""

    def __init__(self):
        self.calls: list[tuple[list[list[int]], SamplingSpec]] = []

    def generate(self, prompts, spec, seeds):
        self.calls.append((prompts, spec))
        return [Generation([7, 8], [-0.5, -0.25], "stop") for _ in prompts]


def test_naive_rag_forces_the_search_then_the_answer_tag():
    inner = Recorder()
    backend = NaiveRAGBackend(inner, first_turns={(1, 2): [50, 51, 52]}, answer_prefix=[90])
    spec = SamplingSpec(10, (99,), temperature=1.0)
    first = backend.generate([[1, 2]], spec, seeds=[0])
    assert first[0].token_ids == [50, 51, 52] and first[0].logprobs == [0.0] * 3 and not inner.calls
    answer = backend.generate([[1, 2, 50, 51, 52, 60]], spec, seeds=[0])
    (prompts, inner_spec), = inner.calls
    assert prompts == [[1, 2, 50, 51, 52, 60, 90]] and inner_spec.max_new_tokens == 9
    assert answer[0].token_ids == [90, 7, 8] and answer[0].logprobs == [0.0, -0.5, -0.25]
