"""Synthetic unanswerable questions: each kind, its label safety, the share asked for, determinism."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from bertzoo.data import QAExample
from bertzoo.qa import normalize_answer
from bertzoo.unanswerable import (
    entity_pool,
    needed_unanswerable,
    negate,
    perturb_question,
    remove_answer_sentences,
    swap_antonym,
    swap_entity,
    swap_entity_within,
    synthesize_unanswerable,
)

PARIS = ("Paris is the capital of France. It has about 2,100,000 inhabitants. The Seine runs through the city "
         "from the east.")
LYON = "Lyon lies on the Rhone. Its Traboules date from 1540, long before Gustave Eiffel."


def _example(qid: str, question: str, answer: str, context: str = PARIS, title: str = "France") -> QAExample:
    return QAExample(id=qid, question=question, context=context, answers=(answer,),
                     answer_starts=(context.index(answer),), is_impossible=False, title=title)


def test_entity_pool_groups_names_and_numbers_by_shape_and_skips_sentence_starts() -> None:
    pool = entity_pool([PARIS, LYON])
    assert "Seine" in pool[("name", 1)] and "Gustave Eiffel" in pool[("name", 2)]
    assert "1540" in pool[("number", 4)] and "2,100,000" in pool[("number", 9)]
    # Sentence-initial words are capitalised whatever they are: "It", "The", "Paris" at the start are not taken.
    assert all(word not in pool[("name", 1)] for word in ("It", "The", "Paris", "Its"))


def test_swap_entity_picks_a_same_shape_name_the_context_never_mentions() -> None:
    pool = entity_pool([PARIS, LYON])
    for seed in range(20):
        question = swap_entity("Which river runs through the city of Paris?", PARIS, [pool], random.Random(seed))
        assert question is not None and "Paris" not in question
        swapped = question.removeprefix("Which river runs through the city of ").removesuffix("?")
        assert len(swapped.split()) == 1 and normalize_answer(swapped) not in normalize_answer(PARIS)
    # A possessive stays a possessive.
    assert swap_entity("What is Lyon's river?", LYON, [{("name", 1): ["Seine"]}], random.Random(0)) == \
        "What is Seine's river?"
    # Nothing to swap for: no name, or every same-shape name occurs in the context.
    assert swap_entity("what river is this?", PARIS, [pool], random.Random(0)) is None
    assert swap_entity("Which city is Seine in?", PARIS, [{("name", 1): ["France", "Seine"]}],
                       random.Random(0)) is None


def test_antonym_and_negation_rewrites() -> None:
    assert swap_antonym("Who was the First king?", random.Random(0)) == "Who was the Last king?"
    assert swap_antonym("Who was the king?", random.Random(0)) is None
    assert negate("What did the city win?") == "What didn't the city win?"
    assert negate("Is Paris big?") == "Isn't Paris big?"
    assert negate("What did the city not win?") is None  # negated already
    assert negate("Who won?") is None  # no auxiliary verb


def test_perturbed_question_differs_and_keeps_context() -> None:
    example = _example("q1", "What did the Seine cross first?", "Seine")
    pools = [entity_pool([PARIS, LYON])]
    rewrites = {perturb_question(example, pools, random.Random(seed)) for seed in range(30)}
    assert None not in rewrites and example.question not in rewrites
    assert any("Rhone" in q or "Traboules" in q or "Gustave" in q or "Lyon" in q for q in rewrites)
    assert any("last" in q for q in rewrites) and any("didn't" in q for q in rewrites)


def test_removed_sentence_context_no_longer_holds_the_answer() -> None:
    context = remove_answer_sentences(_example("q1", "How many live there?", "2,100,000"))
    assert context is not None and "2,100,000" not in context and context.startswith("Paris is the capital")


def test_synthesized_share_kinds_label_safety_and_determinism() -> None:
    questions = [("Which river runs through the city?", "Seine"), ("What is the capital of France?", "Paris"),
                 ("How many inhabitants does the city have?", "2,100,000"), ("From where does the river run?", "east")]
    examples = [_example(f"p{i}", q, a) for i, (q, a) in enumerate(questions)]
    examples += [_example(f"l{i}", q, a, LYON) for i, (q, a) in enumerate(
        [("What river is Lyon on?", "Rhone"), ("When are the Traboules from?", "1540"),
         ("Before whom are the Traboules?", "Gustave Eiffel")])]
    examples *= 4  # more candidates than negatives wanted
    examples = [QAExample(**{**e.__dict__, "id": f"{e.id}-{i}"}) for i, e in enumerate(examples)]
    examples.append(QAExample(id="real", question="Who?", context=PARIS, answers=(), answer_starts=(),
                              is_impossible=True, title="France"))
    made = synthesize_unanswerable(examples, 0.5, seed=3)
    assert len(made) == needed_unanswerable(len(examples), 1, 0.5)
    assert (len(made) + 1) / (len(examples) + len(made)) >= 0.5
    kinds = Counter(e.id.rsplit("-", 1)[-1] for e in made)
    assert kinds["question"] >= len(made) // 3 and kinds["removed"] + kinds["other"] >= len(made) // 3
    by_id = {e.id: e for e in examples}
    for negative in made:
        source = by_id[negative.id.split("-noans-")[0]]
        assert negative.is_impossible and negative.answers == ()
        if negative.id.endswith("-question"):
            assert negative.context == source.context and negative.question != source.question
        else:  # the context changed: the gold answer must be gone from it
            assert negative.question == source.question
            assert normalize_answer(source.answers[0]) not in normalize_answer(negative.context)
    assert [e.__dict__ for e in synthesize_unanswerable(examples, 0.5, seed=3)] == [e.__dict__ for e in made]
    assert synthesize_unanswerable(examples, 0.0, seed=3) == []


def test_close_swap_takes_a_same_shape_name_from_the_paragraph_the_question_does_not_name() -> None:
    context = "In 1889 Gustave Eiffel built the tower. In 2006 Jean Nouvel drew the museum for Jacques Chirac."
    rewrites = {swap_entity_within("What did Gustave Eiffel build in 1889?", context, random.Random(seed))
                for seed in range(30)}
    assert rewrites == {"What did Jean Nouvel build in 1889?", "What did Jacques Chirac build in 1889?",
                        "What did Gustave Eiffel build in 2006?"}
    # Nothing of the same shape in the paragraph but the question's own entity.
    assert swap_entity_within("What did Lyon build?", "The city of Lyon built it.", random.Random(0)) is None


def test_close_other_paragraph_is_the_one_sharing_most_words_with_the_question() -> None:
    near = "The river that runs through the city of Lyon is the Rhone."
    unrelated = ["Wine is sold in small shops.", "Silk was woven there for centuries.", "Tourists visit in June."]
    questions = [("Which river runs through the city?", "Seine"), ("What is the capital of France?", "Paris"),
                 ("From where does the river run through the city?", "east")]
    examples = [_example(f"p{i}", q, a) for i, (q, a) in enumerate(questions)]
    examples += [_example(f"o{i}", "What is sold?", text.split()[0], text) for i, text in enumerate([near, *unrelated])]
    examples = [QAExample(**{**e.__dict__, "id": f"{e.id}-{i}"}) for i, e in enumerate(examples * 6)]
    examples.append(QAExample(id="real", question="Who?", context=PARIS, answers=(), answer_starts=(),
                              is_impossible=True, title="France"))
    made = {style: {e.id.split("-noans-")[0]: e.context
                    for e in synthesize_unanswerable(examples, 0.5, seed=1, style=style) if e.id.endswith("-other")}
            for style in ("far", "close")}
    river = [source for source in made["close"] if "river" in _question_of(examples, source)]
    assert river and all(made["close"][source] == near for source in river)
    assert set(made["far"].values()) - {near}  # far draws any other paragraph
    for source, context in made["close"].items():  # still label-safe
        answer = next(e.answers[0] for e in examples if e.id == source)
        assert normalize_answer(answer) not in normalize_answer(context)


def _question_of(examples: list[QAExample], source_id: str) -> str:
    return next(e.question for e in examples if e.id == source_id)


def test_kinds_choose_what_is_made_and_unknown_ones_are_refused() -> None:
    examples = [_example(f"p{i}", q, a) for i, (q, a) in enumerate(
        [("Which river runs through the city?", "Seine"), ("How many inhabitants does the city have?", "2,100,000")])]
    examples += [_example("l0", "What river is Lyon on?", "Rhone", LYON)]
    examples = [QAExample(**{**e.__dict__, "id": f"{e.id}-{i}"}) for i, e in enumerate(examples * 4)]
    examples.append(QAExample(id="real", question="Who?", context=PARIS, answers=(), answer_starts=(),
                              is_impossible=True, title="France"))
    for kinds in (("removed",), ("question",), ("removed", "other")):
        made = synthesize_unanswerable(examples, 0.5, seed=2, kinds=kinds)
        assert made and {e.id.rsplit("-", 1)[-1] for e in made} <= set(kinds)
    for bad in ((), ("removed", "paraphrased")):
        with pytest.raises(ValueError, match="kinds must be some of"):
            synthesize_unanswerable(examples, 0.5, kinds=bad)
