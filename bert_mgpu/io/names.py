"""One name per head kind, the name of its `Head` (io/heads.py): a run's `kind`, its `task_type` (a
classifier's alone has a second level: classification, regression, multi_label) and an export's facts.

Runs and exports written while a kind had two names (a tagger's task_type "token_classification", a
pretraining run's kind "pretraining") keep loading: `current` maps their old names once, as they are read.

Example:
    current({"kind": "pretraining"})  # {"kind": "pretrainer"}
"""

UNNAMED = "classifier"  # the kind of a run written before runs recorded theirs: only a classifier's were
RENAMED = {"pretraining": "pretrainer", "token_classification": "tagger", "span_extraction": "question_answerer"}
NAMED = ("kind", "task_type")  # the keys whose values are kind names, at the top and in "settings"


def current(record):
    """`record` (a bert_mgpu.json, an export's facts) with its kind names as they are today, in a copy; anything
    else, or a record without old names, is returned as it is."""
    if not isinstance(record, dict):
        return record
    renamed = {key: RENAMED[value] for key, value in record.items() if key in NAMED and _old(value)}
    if isinstance(record.get("settings"), dict):
        settings = current(record["settings"])
        if settings is not record["settings"]:
            renamed["settings"] = settings
    return {**record, **renamed} if renamed else record


def kind_of(run):
    """The head kind of a bert_mgpu.json (read through `current`)."""
    return run.get("kind", UNNAMED)


def _old(value):
    return isinstance(value, str) and value in RENAMED
