"""Tokenizer parity with transformers' BertTokenizer (itself a port of google-bert's FullTokenizer)."""

import os

import pytest

from bert_mgpu.core.errors import UserError
from bert_mgpu.data.tokenization import FullTokenizer, read_vocab

TEXTS = [
    "Hello, World! It's a test-case: (x+y)=z; $100 & 50% off... ~`^_|\\ @#",
    "Café naïve résumé Ærøskøbing Straße ÉCOLE ÀÉÎÕÜ Ελληνικά Кириллица İstanbul",
    "我爱北京天安门，天安门上太阳升。日本語のテキストと한국어",
    "don't stop—believing… “quotes” «guillemets» ¿qué? ¡sí! ﬁ ligature Ⅻ ½",
    "emoji 😀 tab\there\u00a0nbsp zero\u200bwidth ctrl\x07char\u2003em x\ufffdy \x00z",
    "a" * 120 + " supercalifragilisticexpialidocious",
    "   ",
]


@pytest.mark.parametrize("lower", [True, False])
def test_same_tokens_as_transformers(reference, minilm_dir, lower):
    from transformers import BertTokenizer

    vocab = os.path.join(minilm_dir, "vocab.txt")
    ref, ours = BertTokenizer(vocab, do_lower_case=lower), FullTokenizer(vocab, do_lower_case=lower)
    for text in TEXTS:
        assert ours.tokenize(text) == ref.tokenize(text), text
    if lower:  # keras-hub alone would case-fold ß to ss; Google keeps ß
        assert ours.tokenize("Straße") == ["st", "##raße"]


def test_ids_and_specials(minilm_dir):
    tok = FullTokenizer(os.path.join(minilm_dir, "vocab.txt"))
    assert (tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id, tok.mask_id) == (0, 100, 101, 102, 103)
    assert tok.vocab_size == 30522
    assert tok.convert_tokens_to_ids(tok.tokenize("hello world")) == [7592, 2088]


def test_eager_calls_take_the_tf_data_path(minilm_dir):
    """Called eagerly, keras-hub's tokenizer would run its Python path; ours runs the graph tf.data runs."""
    import tensorflow as tf

    tok = FullTokenizer(os.path.join(minilm_dir, "vocab.txt"))
    eager = tok(tf.constant(TEXTS))
    assert isinstance(eager, tf.RaggedTensor)
    in_data = next(iter(tf.data.Dataset.from_tensors(tf.constant(TEXTS)).map(tok)))
    assert eager.to_list() == in_data.to_list() == tok.id_lists(TEXTS)
    assert tok.id_lists(["", "hello world"]) == [[], [7592, 2088]]


def test_vocab_without_bert_specials_is_refused(tmp_path):
    p = tmp_path / "vocab.txt"
    p.write_text("hello\nworld\n")
    with pytest.raises(UserError, match=r"vocab.txt: vocabulary has no \[UNK\] token"):
        read_vocab(str(p))


def test_tokenizers_of_one_vocabulary_share_their_traced_functions(tmp_path):
    """A model loaded again in a process (a notebook's next fit) tokenizes with the functions traced the
    first time; another vocabulary or casing gets its own; only the last SHARED_VOCABULARIES are kept."""
    from conftest import write_vocab

    from bert_mgpu.data import input_pipeline, tokenization

    paths = []
    for i, words in enumerate((["good", "bad"], ["good", "bad"], ["film", "plot"])):
        paths.append(str(tmp_path / f"vocab{i}.txt"))
        write_vocab(paths[-1], words)
    first, again, other = (FullTokenizer(p) for p in paths)
    cased = FullTokenizer(paths[0], do_lower_case=False)
    assert again.pieces is first.pieces and again.vocab_file == paths[1]  # its own file, for export
    assert other.pieces is not first.pieces and cased.pieces is not first.pieces
    examples = [_example(text, label) for label, text in [("pos", "good film"), ("neg", "bad plot , bad")]]
    token_ids = [[b[0]["token_ids"].numpy().tolist() for b in input_pipeline.make_dataset(
        examples, tok, ["neg", "pos"], 16, 2, training=False)] for tok in (first, again)]
    encode_fn = input_pipeline.traced_encode(first, 16, False)
    assert input_pipeline.traced_encode(again, 16, False) is encode_fn
    assert encode_fn.experimental_get_tracing_count() == 1  # the second tokenizer's dataset traced nothing
    good, bad = first.id_lists(["good film", "bad plot , bad"])
    rows = [[first.cls_id, *ids, first.sep_id] for ids in (good, bad)]
    assert token_ids[0] == token_ids[1] == [[row + [first.pad_id] * (8 - len(row)) for row in rows]]  # width 8
    for i in range(tokenization.SHARED_VOCABULARIES):
        write_vocab(str(tmp_path / f"more{i}.txt"), [f"w{i}"])
        FullTokenizer(str(tmp_path / f"more{i}.txt"))
    assert FullTokenizer(paths[0]).pieces is not first.pieces  # pushed out by four newer ones


def _example(text, label):
    import bert_mgpu

    return bert_mgpu.Example(text, text, label=label)
