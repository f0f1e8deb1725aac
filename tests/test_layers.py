"""The package's layers are its subpackages, lowest first: a module imports only from its own layer or lower
ones, and no import cycle exists (function-level imports count too). docs/architecture.md lists them."""

import ast
import os

from conftest import ROOT

LAYERS = ("core", "model", "data", "parallel", "io", "train", "api", "cli")
PACKAGE = os.path.join(ROOT, "bert_mgpu")


def modules():
    """{dotted module name under bert_mgpu (a layer's __init__ is the layer's name): its file}."""
    found = {}
    for layer in sorted(os.listdir(PACKAGE)):
        directory = os.path.join(PACKAGE, layer)
        if not os.path.isdir(directory) or layer == "__pycache__":
            continue
        for name in sorted(os.listdir(directory)):
            if name.endswith(".py"):
                found[layer if name == "__init__.py" else f"{layer}.{name[:-3]}"] = os.path.join(directory, name)
    return found


def imports():
    """{module: {imported bert_mgpu module}} for every module of the package, by dotted name; an import of a
    name that is no module here (an old flat path) shows as itself, which has no layer."""
    files = modules()
    graph = {}
    for module, path in files.items():
        found = set()
        for node in ast.walk(ast.parse(open(path).read())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("bert_mgpu"):
                base = node.module[len("bert_mgpu."):] if node.module != "bert_mgpu" else ""
                for a in node.names:
                    name = f"{base}.{a.name}".strip(".")
                    found.add(name if name in files or not base else base)
            elif isinstance(node, ast.Import):
                found |= {a.name[len("bert_mgpu."):] for a in node.names if a.name.startswith("bert_mgpu.")}
        graph[module] = found - {module}
    return graph


def layer_of(module):
    return module.split(".")[0]


def test_every_module_sits_in_a_layer_and_imports_only_its_own_or_lower_ones():
    graph = imports()
    assert sorted(f for f in os.listdir(PACKAGE) if f.endswith(".py")) == ["__init__.py"], \
        "every module goes into the subpackage of its layer"
    assert sorted({layer_of(m) for m in graph} - set(LAYERS)) == [], "a new subpackage needs its place in LAYERS"
    unknown = sorted({d for deps in graph.values() for d in deps} - set(graph))
    assert unknown == [], "imports of names that are no module here (an old flat path?)"
    upward = sorted(f"{m} imports {d}" for m, deps in graph.items() for d in deps
                    if LAYERS.index(layer_of(d)) > LAYERS.index(layer_of(m)))
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
    "cli.gpu_check": "its parent process never loads TensorFlow: each check runs in a child",
    "cli.checks_gpu": "each check, in its own child process, loads only what it tests",
    "cli.check_models": "as cli.checks_gpu: a check's child loads only what it builds",
    "cli.fine_tuning": "scripts import it to define flags before TensorFlow loads, as cli",
    "cli.exports": "scripts import it to define flags before TensorFlow loads, as cli",
    "cli.masking": "scripts import it to define flags before TensorFlow loads, as cli",
    "cli.suite": "scripts import it to define flags before TensorFlow loads, as cli",
    "model.config": "BertConfig reads and checks bert_config.json without loading TensorFlow (kernels does)",
    "train.train_config": "TrainConfig stays without TensorFlow: it loads model.lora only when --lora_rank is given",
    "io.outputs": "plot loads matplotlib, an optional dependency",
    "data.squad_input": "a question answerer's export is served with it where TensorFlow is not installed: only "
                        "training's dataset loads TensorFlow",
}


def test_bert_mgpu_imports_are_at_the_top_but_where_a_reason_is_given():
    deferred = set()
    for name, path in modules().items():
        tree = ast.parse(open(path).read())
        for function in (n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
            for node in ast.walk(function):
                if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "bert_mgpu":
                    deferred.add(name)
    assert sorted(deferred - set(DEFERRED)) == [], "import it at the top, or say in DEFERRED why not"
    assert sorted(set(DEFERRED) - deferred) == [], "no longer deferred: drop it from DEFERRED"


def test_module_paths_from_before_the_subpackages_import_the_same_modules():
    """Notebooks written against the flat package keep working: `bert_mgpu.loop`, `from bert_mgpu import plot`."""
    import importlib

    import bert_mgpu.api.embeddings
    import bert_mgpu.io.plot
    import bert_mgpu.loop
    import bert_mgpu.train.loop
    from bert_mgpu import embeddings, plot

    assert bert_mgpu.loop is bert_mgpu.train.loop and bert_mgpu.loop.Loop is bert_mgpu.train.loop.Loop
    assert plot is bert_mgpu.io.plot and embeddings is bert_mgpu.api.embeddings
    # The flat package's modules, fixed since the move (a module written after it never had a flat path, so a
    # new module needs nothing here).
    assert len(bert_mgpu._LAYER_OF) == 48
    for name, layer in bert_mgpu._LAYER_OF.items():
        assert f"{layer}.{name}" in modules(), name
        assert importlib.import_module(f"bert_mgpu.{name}") is importlib.import_module(f"bert_mgpu.{layer}.{name}")


def test_no_module_of_the_package_reads_absls_global_flags():
    """Issue 67's flags as data: the scripts read absl's FLAGS and pass them down (`cli.prelude(FLAGS, ...)`,
    `distill.Options.from_flags(FLAGS)`); nothing in the package names the global, so a flag's route is greppable
    from its script and `main` runs again in one process (test_script_runner)."""
    named = []
    for name, path in modules().items():
        for node in ast.walk(ast.parse(open(path).read())):
            if isinstance(node, ast.Name) and node.id == "FLAGS" or (
                    isinstance(node, ast.Attribute) and node.attr == "FLAGS"):
                named.append(f"{name}:{node.lineno}")
    assert named == []
