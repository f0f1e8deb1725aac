"""What every entry script shares: a user mistake or a stopped run ends in one line on stderr and exit 1."""

import logging
import os
import sys

from absl import flags


def main_wrapper(run):
    """An absl `main(argv)` that runs `run()` and turns a UserError or RunError into `script: error: ...`."""

    def main(argv):
        if len(argv) > 1:
            sys.exit(f"{argv[0]}: error: unexpected arguments {' '.join(argv[1:])}")
        from bert_mgpu.errors import RunError, UserError

        logging.getLogger("bert_mgpu").setLevel(logging.INFO)
        logging.getLogger("tensorflow").setLevel(logging.WARNING)  # per-step tf.distribute INFO lines
        try:
            run()
        except (UserError, RunError) as e:
            print(f"{os.path.basename(argv[0])}: error: {e}", file=sys.stderr)
            sys.exit(1)

    return main


def define_reliability_flags(auto_batch_help):
    """The flags both scripts share for crashes, bad numbers, reruns and memory (README: "When things go
    wrong"). `auto_batch_help` says what --auto_batch_size sizes in that script."""
    flags.DEFINE_bool("deterministic", False, "Deterministic ops: a resumed run ends bit-identical to an "
                      "uninterrupted one (same seed, same devices, a step budget).")
    flags.DEFINE_integer("max_consecutive_skips", 10, "Stop after this many steps in a row with non-finite "
                         "gradients (0: never).")
    flags.DEFINE_bool("overwrite_output_dir", False, "Start over in an --output_dir holding a run with other "
                      "flags (its checkpoints are removed).")
    flags.DEFINE_bool("auto_batch_size", False, auto_batch_help + " (98% of GPU memory, or --memory_limit_mb).")
    flags.DEFINE_integer("memory_limit_mb", None, "--auto_batch_size: memory a training step may take "
                         "(required on CPU: all towers together; on GPU: per tower).")
