"""How every head opens `--init_checkpoint`: one path from any checkpoint bert_mgpu reads to a head's model
(issue 67), so a head never opens checkpoints itself (tests/test_heads.py holds them to it).
"""

import dataclasses
import logging

from bert_mgpu.io.loading import Opened, open_checkpoint

log = logging.getLogger("bert_mgpu")


@dataclasses.dataclass
class Opening:
    """What `open_head` found: the checkpoint opened, whether it is this head kind's own run (`own`: its head
    is restored from it), that run's bert_mgpu.json (`run`, {} otherwise), the window length chosen, and once
    `build` has run, the model built on the towers with its encoder in it and the checkpoint's names the
    encoder did not use."""

    opened: Opened
    own: bool
    run: dict
    max_seq_length: int
    model: object = None
    unused: list = dataclasses.field(default_factory=list)

    def build(self, build):
        """The model `build(config, policy)` on the towers, the encoder's weights in it, with a warning when
        the checkpoint has none."""
        self.model, self.unused = self.opened.build(build)
        if not self.opened.has_weights:
            log.warning("no --init_checkpoint: the encoder starts from random weights (%s). Fine-tuning needs a "
                        "pretrained BERT to learn much; run_pretraining_mgpu.py makes one", self.opened.pretrained.path)
        return self.model


def open_head(kind, init_checkpoint, build=None, max_seq_length=None, default_length=128, towers=None,
              precision="auto", do_lower_case=None, bert_config_file=None, vocab_file=None):
    """The one way every head's `from_pretrained` opens a checkpoint (any format bert_mgpu reads; a run of this
    `kind` gives its own window length unless one is given) and builds its model: `build(config, policy)`
    now, or, for a head whose shape depends on the checkpoint (its labels, a CRF), later by `Opening.build`.
    The head is then the caller's to restore or load."""
    opened = open_checkpoint(init_checkpoint, towers, precision, do_lower_case, bert_config_file, vocab_file,
                             config_alone=True)
    run = opened.pretrained.run_of(kind)  # a run directory's or one of its ckpt-N prefixes'
    max_seq_length = int(max_seq_length or (run or {}).get("max_seq_length") or default_length)
    opened.config.check_seq_length(max_seq_length)
    opening = Opening(opened, run is not None, run or {}, max_seq_length)
    if build is not None:
        opening.build(build)
    return opening
