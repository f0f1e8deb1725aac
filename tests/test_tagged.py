"""NER files as people have them, read into sentences of tokens and tags; bad input is one line naming the
file and line."""

import json

import pytest

from bert_mgpu.core.errors import UserError
from bert_mgpu.data.tagged import detect_format, read_tagged, tag_set

CONLL = """-DOCSTART- -X- -X- O

EU NNP B-NP B-ORG
rejects VBZ B-VP O
German JJ B-NP B-MISC
call NN I-NP O
. . O O

Peter NNP B-NP B-PER
Blackburn NNP I-NP I-PER
"""


def test_conll_2003_columns_with_docstart_and_a_blank_line_between_sentences(tmp_path):
    (tmp_path / "train.txt").write_text(CONLL)
    first, second = read_tagged(str(tmp_path / "train.txt"))
    assert first.tokens == ["EU", "rejects", "German", "call", "."] and first.line == 3
    assert first.tags == ["B-ORG", "O", "B-MISC", "O", "O"] and first.guid == "train-0"
    assert second.tokens == ["Peter", "Blackburn"] and second.tags == ["B-PER", "I-PER"] and second.line == 9
    chunks = read_tagged(str(tmp_path / "train.txt"), tag_column=2)[0].tags
    assert chunks == ["B-NP", "B-VP", "B-NP", "I-NP", "O"]  # --tag_column picks another column
    assert tag_set([first, second]) == ["O", "B-MISC", "B-ORG", "B-PER", "I-PER"]


def test_chinese_a_character_a_line_and_an_untagged_test_file(tmp_path):
    (tmp_path / "train.txt").write_text("海 O\n钓 O\n比 O\n赛 O\n地 O\n点 O\n在 O\n厦 B-LOC\n门 I-LOC\n\n"
                                        "中 B-ORG\n共 E-ORG\n")
    (tmp_path / "test.txt").write_text("海\n钓\n\n厦\n门\n")
    a, b = read_tagged(str(tmp_path / "train.txt"))
    assert "".join(a.tokens) == "海钓比赛地点在厦门" and a.tags[-2:] == ["B-LOC", "I-LOC"]
    assert b.tags == ["B-ORG", "E-ORG"]  # BIOES read as it is
    test = read_tagged(str(tmp_path / "test.txt"))
    assert [s.tokens for s in test] == [["海", "钓"], ["厦", "门"]] and all(s.tags is None for s in test)


def test_segmented_words_become_character_tags_through_the_tag_map(tmp_path):
    (tmp_path / "train.txt").write_text(
        "19980101-01-001-002/m  中共中央/nt  总书记/n  、/w  国家/n  主席/n  江/nr  泽民/nr\n"
        "[中央/n  人民/n  广播/vn  电台/n]nt  记者/n  在/p  北京/ns  报道/v\n")
    assert detect_format(str(tmp_path / "train.txt")) == "segmented"
    first, second = read_tagged(str(tmp_path / "train.txt"), tag_map={"nr": "PER", "ns": "LOC", "nt": "ORG"})
    assert "".join(first.tokens) == "中共中央总书记、国家主席江泽民"  # the article number is not text
    assert first.tags[:5] == ["B-ORG", "I-ORG", "I-ORG", "I-ORG", "O"]
    assert first.tags[-3:] == ["B-PER", "B-PER", "I-PER"]  # 江/nr 泽民/nr: two words, two entities
    assert "".join(second.tokens[:8]) == "中央人民广播电台" and second.tags[:8] == ["B-ORG"] + ["I-ORG"] * 7
    assert second.tags[second.tokens.index("北"):][:2] == ["B-LOC", "I-LOC"]
    assert set(read_tagged(str(tmp_path / "train.txt"))[0].tags) == {"O"}  # no map: nothing is an entity
    (tmp_path / "short.txt").write_text("中共中央/nt  总书记/n\n江/nr\n北京/ns  报道/v  新闻/n\n")  # README's example
    assert detect_format(str(tmp_path / "short.txt")) == "segmented"  # was conll: a first line of 2 items
    assert [len(s.tokens) for s in read_tagged(str(tmp_path / "short.txt"))] == [7, 1, 6]
    (tmp_path / "conll.txt").write_text("海 O\n钓 O\n\nand/or O\n")  # a tag column is never word/pos
    assert detect_format(str(tmp_path / "conll.txt")) == "conll"


def test_cluener_json_and_token_json_lines(tmp_path):
    rows = [{"text": "浙商银行企业信贷部叶老桂博士", "label": {"name": {"叶老桂": [[9, 11]]},
                                                       "company": {"浙商银行": [[0, 3]]}}},
            {"text": "生生不息"}]
    (tmp_path / "dev.json").write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in rows) + "\n")
    assert detect_format(str(tmp_path / "dev.json")) == "cluener"
    tagged, untagged = read_tagged(str(tmp_path / "dev.json"))
    assert tagged.tags[:5] == ["B-company", "I-company", "I-company", "I-company", "O"]
    assert tagged.tags[9:12] == ["B-name", "I-name", "I-name"] and untagged.tags is None
    (tmp_path / "train.jsonl").write_text(json.dumps({"tokens": ["New", "York"], "tags": ["B-LOC", "I-LOC"]}) + "\n")
    assert detect_format(str(tmp_path / "train.jsonl")) == "jsonl"
    assert read_tagged(str(tmp_path / "train.jsonl"))[0].tags == ["B-LOC", "I-LOC"]


@pytest.mark.parametrize("name, text, fmt, expected", [
    ("train.txt", "EU B-ORG\nrejects O X\n", "conll", r"train.txt:2: 3 columns but line 1 has 2"),
    ("train.txt", "EU B-ORG\nrejects Q-ORG\n", "conll", r"train.txt:2: tag 'Q-ORG' is not O or one of B/I/E/S/L/U"),
    ("train.txt", "EU B-ORG\n", "conll5", r"--data_format=conll5: expected auto or one of conll, segmented"),
    ("train.txt", "中共/nt 中央/n 北京/ns\n[中央/n 人民/n 广播/vn\n", "segmented",
     r"train.txt:2: a \[ compound opened on this line never closes"),
    ("dev.json", '{"text": "浙商银行", "label": {"company": {"浙商银行": [[0, 2]]}}}\n', "cluener",
     r"dev.json:1: company '浙商银行' at \[0, 2\] is '浙商银' in the text"),
    ("train.jsonl", '{"tokens": ["a", "b"], "tags": ["O"]}\n', "jsonl", r"train.jsonl:1: 1 tags for 2 tokens"),
    ("train.txt", "EU\x00 B-ORG\n", "auto", r"train.txt:1: NUL byte"),
])
def test_bad_input_names_the_file_and_line(tmp_path, name, text, fmt, expected):
    (tmp_path / name).write_text(text)
    with pytest.raises(UserError, match=expected):
        read_tagged(str(tmp_path / name), data_format=fmt)
