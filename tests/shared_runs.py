"""Trained run directories that several test files read, each built once per test session (issue 64 item 1).

pytest-xdist's workers are processes of their own, each with its own session fixtures: the first worker to ask
for a run builds it under a file lock in the session's shared base temp, and the others wait for it and read
it. A built run is made read-only, so that a test that writes into it fails at once instead of changing what
the next test reads (except as root, whom permissions do not stop): a test that writes works on a copy
(`copy`). Each file's mode as the run wrote it stays in `facts["modes"]`.

    run = shared_runs.build_once(tmp_path_factory, "classifier", shared_runs.classifier)
    run.out, run.data, run.release, run.args, run.proc (the script's CompletedProcess), run.facts
"""

import dataclasses
import fcntl
import glob
import json
import os
import shutil
import stat
import subprocess

from conftest import WORDS, run_script, sentiment_rows, tiny_config, write_google_release, write_tsv

from bert_mgpu.core import xla


@dataclasses.dataclass(frozen=True)
class SharedRun:
    base: str  # holds out/, data/ and release/
    args: tuple  # the script's command line (its argv after the script's name)
    proc: subprocess.CompletedProcess
    facts: dict  # what the build noted before the run became read-only (each file's mode)

    @property
    def out(self):
        return os.path.join(self.base, "out")

    @property
    def data(self):
        return os.path.join(self.base, "data")

    @property
    def release(self):
        return os.path.join(self.base, "release")

    def copy(self, to, without=()):
        """A writable copy of the run's output directory at `to` -> (its path, the run's args writing there, less
        those starting with one of `without`)."""
        writable_copy(self.out, to)
        return str(to), [f"--output_dir={to}" if a.startswith("--output_dir=") else a for a in self.args
                         if not a.startswith(tuple(without))]


def writable_copy(source, to):
    """A run directory copied as if the run had been written at `to`: shutil.copytree, the copies writable by
    their owner, and each export's stamp (which names the run directory that wrote it) naming the copy."""
    shutil.copytree(source, to)
    for root, dirs, files in os.walk(to):
        for name in dirs + files:
            path = os.path.join(root, name)
            os.chmod(path, os.stat(path).st_mode | stat.S_IWUSR)
    os.chmod(to, os.stat(to).st_mode | stat.S_IWUSR)
    for stamp in glob.glob(os.path.join(to, "export", "*", ".bert_mgpu_stamp.json")):
        with open(stamp) as f:
            facts = json.load(f)
        if facts.get("output_dir") == os.path.realpath(source):
            with open(stamp, "w") as f:
                json.dump({**facts, "output_dir": os.path.realpath(to)}, f)
    return str(to)


def _shared_root(tmp_path_factory):
    """The session's own temporary directory, which every xdist worker's base temp lies in."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def build_once(tmp_path_factory, name, build):
    """The run `name`, built by `build(base) -> (args, proc)` the first time any worker of this session asks."""
    root = _shared_root(tmp_path_factory) / "shared_runs"
    root.mkdir(exist_ok=True)
    base, done = root / name, root / f"{name}.json"
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # held until the build is done: the other workers wait here
        if not done.exists():
            if base.exists():  # a build that failed in another worker: start it again, to fail here in full
                _writable(base)
                shutil.rmtree(base)
            base.mkdir()
            switch = os.environ.pop(xla.SWITCH, None)  # built with XLA, as a user's run: files of both kinds read it
            try:
                args, proc = build(str(base))
            finally:
                if switch is not None:
                    os.environ[xla.SWITCH] = switch
            out = base / "out"
            modes = {os.path.relpath(os.path.join(r, f), out): stat.S_IMODE(os.stat(os.path.join(r, f)).st_mode)
                     for r, _, files in os.walk(out) for f in files}
            _read_only(base)
            done.write_text(json.dumps({"args": list(args), "returncode": proc.returncode, "stdout": proc.stdout,
                                        "stderr": proc.stderr, "modes": modes}))
    record = json.loads(done.read_text())
    proc = subprocess.CompletedProcess(record["args"], record["returncode"], record["stdout"], record["stderr"])
    return SharedRun(str(base), tuple(record["args"]), proc, {"modes": record["modes"]})


def _read_only(directory):
    for root, dirs, files in os.walk(directory, topdown=False):
        for name in files:
            os.chmod(os.path.join(root, name), 0o444)
        for name in dirs:
            os.chmod(os.path.join(root, name), 0o555)
    os.chmod(directory, 0o555)


def _writable(directory):
    os.chmod(directory, 0o755)
    for root, dirs, files in os.walk(directory):
        for name in dirs:
            os.chmod(os.path.join(root, name), 0o755)
        for name in files:
            os.chmod(os.path.join(root, name), 0o644)


EXPORT_FORMATS = ("saved_model", "hf", "google", "keras_hub", "onnx", "tflite")


def classifier(base):
    """The classifier run test_run_classifier.py and test_export.py read: the toy task (640 rows, 50 for dev, 13
    to predict: not a batch multiple) fine-tuned from a tiny random release on two towers for 160 steps, with
    evaluation, prediction, extra metrics and checkpoints every 50 steps, exported in every format by the same
    run. tanh-GELU (`gelu_new`), as keras-hub's BERT computes, so that its keras-hub export is exact too."""
    config = tiny_config(len(WORDS) + 10, hidden_act="gelu_new")
    release, _ = write_google_release(os.path.join(base, "release"), config)
    data = os.path.join(base, "data")
    os.makedirs(data)
    write_tsv(os.path.join(data, "train.tsv"), sentiment_rows(640, seed=1))
    write_tsv(os.path.join(data, "dev.tsv"), sentiment_rows(50, seed=2))
    write_tsv(os.path.join(data, "test.tsv"), [("", text) for _, text in sentiment_rows(13, seed=3)])
    args = ["--task_name=tsv", f"--data_dir={data}", f"--init_checkpoint={release}",
            f"--output_dir={os.path.join(base, 'out')}", "--n_gpus=0", "--towers_per_gpu=2", "--train_batch_size=8",
            "--eval_batch_size=4", "--predict_batch_size=4", "--max_seq_length=32", "--precision=float32",
            "--do_train", "--do_eval", "--do_predict", "--num_train_epochs=4", "--learning_rate=2e-3",
            "--warmup_proportion=0.1", "--save_checkpoints_steps=50", "--metrics=f1_macro,mcc,auc", "--do_export",
            f"--export_format={','.join(EXPORT_FORMATS)}"]
    return args, run_script("run_classifier_mgpu.py", *args)
