"""The two READMEs name flags the scripts have, and the Chinese one names no flag the English one does not."""

import ast
import os
import re

from conftest import ROOT

SCRIPTS = ["run_classifier_mgpu.py", "run_glue_mgpu.py", "run_clue_mgpu.py", "score_text_mgpu.py", "run_ner_mgpu.py",
           "run_squad_mgpu.py", "run_pretraining_mgpu.py", "create_pretraining_data.py", "build_vocab.py",
           "extract_features.py", "predict_exported.py"]
FLAG = re.compile(r"(?<![\w-])--([a-z][a-z0-9_]+)")


def defined_flags():
    """Every flag name a script defines, itself or through bert_mgpu/cli (absl DEFINE_* and DEFINE_alias)."""
    paths = [os.path.join(ROOT, s) for s in SCRIPTS]
    cli = os.path.join(ROOT, "bert_mgpu", "cli")
    paths += [os.path.join(cli, f) for f in os.listdir(cli) if f.endswith(".py")]
    names, patterns = set(), []
    for path in paths:
        for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                    node.func.attr.startswith("DEFINE") and node.args:
                name = node.args[0]
                if isinstance(name, ast.Constant):
                    names.add(name.value)
                elif isinstance(name, ast.JoinedStr):  # f"per_tower_{kind}_batch_size": any value in the braces
                    patterns.append("".join(re.escape(v.value) if isinstance(v, ast.Constant) else "[a-z]+"
                                            for v in name.values))
    return names, patterns


# Flags of other programs the English README shows: srun, saved_model_cli, mlflow, a benchmark's.
OTHERS = {"backend", "dir", "gpus", "model", "ntasks", "resv", "signature_def", "tag_set"}  # srun, saved_model_cli, ...


def mentioned(readme):
    text = open(os.path.join(ROOT, readme), encoding="utf-8").read()
    text = re.sub(r"https?://\S+", "", text)
    return set(FLAG.findall(text))


def test_every_flag_the_readmes_name_is_a_scripts_flag():
    flags, patterns = defined_flags()
    assert {"n_gpus", "word_segmenter", "do_whole_word_mask", "ref_file"} <= flags
    for readme in ("README.md", "README.zh-CN.md"):
        unknown = {f for f in mentioned(readme) - flags - OTHERS if not any(re.fullmatch(p, f) for p in patterns)}
        assert not unknown, f"{readme} names flags no script has: {sorted(unknown)}"


def test_the_chinese_readme_names_the_flags_the_english_one_does():
    zh, en = mentioned("README.zh-CN.md"), mentioned("README.md")
    assert len(zh) > 40
    assert not zh - en, f"README.zh-CN.md names flags README.md does not: {sorted(zh - en)}"
    assert "README.zh-CN.md" in open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
