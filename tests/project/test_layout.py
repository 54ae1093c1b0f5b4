"""The house plan as checks (docs/architecture.md, "Layout"): no import circles, the layers import downwards only, the
rollout process never imports the trainer, and the shape limits (trainer.py at most 400 lines, functions at most 80
lines and 7 parameters; thin wrappers of compiled operators and autograd forward/backward aside)."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "alignment"
# What the checks read: the trainer's package, and the reward server (a program of its own over alignment.rewards)
SOURCES = [path for folder in (PACKAGE, ROOT / "reward_server") for path in sorted(folder.rglob("*.py"))]

# Layers from the top down, each a set of whole folders: a module may import its own layer's modules and those below,
# never above. The top layer is the commands: the modules directly in alignment/ (chat, evaluate, export, gguf, merge_lora,
# curves, launch, the rollout worker's loop) and the reward server.
LAYERS = [
    ("alignment", "reward_server"),  # the commands
    ("alignment.step",),  # the loop and the step's phases
    ("alignment.run",),  # setting a run up: start, the one builder of its parts; the model a command is given
    ("alignment.config",),  # the keys: read, checked against each other and against the files and machine they name
    ("alignment.rollout", "alignment.rewards", "alignment.tools", "alignment.storage"),  # generating, scoring, what a run keeps
    ("alignment.algo", "alignment.kernels", "alignment.models", "alignment.parallel"),  # the math, operators, models, processes
    ("alignment.basics",),  # errors, runtime, plugins, output folders, prompts and the files they are read from
]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for path in SOURCES}


def imports(name: str) -> set:
    """The project's modules that `name` imports anywhere in its code: a function's own imports count too, and so do
    those under `if TYPE_CHECKING:` (an import for annotations only still ties the two modules together)."""
    found = set()
    for node in ast.walk(ast.parse(MODULES[name].read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                found.add(full if full in MODULES else node.module)
        elif isinstance(node, ast.ImportFrom) and node.level:  # alignment/rewards/__init__.py's `from . import`
            package = name if MODULES[name].name == "__init__.py" else name.rsplit(".", 1)[0]
            base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([node.module] if node.module else []))
            found |= {f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names}
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
    return {module for module in found if module in MODULES and module != name}


def layer_of(name: str) -> int:
    """The layer of the module's folder: the longest prefix wins, so alignment.run.build is in run/'s layer and
    alignment.chat, directly in alignment/, in the commands'."""
    matches = [(len(prefix), index) for index, prefixes in enumerate(LAYERS) for prefix in prefixes
               if name == prefix or name.startswith(prefix + ".")]
    assert matches, f"{name} is in no layer: add it to LAYERS in tests/project/test_layout.py"
    return max(matches)[1]


def test_the_layers_are_whole_folders():
    """Each entry of LAYERS names a folder, never a single module, and each folder of alignment/ is named: a new
    folder is placed on purpose, not left to the commands' layer."""
    named = {prefix for prefixes in LAYERS for prefix in prefixes}
    assert [prefix for prefix in named if not (ROOT / prefix.replace(".", "/")).is_dir()] == []
    assert {f"alignment.{path.parent.name}" for path in PACKAGE.glob("*/*.py")} - named == set()


def test_every_module_imports_only_its_layer_and_those_below():
    upward = [(name, imported) for name in MODULES for imported in imports(name)
              if imported != "alignment" and layer_of(imported) < layer_of(name)]  # the package's own __init__ imports nothing of it
    assert upward == []


def test_no_import_circle():
    graph = {name: imports(name) for name in MODULES}
    state, circles = {}, []

    def visit(name: str, path: list) -> None:
        state[name] = "open"
        for imported in sorted(graph[name]):
            if state.get(imported) == "open":
                circles.append(path[path.index(imported):] + [imported])
            elif imported not in state:
                visit(imported, path + [imported])
        state[name] = "done"

    for name in MODULES:
        if name not in state:
            visit(name, [name])
    assert circles == []


def closure(name: str) -> set:
    seen, todo = set(), [name]
    while todo:
        for imported in imports(todo.pop()) - seen:
            seen.add(imported)
            todo.append(imported)
    return seen


def test_the_rollout_process_does_not_import_the_trainer():
    assert "alignment.step.trainer" not in closure("alignment.rollout_worker")


def test_the_step_and_the_algorithms_read_their_settings_not_the_config():
    """step/ and algo/ read the frozen records alignment/run/build.py makes of the config once (run/settings.py,
    algo/loss_settings.py), never GRPOConfig or a section of it."""
    readers = [(name, module) for name in MODULES if name.startswith(("alignment.step.", "alignment.algo."))
               for module in imports(name) if module == "alignment.config" or module.startswith("alignment.config.")]
    assert readers == []
    assert "alignment.config.schema" in imports("alignment.run.build")  # the reader sees the import it looks for


def test_the_layers_are_seen_to_work():
    """The checks above would pass on an empty graph: the import reader must find what the trainer plainly imports."""
    assert {"alignment.step.update", "alignment.run.build", "alignment.basics.errors"} <= closure("alignment.step.trainer")
    assert layer_of("alignment.run.build") < layer_of("alignment.basics.data")
    assert layer_of("alignment.rollout_worker") == layer_of("reward_server.app") < layer_of("alignment.step.trainer")
    assert {"reward_server.app", "reward_server.body", "alignment.rewards.pool"} <= closure("reward_server.reward_server")


def test_an_import_for_annotations_only_counts(tmp_path, monkeypatch):
    module = tmp_path / "annotated.py"
    module.write_text("from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from alignment.basics.errors import ConfigError\n")
    monkeypatch.setitem(MODULES, "alignment.annotated", module)
    assert imports("alignment.annotated") == {"alignment.basics.errors"}


# Thin wrappers of compiled operators, and autograd's forward / backward (and the one call that applies a PyLayer),
# take the operators' inputs as they are.
WRAPPERS = {"alignment/kernels/ops.py"}
AUTOGRAD = {"forward", "backward", "chunked_token_logprobs"}


def functions():
    for path in SOURCES:
        shown = path.relative_to(ROOT).as_posix()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield shown, node


def parameter_count(node) -> int:
    arguments = node.args
    names = [a.arg for a in arguments.posonlyargs + arguments.args + arguments.kwonlyargs]
    return len([n for n in names if n not in ("self", "cls", "ctx")])


def test_functions_are_short():
    long = [f"{path}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)" for path, node in functions()
            if node.end_lineno - node.lineno + 1 > 80]
    assert long == []


def test_functions_take_at_most_seven_parameters():
    many = [f"{path}:{node.lineno} {node.name} ({parameter_count(node)})" for path, node in functions()
            if parameter_count(node) > 7 and path not in WRAPPERS and node.name not in AUTOGRAD]
    assert many == []


def test_the_trainer_is_the_loop_only():
    assert len((PACKAGE / "step" / "trainer.py").read_text().splitlines()) <= 400


@pytest.mark.parametrize("name", ["alignment.rollout.link", "alignment.rollout.link_handshake", "alignment.rollout.trainer_link",
                                  "alignment.rollout.worker_link", "alignment.rollout.multi_turn", "alignment.models.cpu_bf16"])
def test_errors_come_from_one_module(name):
    """A module that needs only an exception type imports alignment.basics.errors, not the module that raises it."""
    assert not any(module.startswith("alignment.config") for module in imports(name))
