"""A synthetic multi-hop world: fictional entities, one short document each, composed questions.

Every question gets its own mini-world with FRESH names (FIELD-NOTES pitfall 1: a model that
can memorise names never learns to copy them from search results):

- the chain: the entity named in the question and, hop by hop, the entity its relation
  points to; the last value is the answer;
- in each chain document a distractor relation of the same type (a film's producer next to
  its director), so a careless reader copies the wrong name;
- a decoy document for each non-final distractor value (the producer has a birth city too),
  so following the wrong name leads somewhere plausible;
- 1-2 look-alike entities (same first word, or one syllable changed) whose documents state
  the same relations with other values.

Names are built from syllables; every name word is fresh across the whole corpus (only a
look-alike deliberately shares a word with its original), is not an English stopword or a
template word, and is its own Porter stem, so a BM25 search for an exact name ranks that
entity's own document first. Output is byte-identical for a seed: one ``random.Random``,
lists only (no set or dict-hash order), ids assigned after a seeded shuffle.

Text is plain ASCII letters, spaces and ``. , ?`` so any tokeniser splits it the same way.
"""
from __future__ import annotations

import random
import re
from collections import Counter
from dataclasses import dataclass
from typing import Callable, Sequence, TypeVar

import Stemmer
from bm25s.stopwords import STOPWORDS_EN

from agentr1.config import DEFAULT_HOP_WEIGHTS, SynthConfig
from agentr1.data.records import Document, QARecord

SOURCE = "synthetic"
SPLITS = ("train", "dev", "test")
T = TypeVar("T")
SIZES = SynthConfig()
"""The split sizes every generator defaults to: the config's (``data.synth``)."""
# Documents are read by a ~1M-parameter model inside a short context: keep them short.
MIN_DOC_WORDS = 12
MAX_DOC_WORDS = 30
MAX_FILLER_FACTS = 0
LOOKALIKES_PER_QUESTION = (1, 2)
_MAX_TRIES = 1000

# ---------------------------------------------------------------- the schema

# Relations asked about in questions: name -> (subject kind, object kind, distractor relation).
MAIN_RELATIONS: dict[str, tuple[str, str, str]] = {
    "director": ("film", "person", "producer"),
    "studio": ("film", "company", "distributor"),
    "birth_city": ("person", "city", "residence_city"),
    "employer": ("person", "company", "former_employer"),
    "alma_mater": ("person", "university", "lectured_at"),
    "headquarters_city": ("company", "city", "branch_city"),
    "founder": ("company", "person", "chairman"),
    "located_in": ("university", "city", "partner_city"),
    "country": ("city", "country", "trade_partner"),
}
# Relations stated in documents only (distractors and fillers): name -> (subject, object).
SIDE_RELATIONS: dict[str, tuple[str, str]] = {
    "producer": ("film", "person"),
    "distributor": ("film", "company"),
    "residence_city": ("person", "city"),
    "former_employer": ("person", "company"),
    "lectured_at": ("person", "university"),
    "branch_city": ("company", "city"),
    "chairman": ("company", "person"),
    "partner_city": ("university", "city"),
    "trade_partner": ("city", "country"),
    "mayor": ("city", "person"),
}
KINDS = ("person", "city", "country", "company", "film", "university")

# Sentence templates per relation: {s} = subject name, {o} = object name. Templates of
# different relations never match each other's sentences (tested), so extract_relation can
# read a value back with the same templates.
DOC_TEMPLATES: dict[str, tuple[str, ...]] = {
    "director": ("{s} was directed by {o}.", "{o} directed {s}.", "The director of {s} is {o}."),
    "producer": ("{s} was produced by {o}.", "{o} produced {s}.", "The producer of {s} is {o}."),
    "studio": ("{s} was made at {o}.", "The studio behind {s} is {o}.", "{s} was shot by the studio {o}."),
    "distributor": ("{s} was distributed by {o}.", "{o} distributed {s}.", "The distributor of {s} is {o}."),
    "birth_city": ("{s} was born in {o}.", "{s} is a native of {o}.", "The birthplace of {s} is {o}."),
    "residence_city": ("{s} lives in {o}.", "{s} now resides in {o}.", "{s} has a house in {o}."),
    "employer": ("{s} works for {o}.", "{s} is employed by {o}.", "The employer of {s} is {o}."),
    "former_employer": ("{s} once worked for {o}.", "{s} was formerly employed by {o}.", "The former employer of {s} is {o}."),
    "alma_mater": ("{s} studied at {o}.", "{s} graduated from {o}.", "The alma mater of {s} is {o}."),
    "lectured_at": ("{s} taught at {o}.", "{s} gave lectures at {o}.", "{s} was a visiting lecturer at {o}."),
    "headquarters_city": ("{s} is headquartered in {o}.", "The headquarters of {s} are in {o}.", "{s} has its head office in {o}."),
    "branch_city": ("{s} has a branch in {o}.", "{s} runs a small office in {o}.", "A branch of {s} operates in {o}."),
    "founder": ("{s} was founded by {o}.", "{o} founded {s}.", "The founder of {s} is {o}."),
    "chairman": ("{s} is chaired by {o}.", "{o} chairs {s}.", "The chair of {s} is {o}."),
    "located_in": ("{s} is located in {o}.", "The campus of {s} is in {o}.", "{s} stands in the city of {o}."),
    "partner_city": ("{s} has a partner campus in {o}.", "{s} runs a research station in {o}.", "{s} sends students to {o}."),
    "country": ("{s} is a city in {o}.", "{s} lies in {o}.", "{s} belongs to {o}."),
    "trade_partner": ("{s} trades mostly with {o}.", "{s} imports goods from {o}.", "The main trade partner of {s} is {o}."),
    "mayor": ("The mayor of {s} is {o}.", "{s} is governed by {o}.", "{o} is the mayor of {s}."),
}
# Entity-free sentences that pad a short document ({s} = subject name): at most one identity
# sentence ("is a painter") per document, then any number of extras.
IDENTITY: dict[str, tuple[str, ...]] = {
    "film": ("{s} is a drama film.", "{s} is a short comedy.", "{s} is a war film.", "{s} is a quiet love story."),
    "person": ("{s} is a painter.", "{s} is an engineer.", "{s} is a chemist.", "{s} is a singer.", "{s} is a lawyer."),
    "company": ("{s} is a trading company.", "{s} is a family business.", "{s} is a large firm."),
    "university": ("{s} is a public university.", "{s} is a private university.", "{s} is a small school."),
    "city": ("{s} is a port town.", "{s} is a mountain town.", "{s} is a large city."),
    "country": ("{s} is a small country.", "{s} is an island nation."),
}
EXTRAS: dict[str, tuple[str, ...]] = {
    "film": ("{s} runs for two hours.", "{s} won a minor award.", "{s} was shot in winter."),
    "person": ("{s} speaks three languages.", "{s} grew up on a farm.", "{s} plays the violin."),
    "company": ("{s} makes farm machines.", "{s} sells cheap radios.", "{s} builds ships."),
    "university": ("{s} is known for its law school.", "{s} has a large library.", "{s} has many students."),
    "city": ("{s} is known for its old harbour.", "{s} has a busy central market.", "{s} is famous for its bridges."),
    "country": ("{s} has a long coast.", "{s} exports wool."),
}
# How a relation reads as a noun phrase ({x} = what it applies to) ...
PHRASES: dict[str, tuple[str, ...]] = {
    "director": ("the director of {x}", "the person who directed {x}", "the filmmaker behind {x}"),
    "studio": ("the studio of {x}", "the studio that made {x}", "the studio behind {x}"),
    "birth_city": ("the birthplace of {x}", "the city where {x} was born", "the home town of {x}"),
    "employer": ("the employer of {x}", "the company that employs {x}", "the firm {x} works for"),
    "alma_mater": ("the alma mater of {x}", "the university {x} attended", "the university where {x} studied"),
    "headquarters_city": ("the headquarters city of {x}", "the city where {x} is based", "the home city of {x}"),
    "founder": ("the founder of {x}", "the person who founded {x}"),
    "located_in": ("the city where {x} is located", "the host city of {x}"),
    "country": ("the country of {x}", "the country that {x} belongs to"),
}
# ... and as the question asked about it.
FRAMES: dict[str, tuple[str, ...]] = {
    "director": ("Who directed {x}?", "Who is the director of {x}?", "Which person directed {x}?"),
    "studio": ("Which studio made {x}?", "What studio is behind {x}?", "Which studio produced {x}?"),
    "birth_city": ("In which city was {x} born?", "Where was {x} born?", "What is the birthplace of {x}?"),
    "employer": ("Which company does {x} work for?", "Who employs {x}?", "What is the employer of {x}?"),
    "alma_mater": ("Which university did {x} attend?", "Where did {x} study?", "What is the alma mater of {x}?"),
    "headquarters_city": ("In which city is {x} headquartered?", "Where is {x} based?", "What city is {x} based in?"),
    "founder": ("Who founded {x}?", "Who is the founder of {x}?", "Which person founded {x}?"),
    "located_in": ("In which city is {x} located?", "Where is {x} located?", "What city is {x} in?"),
    "country": ("In which country is {x}?", "Which country is {x} part of?", "What country does {x} belong to?"),
}
# Frames that read the last two relations together ("born" + "country").
PAIR_FRAMES: dict[tuple[str, str], tuple[str, ...]] = {
    ("birth_city", "country"): ("In which country was {x} born?", "What is the country of birth of {x}?"),
    ("headquarters_city", "country"): ("In which country is {x} headquartered?",),
    ("located_in", "country"): ("In which country is {x} located?",),
}
PAIR_FRAME_PROB = 0.5

# Name inventories. A name word is syllables of onset + vowel + optional coda (repeats weight
# the choice). "rich": ~900 distinct syllables, 2 per word; the tokenizer cannot hold every
# syllable (in both cases) as a token, so names split into ~1,500 distinct pieces, each rare.
# "small": 240 syllables of at most 3 letters, 3 per word, one word per name and no suffix.
# A space inside a name becomes its own token, the same token that precedes every capitalised
# word, so copying the word after it needs more than matching the previous token: a 4-layer
# model learned to copy "a b SEP c d" far slower than "a b c d" (measured:
# docs/experiments/2026-11-30-learning-to-copy.md, item 3).
@dataclass(frozen=True)
class NameInventory:
    onsets: tuple[str, ...]
    vowels: tuple[str, ...]
    codas: tuple[str, ...]
    syllables_per_word: int
    single_word: bool = False
    """one word per name and no company/university suffix"""


NAME_INVENTORIES: dict[str, NameInventory] = {
    "rich": NameInventory(
        onsets=("b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z",
                "br", "dr", "gr", "kr", "tr", "st", "th", "sh"),
        vowels=("a", "e", "i", "o", "u", "a", "e", "i", "o", "u", "ai", "ou"),
        codas=("", "", "", "n", "r", "l", "k", "m"),
        syllables_per_word=2),
    "small": NameInventory(
        onsets=("b", "d", "g", "k", "l", "m", "n", "p", "r", "t", "v", "z"),
        vowels=("a", "e", "i", "o", "u"),
        codas=("", "", "n", "r", "l"),
        syllables_per_word=3,
        single_word=True),
}
DEFAULT_NAMES = SynthConfig.model_fields["names"].default
"""The config's default (the default run's inventory): one source for it."""
SUFFIXES: dict[str, tuple[str, ...]] = {
    "company": ("Group", "Works", "Labs", "Studios", "Holdings", "Systems"),
    "university": ("University", "Institute", "College", "Academy"),
}
# Probability that a name of this kind has a second syllable word (persons always do).
TWO_WORD_PROB = {"person": 1.0, "city": 0.25, "country": 0.1, "film": 0.45, "company": 0.2, "university": 0.1}
SAME_FIRST_WORD_PROB = 0.5

_NAME = r"[A-Z][a-z]+(?: [A-Z][a-z]+)*"


def _template_words() -> frozenset[str]:
    texts = [t for group in (DOC_TEMPLATES, IDENTITY, EXTRAS, PHRASES, FRAMES, PAIR_FRAMES, SUFFIXES) for ts in group.values() for t in ts]
    return frozenset(w.lower() for t in texts for w in re.findall(r"[A-Za-z]+", t))


_STEMMER = Stemmer.Stemmer("english")
# A name word must not be, or stem to the same term as, a word of the templates.
_RESERVED_WORDS = frozenset(
    w for word in _template_words() | frozenset(STOPWORDS_EN) for w in (word, _STEMMER.stemWord(word))
)


def relation_kinds(relation: str) -> tuple[str, str]:
    """(subject kind, object kind) of any relation."""
    if relation in MAIN_RELATIONS:
        return MAIN_RELATIONS[relation][:2]
    return SIDE_RELATIONS[relation]


def distractor_of(relation: str) -> str:
    return MAIN_RELATIONS[relation][2]


def relations_of(kind: str) -> list[str]:
    """Every relation (main and side) whose subject is ``kind``, in schema order."""
    return [r for r in [*MAIN_RELATIONS, *SIDE_RELATIONS] if relation_kinds(r)[0] == kind]


def relation_paths(hops: int) -> list[tuple[str, ...]]:
    """All question relation paths of ``hops`` main relations, each hop's object the next subject."""
    paths: list[tuple[str, ...]] = [(r,) for r in MAIN_RELATIONS]
    for _ in range(hops - 1):
        paths = [p + (r,) for p in paths for r in MAIN_RELATIONS if MAIN_RELATIONS[r][0] == MAIN_RELATIONS[p[-1]][1]]
    return paths


def kind_id(path: Sequence[str]) -> str:
    """Stable id of a question kind: start kind then relations, e.g. 'film>director>birth_city'."""
    return ">".join([MAIN_RELATIONS[path[0]][0], *path])


# ---------------------------------------------------------------- extraction


def _template_regex(template: str) -> re.Pattern:
    pattern = re.escape(template).replace(r"\{s\}", f"(?P<s>{_NAME})").replace(r"\{o\}", f"(?P<o>{_NAME})")
    return re.compile(r"\b" + pattern)


_REGEXES: dict[str, tuple[re.Pattern, ...]] = {
    rel: tuple(_template_regex(t) for t in templates) for rel, templates in DOC_TEMPLATES.items()
}


def extract_relation(text: str, relation: str, subject: str | None = None) -> str | None:
    """The value of ``relation`` stated in ``text`` (a document or a search-result body).

    Returns the earliest statement in the text (templates tried together, by position); with
    ``subject`` only statements about that entity count. None when nothing matches or the
    relation is unknown.
    """
    matches = [m for rx in _REGEXES.get(relation, ()) for m in rx.finditer(text)]
    matches = [m for m in matches if subject is None or m.group("s") == subject]
    if not matches:
        return None
    return min(matches, key=lambda m: m.start()).group("o")


# ---------------------------------------------------------------- names


@dataclass(frozen=True)
class Name:
    """A name as syllable words plus an optional kind suffix ('Group', 'University')."""

    words: tuple[tuple[str, ...], ...]
    suffix: str | None = None

    @property
    def text(self) -> str:
        parts = ["".join(w).capitalize() for w in self.words]
        return " ".join(parts + ([self.suffix] if self.suffix else []))


class _NameMaker:
    """Fresh names: every syllable word is used once in the whole corpus (look-alikes excepted)."""

    def __init__(self, rng: random.Random, inventory: NameInventory):
        self.rng = rng
        self.inventory = inventory
        self.used_words: set[str] = set()  # membership only; never iterated (determinism)
        self.used_names: set[str] = set()

    def _syllable(self) -> str:
        rng, inv = self.rng, self.inventory
        return rng.choice(inv.onsets) + rng.choice(inv.vowels) + rng.choice(inv.codas)

    def _ok_word(self, syllables: Sequence[str]) -> bool:
        word = "".join(syllables)
        return (
            word not in self.used_words
            and word not in _RESERVED_WORDS
            # its own stem: no other name word can share its index term
            and _STEMMER.stemWord(word) == word
        )

    def _claim(self, name: Name) -> Name:
        self.used_words.update("".join(w) for w in name.words)
        self.used_names.add(name.text)
        return name

    def _fresh_word(self) -> tuple[str, ...]:
        for _ in range(_MAX_TRIES):
            syllables = tuple(self._syllable() for _ in range(self.inventory.syllables_per_word))
            if self._ok_word(syllables):
                self.used_words.add("".join(syllables))
                return syllables
        raise RuntimeError("name inventory exhausted")

    def new(self, kind: str) -> Name:
        if self.inventory.single_word:
            return self._claim(Name((self._fresh_word(),), None))
        n_words = 2 if self.rng.random() < TWO_WORD_PROB[kind] else 1
        suffix = self.rng.choice(SUFFIXES[kind]) if kind in SUFFIXES else None
        return self._claim(Name(tuple(self._fresh_word() for _ in range(n_words)), suffix))

    def lookalike(self, name: Name) -> Name:
        """Same first word with fresh others, or one syllable of one word changed."""
        if len(name.words) > 1 and self.rng.random() < SAME_FIRST_WORD_PROB:
            words = (name.words[0],) + tuple(self._fresh_word() for _ in name.words[1:])
            return self._claim(Name(words, name.suffix))
        for _ in range(_MAX_TRIES):
            i = self.rng.randrange(len(name.words))
            word = list(name.words[i])
            j = self.rng.randrange(len(word))
            word[j] = self._syllable()
            candidate = Name(name.words[:i] + (tuple(word),) + name.words[i + 1:], name.suffix)
            if self._ok_word(word) and candidate.text not in self.used_names:
                return self._claim(candidate)
        raise RuntimeError(f"no look-alike found for {name.text!r}")


# ---------------------------------------------------------------- documents


@dataclass
class _Draft:
    """A document before ids are assigned (``key`` identifies it until then)."""

    key: int
    title: str
    text: str


class _World:
    """Builds all documents and questions; holds the rng, the names and the drafts."""

    def __init__(self, seed: int, names: str = DEFAULT_NAMES):
        if names not in NAME_INVENTORIES:
            raise ValueError(f"unknown name inventory {names!r}; choose from {sorted(NAME_INVENTORIES)}")
        self.rng = random.Random(seed)
        self.names = _NameMaker(self.rng, NAME_INVENTORIES[names])
        self.drafts: list[_Draft] = []

    def sentence(self, relation: str, subject: str, obj: str) -> str:
        return self.rng.choice(DOC_TEMPLATES[relation]).format(s=subject, o=obj)

    def document(self, name: Name, kind: str, facts: list[tuple[str, str]]) -> int:
        """Write a doc stating ``facts`` [(relation, value)], padded with filler facts or flavour."""
        subject, rng = name.text, self.rng
        others = [r for r in relations_of(kind) if r not in {rel for rel, _ in facts}]
        fillers = rng.sample(others, min(len(others), rng.randint(0, MAX_FILLER_FACTS)))
        sentences = [self.sentence(r, subject, v) for r, v in facts]
        for relation in fillers:
            extra = self.sentence(relation, subject, self.names.new(relation_kinds(relation)[1]).text)
            if _words(sentences) + _words([extra]) <= MAX_DOC_WORDS:
                sentences.append(extra)
        pads = list(EXTRAS[kind])
        rng.shuffle(pads)
        pads.append(rng.choice(IDENTITY[kind]))  # popped first
        while _words(sentences) < MIN_DOC_WORDS and pads:
            sentences.append(pads.pop().format(s=subject))
        rng.shuffle(sentences)
        self.drafts.append(_Draft(len(self.drafts), subject, " ".join(sentences)))
        return self.drafts[-1].key

    def hop_doc(self, name: Name, kind: str, relation: str) -> tuple[int, Name, Name]:
        """A doc stating ``relation`` and its distractor with fresh values: (key, value, distractor value)."""
        value = self.names.new(relation_kinds(relation)[1])
        distractor = distractor_of(relation)
        decoy = self.names.new(relation_kinds(distractor)[1])
        key = self.document(name, kind, [(relation, value.text), (distractor, decoy.text)])
        return key, value, decoy


def _words(sentences: Sequence[str]) -> int:
    return sum(len(s.split()) for s in sentences)


# ---------------------------------------------------------------- questions


@dataclass
class _Question:
    id: str
    path: tuple[str, ...]
    text: str
    answer: str
    chain: list[dict]  # doc_id holds the draft key until ids are assigned
    lookalike_keys: list[int]
    decoy_keys: list[int]


def _question_text(rng: random.Random, path: Sequence[str], start: str) -> str:
    """Compose the question: nested noun phrases for all but the last relation(s), then a frame."""
    pair = tuple(path[-2:])
    use_pair = len(path) >= 2 and pair in PAIR_FRAMES and rng.random() < PAIR_FRAME_PROB
    inner = path[:-2] if use_pair else path[:-1]
    x = start
    for relation in inner:
        x = rng.choice(PHRASES[relation]).format(x=x)
    frames = PAIR_FRAMES[pair] if use_pair else FRAMES[path[-1]]
    return rng.choice(frames).format(x=x)


def _make_question(world: _World, qid: str, path: tuple[str, ...]) -> _Question:
    rng = world.rng
    kind = MAIN_RELATIONS[path[0]][0]
    entity = world.names.new(kind)
    hops: list[tuple[Name, str, str]] = []  # (entity, kind, relation) per hop
    chain: list[dict] = []
    decoys: list[int] = []
    for i, relation in enumerate(path):
        key, value, decoy = world.hop_doc(entity, kind, relation)
        hops.append((entity, kind, relation))
        chain.append({"query": entity.text, "doc_id": key, "relation": relation, "answer": value.text,
                      "distractor_relation": distractor_of(relation), "distractor_answer": decoy.text})
        kind = relation_kinds(relation)[1]
        if i + 1 < len(path):
            # The distractor value is an entity of the same kind: give it a plausible next hop,
            # so an agent that copied it finds a document and answers wrongly but fluently.
            decoys.append(world.hop_doc(decoy, kind, path[i + 1])[0])
        entity = value
    lookalikes = [
        world.hop_doc(world.names.lookalike(e), k, r)[0]
        for e, k, r in rng.sample(hops, min(len(hops), rng.choice(LOOKALIKES_PER_QUESTION)))
    ]
    text = _question_text(rng, path, chain[0]["query"])
    return _Question(qid, path, text, chain[-1]["answer"], chain, lookalikes, decoys)


def _hop_counts(n: int, weights: Sequence[float]) -> list[int]:
    """Exactly n hop counts (1-based) in proportion to weights (largest remainder), unshuffled."""
    total = float(sum(weights))
    if total <= 0 or any(w < 0 for w in weights):
        raise ValueError(f"hop_weights must be non-negative and not all zero, got {tuple(weights)}")
    quotas = [n * w / total for w in weights]
    counts = [int(q) for q in quotas]
    by_remainder = sorted(range(len(weights)), key=lambda h: (-(quotas[h] - counts[h]), h))
    for h in by_remainder[: n - sum(counts)]:
        counts[h] += 1
    return [h + 1 for h, c in enumerate(counts) for _ in range(c)]


def _corpus(world: _World) -> tuple[list[str], list[Document]]:
    """(doc id of each draft key, the corpus): documents shuffled, so a doc's position says nothing."""
    order = list(range(len(world.drafts)))
    world.rng.shuffle(order)
    doc_ids = [""] * len(order)
    for position, key in enumerate(order):
        doc_ids[key] = f"d{position:06d}"
    return doc_ids, [Document(doc_ids[k], world.drafts[k].title, world.drafts[k].text) for k in order]


def _to_record(q: _Question, doc_ids: list[str]) -> QARecord:
    chain = [{**hop, "doc_id": doc_ids[hop["doc_id"]]} for hop in q.chain]
    meta = {
        "kind": kind_id(q.path),
        "chain": chain,
        "distractor_docs": [doc_ids[k] for k in q.lookalike_keys],
        # Docs of the distractor values (not look-alikes): where a wrong copy leads.
        "decoy_docs": [doc_ids[k] for k in q.decoy_keys],
    }
    return QARecord(q.id, q.text, (q.answer,), tuple(h["doc_id"] for h in chain), len(q.path), SOURCE, meta)


def check_hop_weights(hop_weights: Sequence[float]) -> None:
    """Every generator (QA, SQL, mixed) makes 1- to 3-hop questions: one share per hop count."""
    if not 1 <= len(hop_weights) <= 3:
        raise ValueError(f"hop_weights needs 1 to 3 entries, got {len(hop_weights)}")


def draw_splits(rng: random.Random, sizes: Sequence[int], hop_weights: Sequence[float],
                paths_of: Callable[[int], list], make: Callable[[str, int, object], T]) -> dict[str, list[T]]:
    """Every generator's questions (QA, SQL, mixed): for each split of :data:`SPLITS` with
    ``sizes`` questions, its hop counts in the shares ``hop_weights`` in ``rng``'s order, and
    ``make(split, i, path)`` for a path of that many hops (``paths_of(hops)``) drawn by ``rng``."""
    paths = {h: paths_of(h) for h in range(1, len(hop_weights) + 1)}
    splits = {}
    for split, n in zip(SPLITS, sizes):
        hop_list = _hop_counts(n, hop_weights)
        rng.shuffle(hop_list)
        splits[split] = [make(split, i, rng.choice(paths[h])) for i, h in enumerate(hop_list)]
    return splits


def synth_args(cfg) -> dict:
    """A generator's arguments from ``cfg.data.synth`` (each environment's ``generate_from_config``)."""
    s = cfg.data.synth
    return {"seed": s.seed, "n_train": s.n_train, "n_dev": s.n_dev, "n_test": s.n_test, "names": s.names}


def generate(
    seed: int,
    n_train: int = SIZES.n_train,
    n_dev: int = SIZES.n_dev,
    n_test: int = SIZES.n_test,
    hop_weights: Sequence[float] = DEFAULT_HOP_WEIGHTS,
    names: str = DEFAULT_NAMES,
) -> tuple[dict[str, list[QARecord]], list[Document]]:
    """The synthetic dataset for ``seed``: ({"train", "dev", "test"} -> records, corpus); a
    split asked for 0 questions is absent.

    hop_weights[h-1] is the share of h-hop questions (h = 1..len(hop_weights), at most 3);
    ``names`` picks the name inventory (:data:`NAME_INVENTORIES`).
    Byte-identical for a seed; documents are shuffled so a doc's position says nothing.
    """
    check_hop_weights(hop_weights)
    world = _World(seed, names)
    questions = draw_splits(world.rng, (n_train, n_dev, n_test), hop_weights, relation_paths,
                            lambda split, i, path: _make_question(world, f"{split}-{i:05d}", path))
    doc_ids, corpus = _corpus(world)
    # A split with no questions is left out: an empty split file is invalid data.
    splits = {split: [_to_record(q, doc_ids) for q in qs] for split, qs in questions.items() if qs}
    return splits, corpus


# ---------------------------------------------------------------- statistics


def _norm(text: str) -> str:
    return " ".join(text.lower().split())


def majority_baseline_em(train: Sequence[QARecord], test: Sequence[QARecord]) -> float:
    """EM on ``test`` of always answering the most frequent train answer (chance level)."""
    if not train or not test:
        return 0.0
    counts = Counter(_norm(r.answers[0]) for r in train)
    # most_common keeps first-seen order among ties: deterministic.
    guess = counts.most_common(1)[0][0]
    return sum(guess in {_norm(a) for a in r.answers} for r in test) / len(test)


def dataset_stats(splits: dict[str, list[QARecord]], corpus: Sequence[Document]) -> dict:
    """Questions per hop count per split, corpus size, average doc length, chance-level EM."""
    return {
        "splits": {
            name: {"n": len(rs), "hops": {str(h): c for h, c in sorted(Counter(r.hops for r in rs).items())}}
            for name, rs in splits.items()
        },
        "n_docs": len(corpus),
        "avg_doc_words": round(sum(len(d.text.split()) for d in corpus) / max(1, len(corpus)), 2),
        "n_kinds": len({r.meta.get("kind") for rs in splits.values() for r in rs}),
        "majority_answer_em_test": majority_baseline_em(splits.get("train", []), splits.get("test", [])),
    }


def generate_from_config(cfg) -> tuple[dict[str, list[QARecord]], list[Document]]:
    """The ``qa`` environment's generator: :func:`generate` with ``cfg.data.synth``."""
    return generate(**synth_args(cfg))
