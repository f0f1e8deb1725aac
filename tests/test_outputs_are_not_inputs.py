"""A script never writes over what it reads: an output path naming an input file, or a link to one, is refused
in one line before any work, and the input keeps its bytes (issue 66, item 1)."""

import os

import pytest
from conftest import run_script, write_vocab

TEXT = "the movie was good .\nit was very dull .\n\nthe plot , the actor !\n"


@pytest.mark.parametrize("script, flag, link", [
    ("build_vocab.py", "output_file", False),
    ("create_pretraining_data.py", "output_file", False),
    ("create_pretraining_data.py", "output_file", True),
    ("score_text_mgpu.py", "output_file", False),
    ("extract_features.py", "output_file", False),
    ("extract_features.py", "output_npy", True),
])
def test_an_output_that_is_an_input_is_refused_and_the_input_kept(script, flag, link, google_release, tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(TEXT)
    target = corpus
    if link:  # another name for the same file
        target = tmp_path / "out.link"
        os.symlink(corpus, target)
    args = {"build_vocab.py": ["--vocab_size=50"],
            "create_pretraining_data.py": [f"--vocab_file={google_release}/vocab.txt", "--max_seq_length=16"],
            "score_text_mgpu.py": [f"--init_checkpoint={google_release}"],
            "extract_features.py": [f"--init_checkpoint={google_release}"]}[script]
    proc = run_script(script, f"--input_file={corpus}", f"--{flag}={target}", *args, check=False)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines()[-1] == (
        f"{script}: error: --{flag}={target} is the file --input_file={corpus} names: writing it would replace "
        "the input; give another output name")
    assert corpus.read_text() == TEXT


def test_create_pretraining_data_refuses_to_write_over_its_vocabulary(tmp_path):
    corpus, vocab = tmp_path / "corpus.txt", tmp_path / "vocab.txt"
    corpus.write_text(TEXT)
    tokens = write_vocab(str(vocab))
    proc = run_script("create_pretraining_data.py", f"--input_file={corpus}", f"--output_file={vocab}",
                      f"--vocab_file={vocab}", check=False)
    assert proc.returncode == 1 and proc.stderr.strip().splitlines()[-1].endswith(
        f"--output_file={vocab} is the file --vocab_file={vocab} names: writing it would replace the input; give "
        "another output name")
    assert vocab.read_text().split("\n")[:-1] == tokens
