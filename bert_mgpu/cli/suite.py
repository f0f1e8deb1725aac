"""What run_glue_mgpu.py and run_clue_mgpu.py share: the suite's flags, its checks, sweeps, the towers, and
its closing table. Each script names its data flag and calls its suite's `run`.

Example (a script):
    flags.DEFINE_string("clue_dir", None, "CLUE's data, a folder a task as its downloads lay them out.")
    suite.define_suite_flags("Tasks to run ...", "A run directory per task ...", "Write the leaderboard files ...")
    def run():
        suite.run_suite(FLAGS, __file__, "clue_dir", "CLUE", clue)
"""

import time

from absl import flags

from bert_mgpu.cli import define_tower_flags, sweep


def define_suite_flags(tasks_help, output_help, predict_help):
    """The flags every suite has; its data folder's flag and the recipe flags (learning rate, epochs, batch,
    length) are the script's, as their names and defaults differ."""
    flags.DEFINE_list("tasks", ["all"], tasks_help)
    flags.DEFINE_string("init_checkpoint", None, "The model to fine-tune (any format run_classifier_mgpu.py reads).")
    flags.DEFINE_string("output_dir", None, output_help)
    flags.DEFINE_bool("do_predict", True, predict_help)
    flags.DEFINE_integer("eval_batch_size", 32, "Per tower.")
    flags.DEFINE_integer("seed", 12345, "Random seed.")
    flags.DEFINE_integer("save_checkpoints_steps", 1000, "Checkpoint every this many steps.")
    define_tower_flags()
    sweep.define_sweep_flags()


def run_suite(f, script, data_flag, title, module, **recipe):
    """Run `module.run` (glue or clue) as the flags say, or a sweep of it; print and return its results.
    `recipe`: more keywords for `module.run` (e.g. GLUE's truncation)."""
    import logging

    import keras

    from bert_mgpu import cli
    from bert_mgpu.core.errors import UserError

    started = time.monotonic()
    cli.check_numbers(f, at_least={"max_seq_length": 3, "train_batch_size": 1, "eval_batch_size": 1,
                                "save_checkpoints_steps": 1, "log_every_steps": 1},
                      positive=("learning_rate", "num_train_epochs"))
    if sweep.requested(f):  # the suite once per configuration and seed; per task, which is best
        return sweep.run_sweep(f, script)
    for name in (data_flag, "init_checkpoint", "output_dir"):
        if not getattr(f, name):
            raise UserError(f"--{name} is required")
    keras.utils.set_random_seed(f.seed)
    towers = cli.towers_from_flags(f, *cli.plan_from_flags(f), f.train_batch_size or 32)
    logging.info("%s", towers.plan.describe())
    tasks = None if f.tasks == ["all"] else f.tasks
    results = module.run(getattr(f, data_flag), f.init_checkpoint, f.output_dir, tasks, towers,
                         do_predict=f.do_predict, precision=f.precision,
                         max_seq_length=f.max_seq_length, epochs=f.num_train_epochs,
                         learning_rate=f.learning_rate, batch_size=f.train_batch_size,
                         eval_batch_size=f.eval_batch_size, seed=f.seed,
                         save_checkpoints_steps=f.save_checkpoints_steps, use_xla=f.use_xla,
                         recompute=f.recompute, log_every=f.log_every_steps,
                         report_to=tuple(f.report_to), verbose=False, **recipe)
    if towers.is_chief:
        if f.sweep_member:
            scores = module.task_scores(results)
            sweep.write_member(f.output_dir, scores, list(scores))
        name = title.lower()
        print(module.table(results))
        print(f"{title}: {len(results)} results in {f.output_dir}/{name}_results.md and {name}_results.tsv"
              + (f", leaderboard files in {f.output_dir}/submission/" if f.do_predict else "")
              + f" ({time.monotonic() - started:.0f} s)")
    return results
