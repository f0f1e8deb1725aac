"""make ner-demo's data: reST roles become entity tags (data/prepare_python_ner.py), and its baseline."""

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data"))
import prepare_python_ner as prepare  # noqa: E402

PAGE = """\
:mod:`json` --- JSON encoder
============================

The :mod:`json` module exposes an API. Use :func:`~json.dumps` with
:class:`io.StringIO` here.

.. function:: loads(s)

   Deserialize *s* to a Python object; it raises :exc:`ValueError` and
   :meth:`str.split <str.split>` returns ``None`` too.

   :param s: the text

Example::

   json.loads(":func:`not` prose")

The :c:func:`PyObject_Call` function is C, so this paragraph goes.

* Read :attr:`x.real` first, then see :ref:`the tutorial <tut>`.
"""


def test_roles_become_tags_and_code_is_left_out():
    found = [s for p in prepare.paragraphs(PAGE) for s in prepare.tagged_sentences(p)]
    tagged = [list(zip(words, tags)) for words, tags in found]
    entities = [[(w, t) for w, t in s if t != "O"] for s in tagged]
    assert entities == [
        [("json", "B-MOD")],  # the title
        [("json", "B-MOD")],
        [("dumps", "B-FUNC"), ("io.StringIO", "B-CLASS")],  # ~json.dumps shows its last name
        [("ValueError", "B-EXC"), ("str.split", "B-FUNC")],  # the body of a function
        [("x.real", "B-ATTR")],  # a bullet item
    ]
    assert ("None", "O") in tagged[3] and ("s", "O") in tagged[3]  # a literal and emphasis: plain words
    assert [w for w, _ in tagged[4]][-3:] == ["the", "tutorial", "."]  # :ref: shows its text, tagged O
    words = {w for s in found for w in s[0]}
    assert "PyObject_Call" not in words and "not" not in words and "param" not in words  # C, code, fields


def test_the_dictionary_baseline_tags_every_training_string_wherever_it_appears():
    train = [(["the", "json", "module"], ["O", "B-MOD", "O"]), (["call", "json", "now"], ["O", "B-FUNC", "O"]),
             (["in", "json"], ["O", "B-MOD"]), (["os", ".", "path", "here"], ["B-MOD", "I-MOD", "I-MOD", "O"])]
    test = [(["json", "and", "os", ".", "path"], ["B-MOD", "O", "B-MOD", "I-MOD", "I-MOD"]),
            (["call", "json"], ["O", "B-FUNC"])]
    scores = prepare.dictionary_baseline(train, test)
    # json is MOD twice, FUNC once: tagged MOD everywhere; os . path as one entity, the longest match.
    assert scores["precision"] == pytest.approx(2 / 3) and scores["recall"] == pytest.approx(2 / 3)
