"""TrainConfig and PretrainConfig: fit's keywords and the config are one thing, warmup travels as steps,
and the settings a resumed run compares keep the keys run directories have always recorded."""

import dataclasses
import json
import os

import pytest
from conftest import ROOT

from bert_mgpu.core.errors import UserError
from bert_mgpu.io.run_dir import LATER_SETTINGS
from bert_mgpu.train.train_config import PretrainConfig, TrainConfig

GOLDEN = os.path.join(ROOT, "tests", "golden")


def test_keywords_make_the_same_config_and_an_unknown_one_is_a_type_error():
    config = TrainConfig(epochs=2.0, learning_rate=3e-5, eval_every_steps=10)
    assert TrainConfig.make(None, epochs=2.0, learning_rate=3e-5, eval_every_steps=10) == config
    assert TrainConfig.make(config, seed=1) == dataclasses.replace(config, seed=1)  # keywords on top of a config
    assert config.seed == 12345  # ... which stays as it was
    with pytest.raises(TypeError, match="TrainConfig has no epoch, lr"):
        TrainConfig.make(None, epoch=2, lr=1e-3)
    assert PretrainConfig().learning_rate == 1e-4 and TrainConfig().learning_rate == 5e-5


def test_warmup_given_as_steps_is_those_steps():
    """29 warmup steps of 100 were 28 when they travelled as a proportion (int(100 x 0.29) = 28)."""
    assert int(100 * (29 / 100)) == 28
    assert TrainConfig(num_warmup_steps=29).warmup_steps(100) == 29
    assert TrainConfig(warmup_proportion=0.1).warmup_steps(1000) == 100
    assert TrainConfig(warmup_proportion=0.1, num_warmup_steps=0).warmup_steps(1000) == 0


def test_steps_are_counted_as_transformers_counts_them_or_as_google_bert():
    """901 debate statements at global batch 32 for 2 epochs (benchmarks/NOTES.md item 95): transformers'
    Trainer takes ceil(901 / 32) = 29 steps an epoch, 58 in all, and ceil(5.8) = 6 of warmup; google-bert's
    run_classifier int(901 / 32 x 2) = 56 and int(5.6) = 5."""
    ceil, google = TrainConfig(epochs=2), TrainConfig(epochs=2, step_count="google-bert")
    assert ceil.steps(901, 32) == (29, 58) and ceil.warmup_steps(58) == 6
    per_epoch, steps = google.steps(901, 32)
    assert per_epoch == pytest.approx(28.15625) and steps == 56 and google.warmup_steps(56) == 5
    # A fraction of an epoch is its share of the epoch's steps, rounded up; a float's error is no extra step.
    assert TrainConfig(epochs=0.3).steps(100, 10) == (10, 3) and TrainConfig(epochs=0.25).steps(901, 32)[1] == 8
    assert TrainConfig(warmup_proportion=0.3).warmup_steps(10) == 3
    # Divisible data: both counts agree (the suite's tiny runs keep their steps).
    assert ceil.steps(640, 16)[1] == google.steps(640, 16)[1] == 80 and ceil.warmup_steps(80) == 8


@pytest.mark.parametrize("fields, message", [
    ({"learning_rate": float("nan")}, "--learning_rate=nan: must be a finite number above 0"),
    ({"epochs": 0.0}, "--num_train_epochs=0.0: must be a finite number above 0"),
    ({"gradient_accumulation_steps": 0}, "--gradient_accumulation_steps=0: expected 1 or more"),
    ({"max_consecutive_skips": -1}, "--max_consecutive_skips=-1: must be 0 (no limit) or more"),
    ({"num_warmup_steps": -3}, "--num_warmup_steps=-3: must be 0 or more"),
    ({"save_total_limit": 0}, "--save_total_limit=0: must be 1 or more"),
    ({"load_best_model_at_end": True}, "--load_best_model_at_end and --early_stopping_patience need evaluation"),
    ({"adam_epsilon": 0.0}, "--adam_eps=0.0: must be a finite number above 0"),
    ({"lr_schedule": "cosine"}, "--lr_schedule=cosine: expected one of linear, google-bert"),
    ({"step_count": "floor"}, "--step_count=floor: expected one of ceil, google-bert"),
])
def test_a_setting_no_run_can_use_is_one_line_naming_its_flag(fields, message):
    with pytest.raises(UserError) as e:
        TrainConfig(**fields).check()
    assert str(e.value).startswith(message)


@pytest.mark.parametrize("kind", ["classifier", "pretraining"])
def test_settings_keep_the_keys_and_values_old_run_directories_recorded(kind):
    """The golden run directories were written before TrainConfig: the config rebuilt from their flags gives
    the same settings under the same keys, so they resume (tests/test_golden.py resumes them)."""
    recorded = json.load(open(os.path.join(GOLDEN, kind, "out", "bert_mgpu.json")))["settings"]
    if kind == "classifier":
        config = TrainConfig(epochs=recorded["num_train_epochs"], learning_rate=recorded["learning_rate"],
                             warmup_proportion=recorded["warmup_proportion"], seed=recorded["seed"])
        mine = config.settings(recorded["per_tower_batch"])
    else:
        config = PretrainConfig(**{k: recorded[k] for k in ("learning_rate", "optimizer", "beta_1", "beta_2",
                                                           "epsilon", "weight_decay", "clipnorm")})
        mine = config.settings(recorded["global_batch"])
    # Keys recorded since (issue 71's batching, epsilon and schedule) are LATER_SETTINGS: an old run lacks them.
    later = set(mine) - set(recorded)
    assert later <= LATER_SETTINGS and later == (
        {"length_buckets", "adam_eps", "lr_schedule", "step_count"} if kind == "classifier" else set())
    assert {k: recorded[k] for k in mine if k not in later} == {k: v for k, v in mine.items() if k not in later}
    # A field left at its default adds no key an old run lacks (gradient accumulation 1, no warmup steps).
    assert "num_warmup_steps" not in mine and "gradient_accumulation_steps" not in mine
    assert TrainConfig(gradient_accumulation_steps=4, num_warmup_steps=7).settings(8) == {
        **TrainConfig().settings(8), "gradient_accumulation_steps": 4, "num_warmup_steps": 7}


def test_class_weights_are_recorded_the_same_however_given():
    """A script's "1,2" and a notebook's (1, 2) are one setting: a resume from either is the same run."""
    recorded = [TrainConfig(class_weights=w, focal_gamma=g).settings(8) for w, g in (("1,2", 2), ((1, 2.0), 2.0))]
    assert recorded[0] == recorded[1] and recorded[0]["class_weights"] == [1.0, 2.0]
    assert TrainConfig(class_weights="auto").settings(8)["class_weights"] == "auto"
    assert "class_weights" not in TrainConfig().settings(8) and "focal_gamma" not in TrainConfig().settings(8)


def test_a_run_recorded_before_the_recipe_settings_resumes_with_google_berts_recipe():
    """The golden classifier run was trained with length buckets, epsilon 1e-6, google-bert's schedule and
    step count (the defaults then); resuming it keeps them. A run that recorded the first three but not the
    step count (issue 71's first change) keeps google-bert's count. A run that recorded them all, or none,
    keeps the config."""
    recorded = json.load(open(os.path.join(GOLDEN, "classifier", "out", "bert_mgpu.json")))["settings"]
    config = TrainConfig(seed=3)
    assert (config.length_buckets, config.adam_epsilon, config.lr_schedule, config.step_count) == (
        False, 1e-8, "linear", "ceil")
    old = config.resuming(recorded)
    assert (old.length_buckets, old.adam_epsilon, old.lr_schedule, old.step_count, old.seed) == (
        True, 1e-6, "google-bert", "google-bert", 3)
    between = {k: v for k, v in config.settings(8).items() if k != "step_count"}
    assert config.resuming(between) == dataclasses.replace(config, step_count="google-bert")
    assert config.resuming(None) == config and config.resuming(config.settings(8)) == config
