"""`report_to`: the records the loop writes (training and evaluation), the run's settings and its final
dev results, sent to TensorBoard's HParams dashboard, Weights & Biases and MLflow, as the Hugging Face
Trainer's `report_to` does. All optional and offline by default: W&B in offline mode (`wandb sync` uploads
it later) unless WANDB_MODE says otherwise, MLflow into a file store in OUTPUT_DIR/mlruns unless
MLFLOW_TRACKING_URI names another. TensorBoard's scalars are always written (OUTPUT_DIR/train, /eval);
`tensorboard` adds the settings and final metrics to its HParams dashboard, so the runs of a sweep sort by
their dev metric there.

A run resumed after a crash, and the evaluation after training, report to the same W&B and MLflow runs:
their ids and the settings are kept in OUTPUT_DIR/reporting.json.

Example:
    with Reporters(["tensorboard", "mlflow"], "out", settings={"learning_rate": 2e-5}) as reporters:
        reporters.log({"step": 10, "loss": 0.7})
        reporters.final({"eval_accuracy": 0.85}, step=100)
"""

import json
import logging
import numbers
import os
import secrets
import time

from bert_mgpu.core import storage
from bert_mgpu.core.errors import UserError

KINDS = ("tensorboard", "wandb", "mlflow")
INSTALL = {"wandb": "wandb", "mlflow": "mlflow-skinny (or mlflow)"}
IDS_FILE = "reporting.json"
_CACHE_SET = None  # the WANDB_CACHE_DIR bert_mgpu set (a user's own is left alone)
log = logging.getLogger("bert_mgpu")


def parse_report_to(values) -> tuple:
    """['tensorboard', 'wandb'] (or 'all', 'none') -> the loggers, checked: each known and installed."""
    names = [v.strip().lower() for v in ([values] if isinstance(values, str) else values or []) if v.strip()]
    if names in (["none"], []):
        return ()
    if names == ["all"]:
        names = list(KINDS)
    unknown = [n for n in names if n not in KINDS]
    if unknown:
        raise UserError(f"--report_to: {', '.join(unknown)} unknown; known: {', '.join(KINDS)}, all, none")
    for name in names:
        if name in INSTALL:
            try:
                __import__(name)
            except ImportError:
                raise UserError(f"--report_to={name}: {name} is not installed (pip install {INSTALL[name]}, "
                                f"or pip install 'bert_mgpu[loggers]')") from None
    return tuple(dict.fromkeys(names))


def _numbers(record):
    return {k: float(v) for k, v in record.items()
            if k != "step" and isinstance(v, numbers.Real) and not isinstance(v, bool)}


def _plain(settings):
    """Settings as loggers take them: numbers, strings and booleans; anything else as its text."""
    return {k: v if isinstance(v, (bool, int, float, str)) else json.dumps(v, default=str)
            for k, v in settings.items() if v is not None}


class Reporters:
    """The loggers of one run directory; a context manager that closes them.

    Args:
        kinds: names from KINDS (parse_report_to checks them).
        output_dir: the run directory (ids, the MLflow file store, TensorBoard's sessions).
        settings: the run's settings ({name: value}): W&B's config, MLflow's params, HParams' hparams;
            None: those the run directory's training reported.
        name: the run's name in W&B and MLflow (default: the directory's name).
    """

    def __init__(self, kinds, output_dir, settings=None, name=None):
        self.kinds, self.output_dir = tuple(kinds), output_dir
        self._wandb = self._mlflow = None
        self._ids = self._read_ids()
        # The settings training reported; the evaluation after it reopens the runs with them.
        self.settings = _plain(settings) if settings is not None else self._ids.get("settings", {})
        self._ids["settings"] = self.settings
        self.name = name or os.path.basename(os.path.normpath(output_dir))
        if "wandb" in self.kinds:
            self._start_wandb()
        if "mlflow" in self.kinds:
            self._start_mlflow()
        self._write_ids()

    # ------------------------------------------------------------------ starting
    def _read_ids(self):
        path = os.path.join(self.output_dir, IDS_FILE)
        return json.loads(storage.read_text(path)) if storage.exists(path) else {}

    def _write_ids(self):
        if self._ids:
            storage.write_atomic(os.path.join(self.output_dir, IDS_FILE), json.dumps(self._ids, indent=1) + "\n")

    def _start_wandb(self):
        import wandb

        os.environ.setdefault("WANDB_MODE", "offline")  # never the network unless the user asks
        os.environ.setdefault("WANDB_SILENT", "true")
        global _CACHE_SET
        if os.environ.get("WANDB_CACHE_DIR") in (None, _CACHE_SET):  # W&B's core logs: in the run, not ~/.cache
            os.environ["WANDB_CACHE_DIR"] = _CACHE_SET = os.path.join(os.path.abspath(self.output_dir), "wandb",
                                                                      "cache")
        run_id = self._ids.get("wandb") or secrets.token_hex(4)  # W&B's ids: 8 of [a-z0-9]
        project = None if os.environ.get("WANDB_PROJECT") else "bert_mgpu"
        self._wandb = wandb.init(id=run_id, resume="allow", dir=self.output_dir, name=self.name, project=project,
                                 config=self.settings, reinit="create_new",
                                 settings=wandb.Settings(console="off"))  # our stdout stays ours
        self._ids["wandb"] = run_id

    def _start_mlflow(self):
        import mlflow

        uri = (self._ids.get("mlflow_uri") or os.environ.get("MLFLOW_TRACKING_URI")  # where its run is
               or "file:" + os.path.abspath(os.path.join(self.output_dir, "mlruns")))  # plain files beside it
        if uri.startswith("file:"):  # MLflow 3 asks to be told that a file store is wanted
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        client = mlflow.tracking.MlflowClient(tracking_uri=uri)
        run_id = self._ids.get("mlflow")
        if run_id is None:
            experiment = client.get_experiment_by_name("bert_mgpu")
            experiment_id = experiment.experiment_id if experiment else client.create_experiment("bert_mgpu")
            run_id = client.create_run(experiment_id, run_name=self.name).info.run_id
            from mlflow.entities import Param

            client.log_batch(run_id, params=[Param(k, str(v)[:6000]) for k, v in self.settings.items()])
        self._mlflow, self._ids["mlflow"], self._ids["mlflow_uri"] = client, run_id, uri

    # ------------------------------------------------------------------ reporting
    def log(self, record):
        """A loop record ({"step": n, name: value}) to every logger."""
        values = _numbers(record)
        if not values:
            return
        step = int(record["step"])
        if self._wandb is not None:
            self._wandb.log(values, step=step)
        if self._mlflow is not None:
            self._log_mlflow(values, step)

    def _log_mlflow(self, values, step):
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self._mlflow.log_batch(self._ids["mlflow"], metrics=[Metric(_mlflow_key(k), v, now, step)
                                                             for k, v in values.items()])

    def final(self, results, step):
        """The dev results after training ({"eval_accuracy": ...}) at `step`: W&B's summary, MLflow's
        metrics, and TensorBoard's HParams session (settings and these metrics)."""
        values = {k if k.startswith("eval_") else f"eval_{k}": v for k, v in _numbers(results).items()
                  if k not in ("global_step", "eval_examples")}
        if self._mlflow is not None:
            self._log_mlflow(values, step)
        if self._wandb is not None:  # W&B's steps only go up: the best model's step may be behind the last
            self._wandb.summary.update({**values, "eval_step": step})
        if "tensorboard" in self.kinds:
            write_hparams(self.output_dir, self.settings, values, step)

    def close(self):
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None
        if self._mlflow is not None:
            self._mlflow.set_terminated(self._ids["mlflow"])
            self._mlflow = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def report_results(report_to, output_dir, results, step):
    """The dev results after training (`results` at `step`) to the loggers `report_to` names, reopening the
    runs training reported to in `output_dir`; nothing when it names none."""
    kinds = parse_report_to(report_to)
    if kinds:
        with Reporters(kinds, output_dir) as reporters:
            reporters.final(results, int(step))


def _mlflow_key(key):
    """MLflow keys take letters, digits and _-./ and spaces: `system/cpu_percent` stays as it is."""
    return "".join(c if c.isalnum() or c in "_-./ " else "_" for c in key)


def write_hparams(output_dir, settings, metrics, step):
    """TensorBoard's HParams session for the run directory: its settings, and its final metrics as scalars
    in OUTPUT_DIR/hparams (where the dashboard reads them), so a sweep's runs sort by metric."""
    import tensorflow as tf
    from tensorboard.plugins.hparams import api as hp

    writer = tf.summary.create_file_writer(os.path.join(output_dir, "hparams"))
    with writer.as_default(step=step):
        hp.hparams(settings, trial_id=os.path.basename(os.path.normpath(output_dir)))
        for key, value in metrics.items():
            tf.summary.scalar(key, value)
    writer.close()
