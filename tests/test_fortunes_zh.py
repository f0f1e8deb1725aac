"""data/prepare_fortunes_zh.py: fortunes-zh's files -> the Chinese demo's task and corpus (make zh-demo)."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "data", "prepare_fortunes_zh.py")


def fortune(path, entries):
    """A fortune file as fortunes-zh ships it: ANSI colours, entries between lines of '%'."""
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n%\n".join(entries) + "\n%\n")


def test_collections_become_a_labelled_task_without_titles_or_authors(tmp_path):
    src = tmp_path / "fortunes"
    src.mkdir()
    poems = [f"\x1b[32m《诗{i}》\x1b[m\n\x1b[33m作者：李白\x1b[m\n床前明月光{i}，\n疑是地上霜。" for i in range(40)]
    fortune(src / "tang300", poems)
    fortune(src / "song100", [f"题目:《村行》\n作者:王禹偁（９５４－１００１）\n\n    其一\n马穿山径菊初黄{i}。"
                              for i in range(20)])
    fortune(src / "chinese", [f"要有礼貌{i}\n\n    -- Debian 《行为准则》" for i in range(60)])
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, SCRIPT, str(src), str(out)], capture_output=True, text=True, check=True)
    rows = []
    for split in ("train", "dev", "test"):
        lines = (out / f"{split}.tsv").read_text(encoding="utf-8").splitlines()
        assert lines[0] == "label\ttext"
        rows += [line.split("\t") for line in lines[1:]]
    assert len(rows) == 120 and {label for label, _ in rows} == {"tang300", "song100", "chinese"}
    texts = {label: [t for lab, t in rows if lab == label] for label in ("tang300", "song100", "chinese")}
    assert "床前明月光0， / 疑是地上霜。" in texts["tang300"]  # lines joined; title, author, colours gone
    assert "马穿山径菊初黄0。" in texts["song100"]  # 题目, 作者 and 其一 gone
    assert "要有礼貌0 / -- Debian 《行为准则》" in texts["chinese"]  # a quotation's source is its text
    assert not any("\x1b" in t or "作者" in t for t in texts["tang300"] + texts["song100"])
    train = (out / "train.tsv").read_text(encoding="utf-8").count("\n") - 1
    assert (out / "pretrain.txt").read_text(encoding="utf-8").count("\n\n") == train  # training entries only
    assert f"train={train} " in done.stdout
    (tmp_path / "eval.txt").write_text("eval_accuracy = 0.9\neval_f1_macro = 0.6\n")
    report = subprocess.run([sys.executable, SCRIPT, "--report", str(out), str(tmp_path / "eval.txt")],
                            capture_output=True, text=True, check=True).stdout
    dev = [line.split("\t")[0] for line in (out / "dev.tsv").read_text(encoding="utf-8").splitlines()[1:]]
    share = max(dev.count(c) for c in set(dev)) / len(dev)
    assert report.startswith(f"dev ({len(dev)} entries): accuracy 0.900, macro F1 0.600; always ")
    assert f"accuracy {share:.3f}, macro F1 {2 * share / (1 + share) / len(set(dev)):.3f}" in report
