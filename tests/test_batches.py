"""Task sampling, resumable batch streams, sharding across processes, and collation."""

from __future__ import annotations

import collections

import pytest

from bertzoo.backbone import resolve_backbone
from bertzoo.datafiles import load_split
from bertzoo.tasks import Limits
from bertzoo.tokenization import Tokenizer
from bertzoo.trainer.batches import Feature, TaskStream, build_features, collate, task_for_step


@pytest.fixture(scope="module")
def tokenizer():
    return Tokenizer.from_file(resolve_backbone().tokenizer_path)


def test_round_robin_cycles_tasks():
    tasks = ["a", "b", "c"]
    assert [task_for_step(s, tasks, [1, 1, 1], "round_robin", 10, 0) for s in range(6)] == tasks * 2


def test_proportional_follows_sizes_and_annealed_flattens_late():
    tasks, sizes = ["big", "small"], [900, 100]
    draws = collections.Counter(task_for_step(s, tasks, sizes, "proportional", 4000, 0) for s in range(4000))
    assert 0.87 < draws["big"] / 4000 < 0.93
    total = 4000
    late = collections.Counter(task_for_step(s, tasks, sizes, "annealed", total, 0, 0.2) for s in range(3000, 4000))
    # alpha near 0.2 at the end: P(big) ~ 900**0.2 / (900**0.2 + 100**0.2) ~ 0.61 (well below 0.9)
    assert 0.5 < late["big"] / 1000 < 0.72
    assert task_for_step(17, tasks, sizes, "annealed", total, 0) == task_for_step(17, tasks, sizes, "annealed", total, 0)


def features(n: int) -> list[Feature]:
    return [Feature((), (float(i),)) for i in range(n)]


def test_stream_resumes_exactly_and_reshuffles_each_pass():
    a = TaskStream("sentiment", features(10), batch_size=3, seed=5)
    seen = [f.target[0] for _ in range(3) for f in a.next_features()]
    assert len(set(seen)) == 9, "one pass must not repeat items"
    state = a.state_dict()
    expected = [[f.target for f in a.next_features()] for _ in range(4)]
    b = TaskStream("sentiment", features(10), batch_size=3, seed=5)
    b.load_state_dict(state)
    assert [[f.target for f in b.next_features()] for _ in range(4)] == expected
    assert a.passes >= 1


def test_ranks_split_the_global_batch():
    single = TaskStream("qa", features(50), batch_size=8, seed=1)
    ranks = [TaskStream("qa", features(50), batch_size=4, seed=1, rank=r, world_size=2) for r in range(2)]
    for _ in range(5):
        whole = sorted(f.target for f in single.next_features())
        parts = [f.target for r in ranks for f in r.next_features()]
        assert sorted(parts) == whole and len(set(parts)) == 8


def test_collate_pairs_and_qa(tokenizer, samples):
    limits = Limits(max_seq_length=32, qa_max_length=96, qa_doc_stride=32)
    pairs = build_features("similarity", load_split(samples, "similarity", "train")[:5], tokenizer, limits)
    batch = collate("similarity", pairs, tokenizer.pad_id)
    assert batch["input_ids"].shape[0] == 10 and batch["labels"].shape == (5,)
    assert batch["input_ids"].shape[1] <= 32
    assert float(batch["labels"].max()) <= 5.0
    qa_examples = load_split(samples, "qa", "train")[:6]
    qa = build_features("qa", qa_examples, tokenizer, limits)
    assert len(qa) >= 6  # long contexts make several windows
    qa_batch = collate("qa", qa, tokenizer.pad_id)
    starts, ends = qa_batch["start_positions"], qa_batch["end_positions"]
    assert ((starts <= ends) & (starts >= 0)).all()
    answerable = [e for e in qa_examples if not e.is_impossible]
    assert answerable and (starts > 0).any(), "answerable questions must point inside some window"


def sized(widths: list[int]) -> list[Feature]:
    from bertzoo.tokenization import Encoding

    return [Feature((Encoding([1] * w, [0] * w),), (float(i),)) for i, w in enumerate(widths)]


def test_fixed_batches_per_pass():
    assert TaskStream("sentiment", features(10), batch_size=4, seed=0).batches_per_pass == 3
    assert TaskStream("sentiment", features(10), batch_size=2, seed=0, world_size=2).batches_per_pass == 3


def test_length_grouped_batches_fill_the_token_budget_cover_each_item_once_and_resume():
    widths = [3 + (i * 7919) % 60 for i in range(500)]
    stream = TaskStream("sentiment", sized(widths), batch_size=4, seed=3, batch_tokens=200)
    n = stream.batches_per_pass
    batches = [stream.next_indices() for _ in range(n)]
    assert sorted(i for b in batches for i in b) == list(range(500)), "one pass = every item once"
    for b in batches:
        tokens = len(b) * max(widths[i] for i in b)
        assert tokens <= 200 or len(b) == 4, (len(b), tokens)
    runs = -(-500 // (TaskStream.GROUP_BATCHES * 4))
    assert sum(len(b) < 4 for b in batches) <= runs, "only a run's last batch may hold fewer than batch_size"
    assert max(len(b) for b in batches) >= 20, "short items travel many to a batch"
    assert stream.sampling_size == n * 4
    state = stream.state_dict()
    ahead = [stream.next_indices().tolist() for _ in range(n + 3)]  # across a pass boundary
    again = TaskStream("sentiment", sized(widths), batch_size=4, seed=3, batch_tokens=200)
    again.load_state_dict(state)
    assert [again.next_indices().tolist() for _ in range(n + 3)] == ahead
    assert stream.passes >= 1 and ahead[:n] != [b.tolist() for b in batches], "each pass is reshuffled"


def test_length_grouped_pairs_count_both_sentences_and_ranks_split_evenly():
    widths = [10] * 64
    pairs = [Feature((f.encodings[0], f.encodings[0]), f.target) for f in sized(widths)]
    alone = TaskStream("similarity", pairs, batch_size=2, seed=0, batch_tokens=100)
    assert len(alone.next_indices()) == 5  # 5 pairs x 2 sentences x 10 tokens
    ranks = [TaskStream("similarity", pairs, batch_size=2, seed=0, rank=r, world_size=2, batch_tokens=100)
             for r in range(2)]
    for _ in range(ranks[0].batches_per_pass):
        parts = [r.next_indices() for r in ranks]
        assert len(parts[0]) >= 1 and abs(len(parts[0]) - len(parts[1])) <= 1
        assert not set(parts[0]) & set(parts[1])
