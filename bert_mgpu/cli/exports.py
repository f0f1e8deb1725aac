"""The scripts' --do_export: its flags, the targets checked before any training (`export_targets`,
`check_exports`), and the exports written after it (`run_exports`), each stamped with the run, format,
precision and weights that made it, so that a rerun keeps this run's export and never another's."""

import os

from absl import flags


def define_export_flags():
    """--do_export and its settings, the same in both scripts (README: "Serving and export")."""
    flags.DEFINE_bool("do_export", False, "Export the trained model (after training, or alone: the model in "
                      "--init_checkpoint or --output_dir).")
    flags.DEFINE_string("export_dir", None, "Exports go to EXPORT_DIR/FORMAT, each a new directory (default: "
                        "OUTPUT_DIR/export).")
    flags.DEFINE_list("export_format", ["saved_model"], "saved_model (TensorFlow Serving, raw text in), hf "
                      "(transformers), google (google-bert's bert_model.ckpt), keras_hub, onnx (ONNX Runtime, ids in), "
                      "onnx_int8 (the same, int8 weights), tflite (LiteRT, ids in, int8 weights); comma-separated.")
    flags.DEFINE_enum("export_precision", "float32", ["float32", "mixed_bfloat16", "mixed_float16"],
                      "saved_model: the precision the served graph computes in.")
    flags.DEFINE_bool("allow_approximate_export", False, "keras_hub: write it even where keras-hub's BERT "
                      "computes other outputs (tanh-GELU, NFKC lower-casing); the difference is logged.")


EXPORT_STAMP = ".bert_mgpu_stamp.json"  # in each export: which run, format, precision, step and weights made it


def _stamp(f, fmt, step, weights=None):
    return {"output_dir": os.path.realpath(f.output_dir) if f.output_dir else None, "format": fmt,
            "precision": f.export_precision, "step": step, "weights_sha256": weights}


def _stamp_of(directory):
    from bert_mgpu.core import storage

    path = os.path.join(directory, EXPORT_STAMP)
    stamp = storage.read_json(path) if storage.exists(path) else None
    return stamp if isinstance(stamp, dict) else None


_WHERE = ("output_dir", "format", "precision")  # what makes an export this run's, whatever its weights


def export_targets(f, output_dir):
    """[(format, directory)] the export flags ask for; checked before any training, so a long run cannot
    end in an export that was never possible. A directory holding this run's own export of the format
    (a rerun of the same command) is kept for `run_exports` to judge."""
    from bert_mgpu.core.errors import UserError
    from bert_mgpu.io.export import FORMATS, check_new_dir
    from bert_mgpu.io.onnx_export import check_available

    if not f.do_export:
        return []
    base = f.export_dir or (output_dir and os.path.join(output_dir, "export"))
    if not base:
        raise UserError("--do_export needs --export_dir or --output_dir")
    from bert_mgpu.io.output_dir import check_output_dir

    check_output_dir(base, "--export_dir" if f.export_dir else "--output_dir")  # a read-only disk, at once
    targets = []
    for fmt in f.export_format:
        if fmt not in FORMATS:
            raise UserError(f"--export_format={fmt}: expected one of {', '.join(FORMATS)}")
        check_available(fmt)
        target = os.path.join(base, fmt)
        stamp, mine = _stamp_of(target) or {}, _stamp(f, fmt, None)
        targets.append((fmt, target if all(stamp.get(k) == mine[k] for k in _WHERE) else check_new_dir(target)))
    return targets


def check_exports(source, targets):
    """Every export format asked (`export_targets`), checked against the model itself before any training:
    what only the model can say (a CRF's hf export, an ELECTRA sentence head's, a pre-LN encoder's) is then
    refused in one line at the start, not after the run."""
    if not targets:
        return
    from bert_mgpu.io.export import as_trained, check_format

    trained = as_trained(source)
    for fmt, _ in targets:
        check_format(trained, fmt)


def run_exports(f, source, targets, texts=None):
    """Export `source` (a model in memory or a directory) to each target; prints where each went.

    A target already holding this run's export of the same weights is done (a rerun of a finished command).
    One of this run's directory but other weights (the run went on, or started over) is replaced with
    --overwrite_output_dir and refused without it: the stamp's weights digest, not the step, decides, so a
    run started over that reaches the same step never keeps the old run's export."""
    import json

    from bert_mgpu.core import storage
    from bert_mgpu.core.errors import UserError
    from bert_mgpu.io import run_dir
    from bert_mgpu.io.export import as_trained, check_format, export_model

    if not targets:
        return
    step = getattr(source, "global_step", None)
    if step is None and isinstance(source, str):
        step = (run_dir.read_run(source) or {}).get("global_step") if storage.isdir(source) else None
    trained = as_trained(source)
    for fmt, _ in targets:  # every format before the first is written
        check_format(trained, fmt)
    digest = trained.digest()
    for fmt, target in targets:
        stamp, mine = _stamp_of(target), _stamp(f, fmt, step, digest)
        if stamp is not None and stamp == mine:
            print(f"export: {fmt} -> {target} (already there, from step {step})")
            continue
        if stamp is not None:
            if not getattr(f, "overwrite_output_dir", False):
                raise UserError(f"{target}: holds an earlier export of this run directory (step {stamp.get('step')}, "
                                f"other weights than the model's now, at step {step}); remove it, or pass "
                                "--overwrite_output_dir to replace it")
            print(f"export: {fmt} -> {target} (replacing the export of step {stamp.get('step')}: "
                  "--overwrite_output_dir)")
        export_model(trained, target, fmt, f.export_precision, f.allow_approximate_export, texts,
                     extra_files={EXPORT_STAMP: json.dumps(mine) + "\n"}, replace=stamp is not None)
        print(f"export: {fmt} -> {target}")
