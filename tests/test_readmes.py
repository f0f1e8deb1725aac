"""The READMEs and docs/ pages name flags the scripts have, the Chinese README no flag the English pages do not,
and every link between the pages reaches its file and heading."""

import ast
import os
import re

from conftest import ROOT

from bert_mgpu.cli.flags_reference import SCRIPTS  # found, as setup.py finds its entry points

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
OTHERS = {"backend", "dir", "gpus", "model", "ntasks", "resv", "signature_def", "tag_set",  # srun, saved_model_cli, ...
          "helpfull",  # absl's
          "trick", "head"}  # benchmarks/tricks.py's


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
    zh = mentioned("README.zh-CN.md")
    en = set().union(*(mentioned(page) for page in _pages() if page != "README.zh-CN.md"))  # README and docs/
    assert len(zh) > 40
    assert not zh - en, f"README.zh-CN.md names flags the English pages do not: {sorted(zh - en)}"
    assert "README.zh-CN.md" in open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()


def _anchor(heading):
    """GitHub's anchor of a Markdown heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _pages():
    docs = os.path.join(ROOT, "docs")
    return ["README.md", "README.zh-CN.md"] + [os.path.join("docs", f) for f in sorted(os.listdir(docs))
                                               if f.endswith(".md")]


def test_every_link_between_the_pages_reaches_a_file_and_heading():
    """README.md, README.zh-CN.md and docs/*.md: each relative link names a file of the repository, and each
    #anchor a heading of its page."""
    broken = []
    for page in _pages():
        text = open(os.path.join(ROOT, page), encoding="utf-8").read()
        text = re.sub(r"```.*?```", "", text, flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"https?:|mailto:", target):
                continue
            path, _, anchor = target.partition("#")
            full = os.path.normpath(os.path.join(ROOT, os.path.dirname(page), path)) if path else \
                os.path.join(ROOT, page)
            if not os.path.exists(full):
                broken.append(f"{page}: {target} (no such file)")
            elif anchor and full.endswith(".md"):
                body = re.sub(r"```.*?```", "", open(full, encoding="utf-8").read(), flags=re.S)
                headings = {_anchor(h) for h in re.findall(r"^#+ (.+)$", body, flags=re.M)}
                if anchor not in headings:
                    broken.append(f"{page}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


def test_the_documentation_pages_name_only_the_scripts_flags_and_the_readme_lists_every_page():
    flags, patterns = defined_flags()
    readme = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    assert len(readme.splitlines()) <= 300  # a user's page; the rest is in docs/
    for page in _pages()[2:]:
        unknown = {f for f in mentioned(page) - flags - OTHERS if not any(re.fullmatch(p, f) for p in patterns)}
        assert not unknown, f"{page} names flags no script has: {sorted(unknown)}"
        if os.path.basename(page) != "README.md":
            assert f"({page})" in readme, f"README.md does not link {page}"


def test_the_notes_index_lists_every_item():
    import importlib.util

    spec = importlib.util.spec_from_file_location("notes_index", os.path.join(ROOT, "benchmarks", "notes_index.py"))
    notes_index = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(notes_index)
    text = open(notes_index.NOTES, encoding="utf-8").read()
    numbers = [n for n, _, _ in notes_index.items(text)]
    assert len(numbers) > 70 and len(set(numbers)) == len(numbers)
    assert notes_index.with_index(text) == text, "run `python benchmarks/notes_index.py`"


def test_the_flags_reference_is_the_scripts_own_help():
    """docs/flags.md is what `python -m bert_mgpu.cli.flags_reference` writes from the flags' definitions."""
    from bert_mgpu.cli.flags_reference import reference

    assert {"run_classifier_mgpu.py", "run_ner_mgpu.py", "run_distill_ner_mgpu.py", "build_vocab.py"} <= set(SCRIPTS)
    with open(os.path.join(ROOT, "docs", "flags.md"), encoding="utf-8") as f:
        assert f.read() == reference(), "run `python -m bert_mgpu.cli.flags_reference > docs/flags.md`"


def test_the_flags_reference_takes_defaults_from_absl_not_from_the_help():
    """The default column is absl's own quoted default; a help's words "(default: half a window)" for a flag
    whose default is None stay in the help (they once became the column: "half a window). (an integer")."""
    from bert_mgpu.cli.flags_reference import flags_of

    rows = {name: (default, text) for name, default, text in flags_of("run_ner_mgpu.py")}
    assert rows["doc_stride"] == ("", "WordPieces between the starts of a long sentence's windows (default: half a "
                                  "window).")
    assert rows["max_seq_length"][0] == "128"
    assert rows["labels"][0] == "" and rows["labels"][1].endswith("(default: the tags of the training data).")



def test_setup_installs_every_script_the_flags_reference_lists():
    """setup.py's console scripts and docs/flags.md's scripts come from one rule (a top-level .py file with a
    `_console()`): a new script joins both without a list edited by hand."""
    source = open(os.path.join(ROOT, "setup.py"), encoding="utf-8").read()
    found = {"__file__": os.path.join(ROOT, "setup.py")}
    exec(source.split("\nsetup(")[0], found)  # setup.py up to its setup() call
    assert sorted(found["SCRIPTS"]) == sorted(s[:-3] for s in SCRIPTS) and len(SCRIPTS) >= 14
