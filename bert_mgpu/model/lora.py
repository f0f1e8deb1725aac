"""Low-rank adapters (LoRA, Hu et al. 2021) on the encoder's dense kernels, the encoder frozen, as PEFT has them.

Each adapted kernel W [in, out] (an attention kernel seen as google-bert's 2-D matrix) computes with
W + alpha / rank x A @ B, A [in, rank] drawn as PEFT draws it (uniform within 1 / sqrt(in)) and B [rank, out]
zero, so an adapted model starts where it was. The encoder's own weights stay frozen; the adapters and the
task's head train. Keras' own `enable_lora` is not used: on a [hidden, heads, head_dim] query kernel it gives each
head its own A and shares one B [rank, head_dim] between heads, another method than PEFT's with another parameter
count (6x more for MiniLM's query at rank 8), so `--lora_rank` would not mean what a PEFT user reads.

The adapters run inside bert_mgpu's fused encoder (`FusedBertEncoder.adapters`), which adds each delta to the
kernel it reads. Checkpoints keep them beside the encoder under Google-style names (`.../query/lora_a`,
`bert/encoder/lora_scale`); `fold` adds them into the kernels when a checkpoint is read as weights, and `merge`
does so in a live model when its run ends, so best/, exports and every reader see one ordinary BERT.

Example:
    spec = check_lora(8, 16, ("query", "value"))
    enable(model, spec)        # in the towers' scope: the adapters are new variables
    ...train...
    merge(model)               # W += alpha / rank x A @ B; B = 0
"""

import dataclasses
import re

import keras
import numpy as np

from bert_mgpu.core import _compat
from bert_mgpu.core.errors import UserError
from bert_mgpu.model.fused_encoder import FusedBertEncoder

# --lora_targets: each encoder layer's dense layers (`_compat.TransformerParts`) -> Google's name for them.
TARGETS = {"query": "attention/self/query", "key": "attention/self/key", "value": "attention/self/value",
           "attention_output": "attention/output/dense", "intermediate": "intermediate/dense",
           "output": "output/dense"}
DEFAULT_TARGETS = ("query", "value")  # Hu et al.'s and PEFT's BERT default
SCALE_NAME = "bert/encoder/lora_scale"
_ADAPTER = re.compile(r"(bert/encoder/layer_\d+/.+)/lora_([ab])$")


@dataclasses.dataclass(frozen=True)
class LoraSpec:
    """rank: the adapters' inner size; alpha: their scale's numerator (scale = alpha / rank, PEFT's);
    targets: names of TARGETS."""

    rank: int
    alpha: float
    targets: tuple

    @property
    def scale(self):
        return self.alpha / self.rank

    def settings(self):
        return {"lora_rank": self.rank, "lora_alpha": self.alpha, "lora_targets": list(self.targets)}


def check_lora(rank, alpha=None, targets=DEFAULT_TARGETS):
    """LoraSpec, alpha defaulting to the rank (a scale of 1), or UserError in one line; rank 0 or None: None."""
    if not rank:
        return None
    if int(rank) != rank or rank < 1:
        raise UserError(f"--lora_rank={rank}: must be a whole number, 1 or more (0: no adapters)")
    alpha = float(rank if alpha is None else alpha)
    if not 0 < alpha < float("inf"):
        raise UserError(f"--lora_alpha={alpha}: must be a finite number above 0")
    targets = tuple(targets.split(",") if isinstance(targets, str) else targets)
    if not targets or len(set(targets)) != len(targets) or any(t not in TARGETS for t in targets):
        raise UserError(f"--lora_targets={','.join(targets)}: distinct names of {', '.join(TARGETS)}")
    return LoraSpec(int(rank), alpha, targets)


class _LayerAdapters(keras.layers.Layer):
    """One encoder layer's adapters, named `transformer_layer_<i>` so their paths read as that layer's
    (layer-wise learning-rate decay gives them its rate)."""

    def __init__(self, index, shapes, rank, **kwargs):
        super().__init__(name=f"transformer_layer_{index}", dtype="float32", **kwargs)
        self.shapes, self.rank = shapes, rank

    def build(self, input_shape=None):
        self.a, self.b = {}, {}
        for target, (rows, cols) in self.shapes.items():
            bound = 1.0 / rows ** 0.5  # PEFT: kaiming_uniform_(a=sqrt(5)) on A [rank, in]
            self.a[target] = self.add_weight(
                shape=(rows, self.rank), name=f"{target}_lora_a", dtype="float32",
                initializer=keras.initializers.RandomUniform(-bound, bound))
            self.b[target] = self.add_weight(shape=(self.rank, cols), name=f"{target}_lora_b", dtype="float32",
                                             initializer="zeros")


class LoraAdapters(keras.layers.Layer):
    """Every encoder layer's adapters; `delta(i, target)` is the change to that kernel, [in, out] float32."""

    def __init__(self, spec, shapes, **kwargs):
        super().__init__(name="lora", dtype="float32", **kwargs)
        self.spec = spec
        self.layers = [_LayerAdapters(i, s, spec.rank) for i, s in enumerate(shapes)]
        for layer in self.layers:
            layer.build()
        # In the checkpoint, so a reader folds the adapters with the scale they were trained with.
        self.scale = self.add_weight(shape=(), name="lora_scale", dtype="float32", trainable=False,
                                     initializer=keras.initializers.Constant(spec.scale))
        self.built = True

    def delta(self, index, target):
        layer = self.layers[index]
        return self.spec.scale * keras.ops.matmul(layer.a[target], layer.b[target])

    def named_variables(self):
        """{Google-style name: variable}: how checkpoints keep them."""
        named = {f"bert/encoder/layer_{i}/{TARGETS[t]}/lora_{part}": getattr(layer, part)[t]
                 for i, layer in enumerate(self.layers) for t in self.spec.targets for part in ("a", "b")}
        return {**named, SCALE_NAME: self.scale}


def fused_encoder(model):
    """The model's FusedBertEncoder, or UserError: keras-hub's own layers have no room for these adapters."""
    found = [layer for layer in _compat.sublayers(model) if isinstance(layer, FusedBertEncoder)]
    if not found:
        raise UserError("--lora_rank runs its adapters in bert_mgpu's fused encoder: leave --fused_encoder on")
    return found[0]


def adapters(model):
    """The model's LoraAdapters, or None."""
    return next((layer.adapters for layer in _compat.sublayers(model)
                 if isinstance(layer, FusedBertEncoder) and layer.adapters is not None), None)


def enable(model, spec):
    """Freeze the model's encoder and give it adapters of `spec` (in the towers' scope). Enabling again with
    the same spec does nothing; with another, UserError."""
    encoder = fused_encoder(model)
    if encoder.adapters is not None:
        if encoder.adapters.spec != spec:
            raise UserError("this model already has other LoRA adapters: open it again to train new ones")
        return encoder.adapters
    shapes = []
    for block in encoder.backbone.transformer_layers:
        parts = _compat.transformer_parts(block)
        shapes.append({t: _matrix_shape(getattr(parts, t).kernel.shape, t) for t in spec.targets})
    _compat.add_layer_after_build(encoder, "adapters", LoraAdapters(spec, shapes))
    encoder.backbone.trainable = False
    return encoder.adapters


def _matrix_shape(shape, target):
    """A kernel's shape as google-bert's 2-D matrix: [hidden, heads, size] -> [hidden, hidden], and the
    attention output's [heads, size, hidden] -> [hidden, hidden]."""
    if target == "attention_output":
        return int(np.prod(shape[:-1])), int(shape[-1])
    return int(shape[0]), int(np.prod(shape[1:]))


def merge(model):
    """Add each adapter's delta into its kernel and zero B: the model computes what it did, with its
    adapted weights in its encoder (what best/, exports and `encoder_weights` read). None without adapters."""
    found = adapters(model)
    if found is None:
        return
    encoder = fused_encoder(model)
    for i, block in enumerate(encoder.backbone.transformer_layers):
        parts = _compat.transformer_parts(block)
        for target in found.spec.targets:
            kernel = getattr(parts, target).kernel
            kernel.assign(kernel + keras.ops.reshape(found.delta(i, target), kernel.shape))
            b = found.layers[i].b[target]
            b.assign(keras.ops.zeros(b.shape))


def pending(model):
    """Whether the model has adapters not yet added into its encoder (some B not zero)."""
    found = adapters(model)
    return found is not None and any(bool(np.any(layer.b[t].numpy())) for layer in found.layers for t in layer.b)


def trainable_counts(model):
    """(parameters trained, parameters in all) of a model, as PEFT counts them: what --lora_rank saves, for a
    run's summary. Not parameters: seed states and the adapters' scale."""
    def count(variables):
        return sum(int(np.prod(v.shape)) for v in variables
                   if "float" in str(v.dtype) and not v.path.endswith("lora_scale"))
    return count(model.trainable_variables), count(model.weights)


def fold(weights):
    """{Google name: array} of a checkpoint that holds adapters -> the same with each adapter's delta added
    into its kernel (float64, then float32) and the adapters gone; a checkpoint without them is returned as is."""
    if SCALE_NAME not in weights:
        return weights
    scale = float(np.asarray(weights[SCALE_NAME]))
    out = {k: v for k, v in weights.items() if k != SCALE_NAME and not _ADAPTER.match(k)}
    for name in weights:
        m = _ADAPTER.match(name)
        if m and m.group(2) == "a":
            kernel = f"{m.group(1)}/kernel"
            delta = np.asarray(weights[name], np.float64) @ np.asarray(weights[f"{m.group(1)}/lora_b"], np.float64)
            out[kernel] = (np.asarray(out[kernel], np.float64) + scale * delta.reshape(out[kernel].shape)
                           ).astype(np.float32)
    return out
