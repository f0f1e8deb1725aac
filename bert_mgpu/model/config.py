"""BertConfig: google-research/bert's bert_config.json (Hugging Face's config.json uses the same keys), and
the two BERTs it also describes: ELECTRA's discriminator (narrower embeddings projected to the hidden width) and
ALBERT (the same projection, and layers shared in groups)."""

import dataclasses
import json
import logging

from bert_mgpu.core import storage
from bert_mgpu.core.errors import UserError


@dataclasses.dataclass(frozen=True)
class BertConfig:
    """The shape of a BERT: google-research/bert's `bert_config.json`, whose keys it reads and writes.

    Args:
        vocab_size: WordPiece vocabulary size (must match vocab.txt).
        hidden_size: width of every layer.
        num_hidden_layers: transformer layers.
        num_attention_heads: heads per attention layer (divides hidden_size).
        intermediate_size: width of the feed-forward layer.
        hidden_act: `gelu` (exact, erf), `gelu_new` / `gelu_pytorch_tanh` (tanh form), `relu`.
        hidden_dropout_prob: dropout after embeddings and each sub-layer.
        attention_probs_dropout_prob: dropout on attention probabilities.
        max_position_embeddings: the longest sequence.
        type_vocab_size: segment ids.
        initializer_range: stddev of the truncated-normal initializer.
        encoder_ln_mode: `post-ln` (BERT's) or `pre-ln` (LayerNorm before each sub-layer, for training
            from scratch at high learning rates).
        model_type: `bert`; `electra`: an ELECTRA discriminator (Google's and HFL's releases, transformers'
            ElectraModel), which has no pooler ([CLS]'s output is its pooled output, as google-research/electra
            fine-tunes) and, when `embedding_size` is not `hidden_size`, a projection after the embeddings;
            `albert`: ALBERT (Google's releases, transformers' AlbertModel): that projection always, and
            `num_hidden_groups` x `inner_group_num` layers run `num_hidden_layers` times in all.
        embedding_size: the embeddings' width (ELECTRA's and ALBERT's); None: hidden_size.
        num_hidden_groups, inner_group_num: ALBERT's groups of shared layers, and layers in a group. Pass i
            of num_hidden_layers runs group i // (num_hidden_layers / num_hidden_groups), each of its layers.

    Example:
        config = BertConfig.from_json_file("uncased_L-12_H-768_A-12/bert_config.json")
        small = BertConfig(vocab_size=8000, hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                           intermediate_size=1024)
    """

    vocab_size: int
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    initializer_range: float = 0.02
    # bert_mgpu's addition: "pre-ln" normalizes before each sub-layer (stabler from scratch at high LR,
    # as academic-budget-bert and Cramming train); Google's and Hugging Face's configs lack it: post-ln.
    encoder_ln_mode: str = "post-ln"
    model_type: str = "bert"
    embedding_size: int = None
    num_hidden_groups: int = 1
    inner_group_num: int = 1

    @classmethod
    def from_dict(cls, d, source="config"):
        if d.get("model_type", "bert") not in FAMILIES:
            raise UserError(f"{source}: model_type={d['model_type']!r} is not BERT, ELECTRA or ALBERT")
        other = _other_family(d)
        if other:
            raise UserError(f"{source}: {other}, not BERT; it does not load here (transformers or bert4keras "
                            "read it)")
        if "num_hidden_groups" in d or "inner_group_num" in d:
            d = {**d, "model_type": "albert"}  # Google's ALBERT configs say so by these keys alone
        elif d.get("embedding_size") not in (None, d.get("hidden_size")):
            d = {**d, "model_type": "electra"}  # HFL's TF releases: a BERT config with ELECTRA's embedding_size
        fields = {f.name: f for f in dataclasses.fields(cls)}
        missing = [n for n, f in fields.items() if f.default is dataclasses.MISSING and n not in d]
        if missing:
            raise UserError(f"{source}: missing {', '.join(missing)}; is this a BERT config?")
        try:
            values = {n: fields[n].type(d[n]) if fields[n].type in (int, float, str) else d[n]
                      for n in fields if n in d and d[n] is not None}
        except (TypeError, ValueError) as e:
            raise UserError(f"{source}: bad value ({e})") from None
        config = cls(**values)
        config.validate(source)
        return config

    @classmethod
    def from_json_file(cls, path):
        d = storage.read_json(path)
        if not isinstance(d, dict):
            raise UserError(f"{path}: not a JSON object")
        return cls.from_dict(d, source=path)

    def validate(self, source="config"):
        if self.model_type not in FAMILIES:
            raise UserError(f"{source}: model_type={self.model_type!r}: expected one of {', '.join(FAMILIES)}")
        if self.model_type == "bert" and self.embedding_width != self.hidden_size:
            raise UserError(f"{source}: embedding_size={self.embedding_size} differs from "
                            f"hidden_size={self.hidden_size}, which only ELECTRA and ALBERT can have (model_type)")
        if self.model_type != "albert" and (self.num_hidden_groups, self.inner_group_num) != (1, 1):
            raise UserError(f"{source}: num_hidden_groups and inner_group_num are ALBERT's (model_type albert)")
        if self.model_type == "albert":
            if self.embedding_width == self.hidden_size:
                raise UserError(f"{source}: an ALBERT whose embedding_size is its hidden_size "
                                f"({self.hidden_size}) is not supported: ALBERT's releases project narrower embeddings")
            if min(self.num_hidden_groups, self.inner_group_num) < 1 or \
                    self.num_hidden_layers % self.num_hidden_groups:
                raise UserError(f"{source}: num_hidden_layers={self.num_hidden_layers} is not a multiple of "
                                f"num_hidden_groups={self.num_hidden_groups}")
            if self.encoder_ln_mode != "post-ln":
                raise UserError(f"{source}: ALBERT is post-LN")
        if self.encoder_ln_mode not in ("post-ln", "pre-ln"):
            raise UserError(f"{source}: encoder_ln_mode={self.encoder_ln_mode!r}: expected post-ln or pre-ln")
        from bert_mgpu.model.kernels import ACTIVATIONS

        if self.hidden_act not in ACTIVATIONS:
            raise UserError(f"{source}: hidden_act={self.hidden_act!r} is not supported "
                            f"(one of {', '.join(ACTIVATIONS)})")
        if self.hidden_size % self.num_attention_heads:
            raise UserError(
                f"{source}: hidden_size={self.hidden_size} is not divisible by "
                f"num_attention_heads={self.num_attention_heads}"
            )
        for name in ("vocab_size", "hidden_size", "num_hidden_layers", "intermediate_size",
                     "max_position_embeddings", "type_vocab_size"):
            if getattr(self, name) < 1:
                raise UserError(f"{source}: {name} must be positive")

    @property
    def embedding_width(self):
        return self.embedding_size or self.hidden_size

    @property
    def has_pooler(self):
        """BERT's tanh pooler (ALBERT's too); an ELECTRA discriminator has none (its [CLS] output is pooled)."""
        return self.model_type != "electra"

    @property
    def layer_count(self):
        """The encoder's distinct layers: ALBERT's groups x inner layers, else num_hidden_layers."""
        return self.num_hidden_groups * self.inner_group_num if self.model_type == "albert" else self.num_hidden_layers

    @property
    def schedule(self):
        """The distinct layer each pass runs, in order (ALBERT's sharing; else each layer once)."""
        if self.model_type != "albert":
            return tuple(range(self.num_hidden_layers))
        per_group = self.num_hidden_layers // self.num_hidden_groups
        return tuple(i // per_group * self.inner_group_num + j for i in range(self.num_hidden_layers)
                     for j in range(self.inner_group_num))

    def check_vocab(self, vocab_file, vocab_size):
        """A vocabulary larger than the embedding table cannot be used with this model; a smaller one can
        (Google's multilingual release pads its table) but is worth a word: often the wrong vocab.txt."""
        if vocab_size > self.vocab_size:
            raise UserError(f"{vocab_file}: {vocab_size} tokens but the model config has "
                            f"vocab_size={self.vocab_size}; vocabulary and checkpoint do not match")
        if vocab_size < self.vocab_size:
            logging.getLogger("bert_mgpu").warning(
                "%s: %d tokens but the model config has vocab_size=%d; the last %d embedding rows are never "
                "used. Is it the vocabulary the checkpoint was trained with?", vocab_file, vocab_size,
                self.vocab_size, self.vocab_size - vocab_size)

    def check_seq_length(self, max_seq_length):
        if max_seq_length < 3:
            raise UserError(f"--max_seq_length={max_seq_length}: must be at least 3 ([CLS], a token, [SEP])")
        if max_seq_length > self.max_position_embeddings:
            raise UserError(f"--max_seq_length={max_seq_length} is over the model's position table "
                            f"(max_position_embeddings={self.max_position_embeddings})")

    def to_dict(self):
        """The config's keys; BERT's leave out the other families' (ELECTRA's leaves out ALBERT's), so its files
        stay google-bert's."""
        d = dataclasses.asdict(self)
        if self.model_type != "albert":
            del d["num_hidden_groups"], d["inner_group_num"]
        if self.model_type == "bert":
            del d["model_type"], d["embedding_size"]
        return d

    def to_json_file(self, path):
        storage.write_atomic(path, json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n")


FAMILIES = ("bert", "electra", "albert")


def _other_family(d):
    """What a config of a BERT-like family that bert_mgpu cannot load says about itself (the Chinese
    releases ship them as bert_config.json too), or None."""
    if "ln_type" in d:
        return ("brightmart's albert_zh config (ln_type: its checkpoints keep one layer_shared, not Google's ALBERT "
                "names)")
    if d.get("use_relative_position") or "max_relative_position" in d:
        return "a NEZHA config (use_relative_position: relative position encodings)"
    return None
