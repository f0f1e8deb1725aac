"""JSON of the wrong shape through the readers (issue 66, item 13): each is one line naming the file, the
record and what is wrong, never a traceback (AttributeError, TypeError, ValueError from deep in a reader)."""

import json

import pytest

from bert_mgpu.core.errors import UserError
from bert_mgpu.data import choices, squad, tagged

GOOD_QA = {"id": "q1", "question": "who?", "answers": [{"text": "Ann", "answer_start": 0}]}


def squad_file(data):
    return json.dumps({"version": "1.1", "data": data})


def paragraphs(value):
    return squad_file([{"title": "t", "paragraphs": value}])


def qas(value):
    return paragraphs([{"context": "Ann went home.", "qas": value}])


def cluener(label):
    return json.dumps({"text": "Ann went home", "label": label}, ensure_ascii=False)


CASES = {  # name: (reader, file text, what the line says)
    # CLUENER: {"text": ..., "label": {type: {entity: [[start, end], ...]}}}
    "cluener label a list": ("cluener", cluener([["name", 0, 2]]), '"label" is a JSON list, not an object'),
    "cluener label a string": ("cluener", cluener("name"), '"label" is a JSON string, not an object'),
    "cluener type a list": ("cluener", cluener({"name": [[0, 2]]}), "label 'name' holds a JSON list, not an object"),
    "cluener type a string": ("cluener", cluener({"name": "Ann"}), "label 'name' holds a JSON string"),
    "cluener spans a string": ("cluener", cluener({"name": {"Ann": "0,2"}}), "name 'Ann': expected a list of"),
    "cluener span not a pair": ("cluener", cluener({"name": {"Ann": [[0]]}}), "name 'Ann': expected a list of"),
    "cluener span of strings": ("cluener", cluener({"name": {"Ann": [["0", "2"]]}}), "[start, end] integer pairs"),
    "cluener span of booleans": ("cluener", cluener({"name": {"Ann": [[False, True]]}}), "[start, end] integer"),
    # JSONL: {"tokens": [...], "tags": [...]}
    "jsonl tag a number": ("jsonl", json.dumps({"tokens": ["Ann", "went"], "tags": [1, "O"]}),
                           '"tags" must be strings, and 1 is not'),
    "jsonl tag null": ("jsonl", json.dumps({"tokens": ["Ann"], "tags": [None]}), '"tags" must be strings'),
    # SQuAD: {"data": [{"paragraphs": [{"context", "qas": [{"id", "question", "answers": [{...}]}]}]}]}
    "squad article a number": ("squad", squad_file([1]), "article 0 is a JSON number, not an object"),
    "squad article a string": ("squad", squad_file(["x"]), "article 0 is a JSON string, not an object"),
    "squad paragraphs a string": ("squad", paragraphs("Ann went home."),
                                  "article 0's \"paragraphs\" is a JSON string, not a list"),
    "squad paragraph a number": ("squad", paragraphs([1]), "article 0, paragraph 0 is a JSON number, not an object"),
    "squad qas an object": ("squad", qas(GOOD_QA), "article 0, paragraph 0's \"qas\" is a JSON object, not a list"),
    "squad question a string": ("squad", qas(["who?"]), "article 0, paragraph 0, question 0 is a JSON string"),
    "squad answers an object": ("squad", qas([{**GOOD_QA, "answers": {"text": "Ann", "answer_start": 0}}]),
                                "question q1's \"answers\" must be a list of objects"),
    "squad answer a string": ("squad", qas([{**GOOD_QA, "answers": ["Ann"]}]),
                              "question q1's \"answers\" must be a list of objects"),
    # C3: [[paragraphs], [questions], id]; CHID: {"candidates": [...], "content": [paragraphs]}
    "c3 paragraph a number": ("c3", json.dumps([[[1, "B: hi"], [{"question": "q", "choice": ["a", "b"],
                                                                   "answer": "a"}], "1"]]),
                              "item 0: its paragraphs must be strings, and one is a JSON number"),
    "chid paragraph a list": ("chid", json.dumps({"candidates": ["一", "二"], "content": [["#idiom000001#"]]}),
                              '"content" paragraph 0 is a JSON list, not a string'),
}

READERS = {"cluener": lambda p: tagged.read_tagged(p, "cluener"), "jsonl": lambda p: tagged.read_tagged(p, "jsonl"),
           "squad": lambda p: squad.read_squad(p), "c3": choices.read_c3, "chid": choices.read_chid}


@pytest.mark.parametrize("name", CASES)
def test_a_malformed_json_shape_is_one_line_naming_file_record_and_what(tmp_path, name):
    reader, text, said = CASES[name]
    path = tmp_path / f"{reader}.json"
    path.write_text(text + "\n", encoding="utf-8")
    with pytest.raises(UserError) as raised:
        READERS[reader](str(path))
    line = str(raised.value)
    assert line.startswith(str(path)) and "\n" not in line, line
    assert said in line, line
    if reader in ("cluener", "jsonl", "chid"):  # one record a line: the line is named
        assert line.startswith(f"{path}:1:"), line
