"""--recompute's memory: a training step's peak at length 512 with and without recomputed layers, and the larger
batch the search then finds. A file of its own, so that CI's run with oneDNN flipped (.ci/run, which hands out
whole files) can put it on the other worker from test_memory.py."""

import keras
import pytest
from conftest import tiny_config

from bert_mgpu.core.errors import UserError
from bert_mgpu.model import modeling
from bert_mgpu.parallel import devices, distribute
from bert_mgpu.train import memory, optimization, training


@pytest.mark.process
def test_recompute_lowers_a_step_peak_at_length_512_and_fits_a_larger_batch(monkeypatch):
    """--recompute: a classifier's training step at length 512 (6 layers) peaks far lower on the allocator,
    so the batch search finds a larger batch under the same limit (the ratio: benchmarks/NOTES.md)."""
    from bert_mgpu.model.fused_encoder import set_recompute

    plan = devices.plan_devices(0, 1, ())
    towers = type("Towers", (), {"plan": plan, "strategy": distribute.make_strategy(plan)})()
    keras.utils.set_random_seed(0)
    with towers.strategy.scope():
        model = modeling.build_classifier(tiny_config(38, hidden_size=64, intermediate_size=256, num_hidden_layers=6,
                                                      max_position_embeddings=512), 2)
    make = lambda n: memory.classifier_batch(n, 512)  # noqa: E731

    def peaks(recompute):
        set_recompute(model, recompute)
        with towers.strategy.scope():
            trainer = training.Trainer(towers.strategy, model, optimization.create_optimizer(0.0, 10, 0))
        return memory.step_peaks(trainer, make, plan, [4, 5])

    kept, recomputed = peaks(False), peaks(True)
    # Measured 0.37-0.40 at batch 4 (112-116 MiB against 302-303), oneDNN on and off.
    assert recomputed[4] < 0.5 * kept[4] and kept[5] > kept[4], (kept, recomputed)
    # Midway between batch 4's and batch 5's peaks: 4 fits without recompute, 5 does not.
    limit = (kept[4] + kept[5]) / 2 / memory.RUN_MARGIN
    searches = []
    search = memory.find_batch_size
    monkeypatch.setattr(memory, "find_batch_size", lambda *a, **k: searches.append(search(*a, **k)) or searches[-1])
    found = {on: memory.find_for_model(towers, model, "float32", make, memory_limit_mb=limit, cap=8, recompute=on)
             for on in (False, True)}
    assert found[True] == 8, found
    # Without recompute: 4, or 3 when the search's own trial at 4 reads over the limit. A peak on the BFC
    # allocator counts whole chunks, and a free chunk under twice a request is handed out whole, so a trial
    # reads what earlier trials and tests left free: 16-18 MiB over `kept[4]` here after trials at 1 and 2,
    # more than the midway margin in a suite's worker (benchmarks/NOTES.md item 64). Either way the search
    # stopped at a measured reading: the size above its answer peaked over the limit.
    trials = dict(searches[0][1])
    usable, above = limit * memory.RUN_MARGIN, trials[found[False] + 1]
    assert found[False] in (3, 4) and trials[found[False]] <= usable, (found, kept, trials)
    assert above is None or above > usable, (found, trials)  # None: out of memory
    with pytest.raises(UserError, match="--recompute needs the fused encoder"):
        set_recompute(keras.Sequential([keras.layers.Dense(2)]), True)
