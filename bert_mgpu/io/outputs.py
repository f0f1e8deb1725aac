"""Result files, written atomically (temporary file, then rename) so a crash never leaves half a file:
eval_results.txt (google-research/bert's `key = value` lines), the summary block, the pictures. What the
prediction files hold is each head kind's (objectives.py); they are written as one set (storage.write_set).
"""

import os

from bert_mgpu.core import storage
from bert_mgpu.core.storage import write_atomic
from bert_mgpu.io.checkpoint_files import found_damaged


def summary(title, facts, output_dir):
    """The block a run ends with: `facts` (name -> value, None left out), then every file and directory
    in `output_dir` with what it is."""
    width = max((len(k) for k, v in facts.items() if v is not None), default=0)  # the lines shown
    lines = [f"== {title} =="]
    lines += [f"  {k.ljust(width)}  {v:.4g}" if isinstance(v, float) else f"  {k.ljust(width)}  {v}"
              for k, v in facts.items() if v is not None]
    names = sorted(os.path.basename(p.rstrip("/")) for p in storage.glob(os.path.join(output_dir, "*")))
    shown = [n for n in names if not n.startswith(("ckpt-", ".")) and n != "checkpoint"]
    latest = sorted((n[: -len(".index")] for n in names if n.startswith("ckpt-") and n.endswith(".index")),
                    key=lambda n: int(n.split("-")[1]), reverse=True)
    damaged = [n for n in latest if found_damaged(os.path.join(output_dir, n))]
    readable = [n for n in latest if n not in damaged]
    if readable:
        shown.insert(0, readable[0] + (" (latest readable checkpoint)" if damaged else " (latest checkpoint)"))
    shown[:0] = [f"{n} (damaged: not read)" for n in damaged]
    lines.append(f"  outputs in {output_dir}: " + ", ".join(f"{n}{'/' if _is_dir(output_dir, n) else ''}"
                                                           for n in shown))
    return "\n".join(lines)


def _is_dir(directory, name):
    return " " not in name and storage.isdir(os.path.join(directory, name))


def draw(what, *args):
    """`bert_mgpu.io.plot.<what>(*args)` when matplotlib is installed (it is never needed for training);
    otherwise one line saying how to get the pictures."""
    import logging

    try:
        import matplotlib  # noqa: F401
    except ImportError:
        logging.getLogger("bert_mgpu").warning("no %s: matplotlib is not installed (pip install matplotlib; "
                                               "then python -m bert_mgpu.io.plot OUTPUT_DIR)", what)
        return None
    from bert_mgpu.io import plot

    return getattr(plot, what)(*args)


def write_eval_results(output_dir, results, report=None):
    """google-bert's `key = value` lines; with `report` ({label: (precision, recall, F1, support)}) a
    `report_<label>_<measure>` line each after them."""
    lines = "".join(f"{k} = {results[k]}\n" for k in sorted(results))
    for label, values in (report or {}).items():
        lines += "".join(f"report_{label}_{name} = {value}\n"
                         for name, value in zip(("precision", "recall", "f1", "support"), values))
    return write_atomic(os.path.join(output_dir, "eval_results.txt"), lines)


