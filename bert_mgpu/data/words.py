"""A raw text's words as google-bert's BasicTokenizer splits them (white space; punctuation and each CJK
character apart), with their character offsets, so that tags found on the words map back to the text. No
TensorFlow: a tagger's ONNX or LiteRT export uses it where TensorFlow is not installed.

Example:
    split_words("张三在北京") -> [("张", 0, 1), ("三", 1, 2), ("在", 2, 3), ("北", 3, 4), ("京", 4, 5)]
"""

import unicodedata

from bert_mgpu.core.entities import entities


def is_cjk(char):
    """google-bert's _is_chinese_char: the CJK Unified Ideograph blocks, each character a word."""
    code = ord(char)
    return (0x4E00 <= code <= 0x9FFF or 0x3400 <= code <= 0x4DBF or 0x20000 <= code <= 0x2A6DF
            or 0x2A700 <= code <= 0x2B81F or 0x2B820 <= code <= 0x2CEAF or 0xF900 <= code <= 0xFAFF
            or 0x2F800 <= code <= 0x2FA1F)


def _stands_alone(char):
    """Punctuation (google-bert's: ASCII symbols and Unicode P*) and CJK characters are words by themselves."""
    code = ord(char)
    return (33 <= code <= 47 or 58 <= code <= 64 or 91 <= code <= 96 or 123 <= code <= 126
            or unicodedata.category(char).startswith("P") or is_cjk(char))


def split_words(text):
    """A raw text's words with their character offsets -> [(word, start, end)], split as google-bert's
    BasicTokenizer splits (white space; punctuation and each CJK character apart), so entities found on
    the words map back to the text."""
    words, start = [], None
    for i, char in enumerate([*text, " "]):
        if char.isspace() or _stands_alone(char):
            if start is not None:
                words.append((text[start:i], start, i))
                start = None
            if not char.isspace() and i < len(text):
                words.append((char, i, i + 1))
        elif start is None:
            start = i
    return words


def entity_dicts(row, words, tags):
    """The entities of one input's tags, a word each -> [{"type", "text", "start", "end"}]: for a raw text
    (`words` its `split_words`), character offsets into it (end exclusive); for a list of tokens (`words`
    None), token indices, the text the tokens joined by a space."""
    out = []
    for kind, start, end in entities(tags):
        if words is None:
            out.append({"type": kind, "text": " ".join(row[start:end]), "start": start, "end": end})
        else:
            first, last = words[start][1], words[end - 1][2]
            out.append({"type": kind, "text": row[first:last], "start": first, "end": last})
    return out
