"""A WordPiece vocabulary (google-bert's vocab.txt format) learned from raw text, for from-scratch runs.

keras-hub's `compute_word_piece_vocabulary` (tf-text's learner) does the learning. Around it: the text
goes through the same Google normalization the tokenizer applies (tokenization.normalize), lines are
streamed with tf.data rather than whole files read into memory, and CJK characters are split one per
word, as google-bert's BasicTokenizer splits them, so Chinese and Japanese text gives character
tokens. The special tokens come first: [PAD]=0, [UNK]=1, [CLS]=2, [SEP]=3, [MASK]=4.

Example:
    build_vocab(["corpus.txt"], vocab_size=8000, output_file="vocab.txt", do_lower_case=True)
"""

import tensorflow as tf

from bert_mgpu.errors import UserError
from bert_mgpu.pretraining_input import expand_files
from bert_mgpu.tokenization import SPECIAL_TOKENS, normalize


def build_vocab(input_files, vocab_size, output_file, do_lower_case=True):
    """Learn a vocabulary of at most `vocab_size` tokens and write it; returns the token list."""
    import keras_hub

    files = expand_files(input_files)
    if vocab_size <= len(SPECIAL_TOKENS):
        raise UserError(f"--vocab_size={vocab_size}: must be above the {len(SPECIAL_TOKENS)} special tokens")
    lines = tf.data.TextLineDataset(files).batch(1024).map(lambda t: normalize(t, do_lower_case))
    vocab = keras_hub.tokenizers.compute_word_piece_vocabulary(
        lines, vocab_size, lowercase=False, strip_accents=False, split=True, split_on_cjk=True,
        suffix_indicator="##", reserved_tokens=list(SPECIAL_TOKENS))
    if len(vocab) <= len(SPECIAL_TOKENS):
        raise UserError(f"{', '.join(files)}: no words to learn a vocabulary from")
    from bert_mgpu.outputs import write_atomic

    write_atomic(output_file, "".join(t + "\n" for t in vocab))
    return vocab
