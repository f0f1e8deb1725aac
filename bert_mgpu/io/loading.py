"""One loader behind every `from_pretrained` (classifier, pretrainer, encoder): a checkpoint in any format
`checkpoints.load_pretrained` reads, its tokenizer, the checks every model makes, the precision, and a model
built on the towers with the checkpoint's encoder in it. What differs between them is the model they build
and what they do with heads.

Example:
    opened = open_checkpoint("uncased_L-12_H-768_A-12", towers, max_seq_length=128)
    model, unused = opened.build(lambda config, policy: build_classifier(config, 2, policy))
"""

import dataclasses
import logging

from bert_mgpu.data.tokenization import FullTokenizer
from bert_mgpu.io import checkpoints
from bert_mgpu.model.config import BertConfig
from bert_mgpu.parallel.devices import Towers
from bert_mgpu.parallel.precision import resolve_precision

log = logging.getLogger("bert_mgpu")


@dataclasses.dataclass
class Opened:
    """A checkpoint (or a config alone) ready to build a model from.

    Args:
        config: the `BertConfig`.
        tokenizer: its `FullTokenizer`.
        towers: the `Towers` models are built on.
        policy: the Keras dtype policy they compute in.
        pretrained: what `checkpoints.load_pretrained` read; None for a model from a config alone.
    """

    config: BertConfig
    tokenizer: FullTokenizer
    towers: Towers
    policy: str
    pretrained: checkpoints.Pretrained | None = None

    @property
    def weights(self):
        """{Google name: array} of the checkpoint ({} from a config alone)."""
        return self.pretrained.weights if self.has_weights else {}

    @property
    def has_weights(self):
        return self.pretrained is not None and self.pretrained.layout != "config"

    def build(self, make, encoder=lambda model: model.backbone):
        """`make(config, policy)` built in the towers' strategy scope, the checkpoint's encoder assigned to
        `encoder(model)`. Returns (model, the checkpoint's names the encoder did not use)."""
        with self.towers.strategy.scope():
            model = make(self.config, self.policy)
        if not self.has_weights:
            return model, []
        unused = checkpoints.assign_encoder(encoder(model), self.weights, self.pretrained.path)
        log.info("loaded %s checkpoint %s (%d encoder tensors)", self.pretrained.layout, self.pretrained.path,
                 len(encoder(model).weights))
        return model, unused


def open_checkpoint(init_checkpoint: str, towers: Towers | None = None, precision: str = "auto",
                    do_lower_case: bool | None = None, bert_config_file: str | None = None,
                    vocab_file: str | None = None, max_seq_length: int | None = None,
                    config_alone: bool = False) -> Opened:
    """Read `init_checkpoint` (see `checkpoints.load_pretrained`; `config_alone`: a bert_config.json and
    vocab.txt without weights will do) and check it can serve `max_seq_length` with its vocabulary.

    do_lower_case None: what the checkpoint says, else True; one that contradicts the checkpoint is logged.
    """
    pre = checkpoints.load_pretrained(init_checkpoint, bert_config_file, vocab_file, config_alone=config_alone)
    if do_lower_case is not None and pre.do_lower_case is not None and bool(pre.do_lower_case) != bool(do_lower_case):
        log.warning("--do_lower_case=%s but %s was trained with do_lower_case=%s",
                    do_lower_case, init_checkpoint, pre.do_lower_case)
    opened = open_config(pre.config, pre.vocab_file, pre.lower_case(do_lower_case), towers, precision,
                         max_seq_length)
    opened.pretrained = pre
    return opened


def open_config(config: BertConfig, vocab_file: str, do_lower_case: bool = True, towers: Towers | None = None,
                precision: str = "auto", max_seq_length: int | None = None) -> Opened:
    """A model of `config` with fresh weights (pretraining from scratch), checked as `open_checkpoint` checks."""
    towers = towers or Towers()
    if max_seq_length is not None:
        config.check_seq_length(max_seq_length)
    tokenizer = FullTokenizer(vocab_file, do_lower_case)
    config.check_vocab(vocab_file, tokenizer.vocab_size)
    policy, why = resolve_precision(precision, towers.plan)
    log.info("precision: %s (%s)", policy, why)
    return Opened(config, tokenizer, towers, policy)
