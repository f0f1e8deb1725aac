"""What a notebook hands `predict` (issue 66, items 8 and 12): every head class takes the same kinds (a value,
a list, a pandas DataFrame) with the same errors, and a text TensorFlow cannot take (a lone surrogate) is one
line naming it, not TensorFlow's ValueError."""

import pandas as pd
import pytest

from bert_mgpu.api import multiple_choice, question_answering
from bert_mgpu.core.errors import UserError
from bert_mgpu.data import examples, inputs, tagged
from bert_mgpu.data.tagging_input import split_words

BROKEN = "a good \ud83d film"  # half of a surrogate pair, as a broken JSON escape leaves it


@pytest.mark.parametrize("read, given, where", [
    (examples.as_examples, [BROKEN], "input 0: a lone surrogate U+D83D at character 7"),
    (examples.as_examples, [("fine", BROKEN)], "input 0's second text: a lone surrogate U+D83D"),
    (examples.as_examples, pd.DataFrame({"text": pd.Series(["fine", BROKEN], dtype=object)}),  # arrow strings refuse it
     "input 1: a lone surrogate U+D83D"),
    (lambda rows: tagged.as_sentences(rows, split_words), ["fine", BROKEN], "input 1: a lone surrogate"),
    (lambda rows: tagged.as_sentences(rows, split_words), [["a", "\udc80"]], "input 0: a lone surrogate U+DC80"),
    (question_answering.as_questions, [("who?", BROKEN)], "question 0's context: a lone surrogate U+D83D"),
    (question_answering.as_questions, [{"id": "q7", "question": BROKEN, "context": "c"}], "question q7: a lone"),
    (multiple_choice.as_questions, [("ctx", "q", ["yes", BROKEN])], "question 0's choice 1: a lone surrogate"),
])
def test_a_lone_surrogate_is_one_line_naming_the_input(read, given, where):
    with pytest.raises(UserError) as raised:
        read(given)
    line = str(raised.value)
    assert line.startswith(where) and "\n" not in line, line


def test_a_dataframe_gives_its_rows_to_every_reader():
    frame = pd.DataFrame({"text": ["Ann went home", "Bob slept"]})
    assert inputs.rows_of(frame) == [{"text": "Ann went home"}, {"text": "Bob slept"}]
    assert [s.tokens for s in tagged.as_sentences(frame, split_words)] == [["Ann", "went", "home"], ["Bob", "slept"]]
    tokens = pd.DataFrame({"tokens": [["Ann", "went"]], "tags": [["B-PER", "O"]]})
    assert [(s.tokens, s.tags) for s in tagged.as_sentences(tokens)] == [(["Ann", "went"], ["B-PER", "O"])]
    squad = pd.DataFrame({"id": ["q1"], "question": ["who?"], "context": ["Ann went home."],
                          "answers": [{"text": ["Ann"], "answer_start": [0]}]})
    (q,) = question_answering.as_questions(squad)
    assert (q.qid, q.question, q.context, q.answers) == ("q1", "who?", "Ann went home.", [("Ann", 0)])
    swag = pd.DataFrame({"sent1": ["She opened"], "sent2": ["the"], "ending0": ["door"], "ending1": ["sky"],
                         "label": [0]})
    (c,) = multiple_choice.as_questions(swag)
    assert (c.context, c.question, c.choices, c.label) == ("She opened", "the", ["door", "sky"], 0)


@pytest.mark.parametrize("given, said", [
    ([(None, "Ann went home.")], "question 0: expected a string, not NoneType"),
    ([("who?", None)], "question 0's context: expected a string, not NoneType"),
    ([{"question": "who?"}], 'question 0: needs "question" and "context" (it has question)'),
    (["who?"], "question 0: expected a Question, a (question, context) pair or a dict, not str"),
    (pd.DataFrame({"query": ["who?"]}), 'question 0: needs "question" and "context" (it has query)'),
])
def test_a_question_of_the_wrong_kind_is_one_line(given, said):
    with pytest.raises(UserError) as raised:
        question_answering.as_questions(given)
    assert str(raised.value) == said


def test_the_tagger_predicts_a_dataframe_as_its_texts(google_release):
    """BertTagger.predict(DataFrame) iterated the column names (one result: the entities of "text")."""
    import bert_mgpu

    towers = bert_mgpu.Towers(n_gpus=0, towers_per_gpu=2)
    tagger = bert_mgpu.BertTagger.from_pretrained(google_release, labels=["O", "B-PER", "I-PER"], towers=towers,
                                                  max_seq_length=16, precision="float32")
    texts = ["the actor was good", "a film", "story"]
    direct = tagger.predict(texts)
    assert len(direct) == 3
    assert tagger.predict(pd.DataFrame({"text": texts})) == direct
    words = [t.split() for t in texts]
    assert tagger.predict(pd.DataFrame({"tokens": words})) == tagger.predict(words)
    with pytest.raises(UserError, match="^input 1: a lone surrogate"):
        tagger.predict(["fine", BROKEN])
