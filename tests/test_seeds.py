"""A run's seed sets its dropout masks as well as its order (`--seed`, `TrainConfig.seed`); the default seed
draws the masks it always drew."""

import numpy as np
import pytest
import tensorflow as tf
from test_pretraining import new_pretrainer, text  # noqa: F401  (text: a fixture)

from bert_mgpu.io import run_dir
from bert_mgpu.parallel import devices, distribute
from bert_mgpu.train import session


@pytest.mark.parametrize("fused", [True, False])
def test_the_seed_sets_the_dropout_masks_and_the_default_keeps_them(fused):
    from conftest import tiny_config

    from bert_mgpu.model import modeling

    strategy = distribute.make_strategy(devices.plan_devices(0, 2, ()))
    with strategy.scope():
        model = modeling.build_classifier(tiny_config(38), 2, "float32", fused=fused)  # dropout 0.1
    distribute.per_tower_seeds(model)
    ids = np.tile(np.arange(2, 14, dtype=np.int32), (8, 1))
    batch = next(iter(distribute.distribute_dataset(strategy, tf.data.Dataset.from_tensors(
        {"token_ids": ids, "segment_ids": np.zeros_like(ids), "padding_mask": np.ones_like(ids, bool)}))))
    built = {k: v.numpy() for k, v in run_dir.rng_states(model).items()}
    assert len(built) > 1  # keras-hub's dropout layers' generators, and the fused encoder's

    def logits(*seeds):
        for k, v in run_dir.rng_states(model).items():
            v.assign(built[k])
        for seed in seeds:
            session.seed_dropout(model, seed)
        step = tf.function(lambda b: strategy.run(lambda f: model(f, training=True), args=(b,)))
        return np.concatenate([t.numpy() for t in strategy.experimental_local_results(step(batch))])

    as_built = logits()
    np.testing.assert_array_equal(logits(session.DEFAULT_SEED), as_built)
    seven = logits(7)
    assert np.abs(seven - as_built).max() > 1e-3
    np.testing.assert_array_equal(logits(7, 7), seven)  # set, not stepped: a second fit starts the same
    assert np.abs(logits(8) - seven).max() > 1e-3
    words = {k: int(v.numpy()[0]) for k, v in run_dir.rng_states(model).items()}
    assert words == {k: int(v[0]) ^ 8 ^ session.DEFAULT_SEED for k, v in built.items()}
    if fused:
        assert int(built["s0"][0]) == 1234


def test_fit_starts_a_new_run_from_its_seed_and_a_rerun_from_its_checkpoint(google_release, tmp_path):
    import bert_mgpu

    towers = bert_mgpu.Towers(n_gpus=0, towers_per_gpu=2, train_batch_size=4)
    labelled = [bert_mgpu.Example(str(i), "a good film" if i % 2 else "a dull plot", label="pos" if i % 2 else "neg")
                for i in range(16)]

    def state(clf):  # the fused encoder's generator: built with 1234, stepped once a draw
        return tuple(int(x) for x in run_dir.rng_states(clf.model)["s0"].numpy())

    def fitted(seed, out):
        clf = bert_mgpu.BertClassifier.from_pretrained(google_release, ["neg", "pos"], towers, "float32",
                                                       max_seq_length=16)
        clf.fit(labelled, str(out), epochs=1, seed=seed, learning_rate=1e-3)
        return state(clf)

    # 2 steps of 2 towers x 4, 7 draws a step (the embeddings', 3 in each of the 2 layers).
    seven = fitted(7, tmp_path / "seven")
    assert seven == (1234 ^ 7 ^ session.DEFAULT_SEED, 14)
    # Rerun in the same directory by a new classifier: it resumes at its end, the masks' state read from its
    # checkpoint, 14 draws on.
    assert fitted(7, tmp_path / "seven") == seven


def test_pretraining_starts_its_dropout_from_the_datas_seed(text, tmp_path):  # noqa: F811
    from bert_mgpu.data.pretraining_input import PretrainingData
    from bert_mgpu.train.budget import Budget

    pre = new_pretrainer(text)
    data = PretrainingData("text", [f"{text[0]}/train.txt"], pre.tokenizer, max_seq_length=32,
                           max_predictions_per_seq=6, seed=7)  # run_pretraining_mgpu.py's --seed
    pre.fit(data, str(tmp_path), Budget(num_train_steps=2), verbose=False)
    first = int(run_dir.rng_states(pre.model)["s0"].numpy()[0])  # the fused encoder's, built with 1234
    assert first == 1234 ^ 7 ^ session.DEFAULT_SEED
