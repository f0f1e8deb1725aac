"""The masking flags create_pretraining_data.py and run_pretraining_mgpu.py share (README: "Chinese")."""

from absl import flags


def define_masking_flags(text_input_only=False):
    """--do_whole_word_mask, --word_segmenter, --ref_file, --max_ngram_size, --span_masking; `text_input_only`: say in
    their help that they act on --input_format=text (records were masked when they were written)."""
    where = "text input: " if text_input_only else ""
    flags.DEFINE_bool("do_whole_word_mask", False, f"{where}Mask a word's tokens together (its ## pieces; Chinese "
                      "words with --word_segmenter).")
    flags.DEFINE_enum("word_segmenter", "none", ["none", "jieba", "pretokenized"], f"{where}Where Chinese words "
                      "begin, for whole-word masking: jieba, or words already separated by spaces (pretokenized). "
                      "Implies --do_whole_word_mask.")
    flags.DEFINE_list("ref_file", None, f"{where}Where Chinese words begin, as transformers' run_chinese_ref.py "
                      "writes it: one file an --input_file, in their order (instead of --word_segmenter). Implies "
                      "--do_whole_word_mask.")
    flags.DEFINE_integer("max_ngram_size", 1, f"{where}Mask runs of 1..N words (tokens without whole-word "
                         "masking) together, a run of n with probability proportional to 1/n.")
    flags.DEFINE_bool("span_masking", False, f"{where}Mask one contiguous span of words a sequence, as long as "
                      "the masked share allows.")


def mask_plan(f):
    """The flags -> masking.MaskPlan (a UserError for contradictory ones)."""
    from bert_mgpu.core.errors import UserError
    from bert_mgpu.data.masking import MaskPlan

    if f.ref_file and f.word_segmenter != "none":
        raise UserError("--ref_file and --word_segmenter both say where words begin; pick one")
    return MaskPlan(f.do_whole_word_mask or f.word_segmenter != "none" or bool(f.ref_file),
                    f.max_ngram_size, f.span_masking)


def settings(f):
    """The masking flags a resumed run must keep: {} when they are the defaults (runs from before them)."""
    plan = mask_plan(f)
    if plan == type(plan)():
        return {}
    words = f"ref_file={','.join(f.ref_file)}" if f.ref_file else f"word_segmenter={f.word_segmenter}"
    return {"masking": f"whole_word={plan.whole_word} {words} "
                       f"max_ngram_size={plan.max_ngram_size} span={plan.span}"}
