"""The package's layers, lowest first: a module imports only from its own layer or lower ones, and no import
cycle exists (function-level imports count too). A new module must be given its layer here; the README's
"Layout" lists the same table."""

import ast
import os

from conftest import ROOT

LAYERS = {
    "core": ("errors", "_compat", "storage", "quiet", "supervise", "text_files", "weight_names", "metrics",
             "precision", "schedules", "cluster"),
    "model": ("kernels", "config", "fused_encoder", "modeling", "pretraining_model", "objectives"),
    "data": ("tokenization", "vocab", "tasks", "glue_tasks", "input_pipeline", "pretraining_input",
             "pretraining_records"),
    "parallel": ("distribute", "devices", "guards"),
    "io": ("checkpoints", "loading", "run_dir", "trained", "export", "serving", "outputs", "plot"),
    "train": ("train_config", "optimization", "training", "loop", "memory", "evaluation", "session"),
    "api": ("classifier", "pretraining", "embeddings", "glue"),
    "cli": ("cli", "gpu_check", "checks_gpu"),
}
RANK = {module: i for i, modules in enumerate(LAYERS.values()) for module in modules}
PACKAGE = os.path.join(ROOT, "bert_mgpu")


def imports():
    """{module: {imported bert_mgpu module}} for every module of the package."""
    modules = sorted(f[:-3] for f in os.listdir(PACKAGE) if f.endswith(".py") and f != "__init__.py")
    graph = {}
    for module in modules:
        found = set()
        for node in ast.walk(ast.parse(open(os.path.join(PACKAGE, module + ".py")).read())):
            if isinstance(node, ast.ImportFrom) and node.module == "bert_mgpu":
                found |= {a.name for a in node.names if a.name in modules}
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("bert_mgpu."):
                found.add(node.module.split(".")[1])
            elif isinstance(node, ast.Import):
                found |= {a.name.split(".")[1] for a in node.names if a.name.startswith("bert_mgpu.")}
        graph[module] = found - {module}
    return graph


def test_every_module_has_a_layer_and_imports_only_its_own_or_lower_ones():
    graph = imports()
    assert sorted(set(graph) - set(RANK)) == [], "give each new module its layer in LAYERS"
    assert sorted(set(RANK) - set(graph)) == [], "a module in LAYERS no longer exists"
    layer = {m: name for name, ms in LAYERS.items() for m in ms}
    upward = sorted(f"{m} ({layer[m]}) imports {d} ({layer[d]})" for m, deps in graph.items() for d in deps
                    if RANK[d] > RANK[m])
    assert upward == []


def test_no_import_cycle():
    graph = imports()
    seen, path, cycles = set(), [], []

    def visit(module):
        if module in path:
            cycles.append(path[path.index(module):] + [module])
            return
        if module in seen:
            return
        seen.add(module)
        path.append(module)
        for dep in sorted(graph[module]):
            visit(dep)
        path.pop()

    for module in sorted(graph):
        visit(module)
    assert cycles == []


# Modules that import bert_mgpu modules inside functions, and why: every other import is at the top.
DEFERRED = {
    "cli": "scripts import it to define flags before TensorFlow loads, quietly (quiet.py)",
    "gpu_check": "its parent process never loads TensorFlow: each check runs in a child",
    "checks_gpu": "each check, in its own child process, loads only what it tests",
    "config": "BertConfig reads and checks bert_config.json without loading TensorFlow (kernels does)",
    "outputs": "plot loads matplotlib, an optional dependency",
}


def test_bert_mgpu_imports_are_at_the_top_but_where_a_reason_is_given():
    deferred = set()
    for name in sorted(f[:-3] for f in os.listdir(PACKAGE) if f.endswith(".py") and f != "__init__.py"):
        tree = ast.parse(open(os.path.join(PACKAGE, name + ".py")).read())
        for function in (n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
            for node in ast.walk(function):
                if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "bert_mgpu":
                    deferred.add(name)
    assert sorted(deferred - set(DEFERRED)) == [], "import it at the top, or say in DEFERRED why not"
    assert sorted(set(DEFERRED) - deferred) == [], "no longer deferred: drop it from DEFERRED"
