"""Task sampling, resumable batch streams, sharding across processes, and collation."""

from __future__ import annotations

import collections

import pytest

from bertzoo.backbone import resolve_backbone
from bertzoo.datafiles import load_split
from bertzoo.tasks import Limits
from bertzoo.tokenization import Tokenizer
from bertzoo.trainer.batches import Feature, TaskStream, build_features, collate, steps_per_epoch, task_for_step


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


def test_steps_per_epoch():
    assert steps_per_epoch([10, 5], batch_size=4) == 3 + 2
    assert steps_per_epoch([10, 5], batch_size=2, world_size=2) == 5


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
