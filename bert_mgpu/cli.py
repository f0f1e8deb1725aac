"""What every entry script shares: a user mistake or a stopped run ends in one line on stderr and exit 1."""

import logging
import os
import sys


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
