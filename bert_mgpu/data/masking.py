"""What masked-LM pretraining masks together: tokens, whole words, n-grams of words, or one span.

Both inputs mask the same way: create_pretraining_data's records (Python, `candidates`) and dynamic masking
of raw text (TensorFlow ops inside tf.data, `select`).
- Whole words (`whole_word`): a token that does not start a word (a `##` piece, or a later character of a
  Chinese word, word_segments.py) is masked with the word it belongs to.
- N-grams (`max_ngram_size` > 1, as tf-models' and NVIDIA's create_pretraining_data): the units are cut into
  runs of 1..N units, a run of n drawn with probability proportional to 1/n, and runs are masked whole.
- A span (`span`): one stretch of consecutive units a sequence, up to the masked-token budget, as masked
  "text rewriting" data (bert-ad).
Units never cross [CLS] or [SEP]. Each masked token is still predicted on its own: the loss stays per token.

Example:
    units = candidates(tokens, starts, {cls_id, sep_id}, MaskPlan(whole_word=True, max_ngram_size=3), rng, 20)
"""

import dataclasses

import tensorflow as tf

from bert_mgpu.core.errors import UserError


@dataclasses.dataclass(frozen=True)
class MaskPlan:
    """What is masked together (the module's docstring)."""

    whole_word: bool = False
    max_ngram_size: int = 1
    span: bool = False

    def __post_init__(self):
        if self.max_ngram_size < 1:
            raise UserError(f"--max_ngram_size={self.max_ngram_size}: expected 1 or more")
        if self.span and self.max_ngram_size > 1:
            raise UserError("--span_masking and --max_ngram_size > 1 both say what to mask together; pick one")

    @property
    def grouped(self):
        """Whether anything is masked together beyond google-bert's own algorithm."""
        return self.max_ngram_size > 1 or self.span

    def ngram_weights(self):
        return [1.0 / n for n in range(1, self.max_ngram_size + 1)]


def candidates(tokens, starts, special_ids, plan, rng, budget):
    """Python: the position lists that google-bert's masking loop draws from, for one sequence.

    Without n-grams or span these are google-bert's candidates (one per token, or per word; google-bert
    also joins a `##` piece just after [SEP] to the word before it, this does not). `budget`: tokens to
    mask (the span's length)."""
    units, runs, run = [], [], 0
    for i, t in enumerate(tokens):
        if t in special_ids:
            run += 1
            continue
        if plan.whole_word and units and not starts[i] and runs[-1] == run:  # never across [SEP]
            units[-1].append(i)
        else:
            units.append([i])
            runs.append(run)
    if not plan.grouped or not units:
        return units
    if plan.span:
        first = rng.randrange(len(units))
        span, j = [], first
        while j < len(units) and runs[j] == runs[first] and len(span) + len(units[j]) <= budget:
            span.extend(units[j])
            j += 1
        return [span] if span else []
    grams, i, sizes = [], 0, range(1, plan.max_ngram_size + 1)
    while i < len(units):
        n = rng.choices(sizes, plan.ngram_weights())[0]
        j = i + 1
        while j < min(len(units), i + n) and runs[j] == runs[i]:
            j += 1
        grams.append([p for unit in units[i:j] for p in unit])
        i = j
    return grams


def select(candidate, starts, plan, key, budget):
    """TensorFlow: which positions of one sequence to mask -> sorted int32 positions.

    candidate: [n] bool, the tokens that may be masked (not special); starts: [n] bool, a token starts a
    word; key: [2] int64 for stateless draws; budget: scalar int32, tokens to mask at most. Units are drawn
    in random order and taken while the masked tokens fit the budget."""
    n = tf.size(candidate)
    after_special = tf.concat([[True], tf.logical_not(candidate[:-1])], 0)
    unit_start = candidate & (after_special | starts | (not plan.whole_word))
    unit_of = tf.cumsum(tf.cast(unit_start, tf.int32)) - 1
    units = tf.reduce_sum(tf.cast(unit_start, tf.int32))
    unit_run_start = tf.boolean_mask(after_special, unit_start)  # per unit
    group_start = unit_run_start
    if plan.max_ngram_size > 1:
        logits = tf.math.log(tf.constant([plan.ngram_weights()], tf.float32))
        sizes = tf.cast(tf.random.stateless_categorical(logits, units, key + [0, 3 << 40])[0], tf.int32) + 1
        first = tf.cumsum(sizes, exclusive=True)
        first = tf.boolean_mask(first, first < units)
        group_start = group_start | tf.scatter_nd(first[:, None], tf.ones_like(first, tf.bool), [units])
    elif not plan.span:
        group_start = tf.ones([units], tf.bool)
    group_of_unit = tf.cumsum(tf.cast(group_start, tf.int32)) - 1
    groups = tf.reduce_sum(tf.cast(group_start, tf.int32))
    group_of = tf.where(candidate, tf.gather(group_of_unit, tf.maximum(unit_of, 0)), groups)  # specials: none
    size = tf.math.unsorted_segment_sum(tf.ones([n], tf.int32), group_of, groups + 1)[:groups]
    if plan.span:  # groups are runs here: one span from a random unit, within its run
        start = tf.minimum(tf.cast(tf.random.stateless_uniform([], key + [0, 4 << 40]) *
                                   tf.cast(units, tf.float32), tf.int32), units - 1)
        unit_tokens = tf.math.unsorted_segment_sum(tf.cast(candidate, tf.int32), tf.maximum(unit_of, 0), units)
        same_run = tf.equal(group_of_unit, tf.gather(group_of_unit, tf.maximum(start, 0)))
        later = tf.range(units) >= start
        taken = tf.cumsum(tf.where(later & same_run, unit_tokens, 0))
        chosen_unit = later & same_run & (taken <= budget)
        chosen = candidate & tf.gather(tf.concat([chosen_unit, [False]], 0),
                                       tf.where(candidate, unit_of, units))
    else:
        order = tf.argsort(tf.random.stateless_uniform([groups], key + [0, 4 << 40]))
        fits = tf.cumsum(tf.gather(size, order)) <= budget
        chosen_group = tf.scatter_nd(order[:, None], fits, [groups])
        chosen = candidate & tf.gather(tf.concat([chosen_group, [False]], 0), group_of)
    return tf.cast(tf.reshape(tf.where(chosen), [-1]), tf.int32)
