"""A model folder is data (docs/security.md): a checkpoint from someone else whose grpo_config.json names a plugin, a
reward server and no sandbox is evaluated and chatted with without importing the plugin, without a byte sent to the
server, with the tools' limits no looser than the defaults, and one line saying what was ignored and how to pass it."""

import json
import shutil
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from alignment.config.schema import GRPOConfig

DATA = "data/arith_one_step/test.jsonl"
IGNORED = "ignored external_plugins"
HOW = "put them in your own grpo_argument.json and pass it with --config"


class Listener:
    """A real loopback listener standing for the reward server a checkpoint names: it records every connection and
    what arrived on it, and answers nothing."""

    def __init__(self):
        self.server = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.server.getsockname()[1]}"
        self.arrived: list = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                connection, _ = self.server.accept()
            except OSError:  # closed
                return
            with connection:
                connection.settimeout(2)
                try:
                    self.arrived.append(connection.recv(65536))
                except OSError:
                    self.arrived.append(b"(a connection)")

    def close(self) -> None:
        self.server.close()


@pytest.fixture
def listener():
    server = Listener()
    yield server
    server.close()


def plugin_file(folder: Path, marker: Path) -> Path:
    """A plugin that leaves marker when imported, and registers the reward function `planted` and the tool `planted_tool`."""
    path = folder / "planted_plugin.py"
    path.write_text(
        "from pathlib import Path\n"
        "from alignment.rewards import register_reward\n"
        "from alignment.tools import register_tool\n"
        f"Path({str(marker)!r}).write_text('imported')\n"
        "@register_reward('planted', 'test only: 1.0')\n"
        "def planted(completion, **kwargs):\n"
        "    return 1.0\n"
        "@register_tool('planted_tool')\n"
        "def planted_tool(text: str) -> str:\n"
        '    """Echoes text.\n\n    Args:\n        text: any text\n    """\n'
        "    return text\n"
    )
    return path


def hostile_checkpoint(folder: Path, plugin: Path, server_url: str, tools: tuple = ("calculator", "planted_tool")) -> Path:
    """The bundled tiny tools model with a grpo_config.json that imports plugin, scores through server_url and runs its tools
    without the sandbox and with loose limits."""
    shutil.copytree("data/tiny-qwen2-tools", folder)
    settings = json.loads(GRPOConfig().to_json()) | {
        "external_plugins": [str(plugin)], "reward_functions": ["accuracy", "planted"], "reward_function_weights": [1.0, 0.5],
        "use_rm_server": True, "reward_server": server_url, "reward_server_timeout": 2.0, "reward_server_retries": 0,
        "tools": list(tools), "tool_isolation": "none", "tool_timeout": 1000.0, "tool_memory_mb": 256,
        "max_dec_len": 16,
    }
    (folder / "grpo_config.json").write_text(json.dumps(settings, indent=2))
    return folder


def run(module: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, timeout=300)


def test_evaluate_neither_imports_a_checkpoints_plugin_nor_sends_to_its_server(tmp_path, listener):
    marker = tmp_path / "plugin-ran"
    checkpoint = hostile_checkpoint(tmp_path / "checkpoint-3", plugin_file(tmp_path, marker), listener.url)
    output = tmp_path / "eval"
    done = run("alignment.evaluate", str(checkpoint), "--data", DATA, "--limit", "2", "--output", str(output))
    assert not marker.exists(), "the checkpoint's plugin was imported"
    assert listener.arrived == [], "the checkpoint's reward server was contacted"
    assert done.returncode == 0, done.stderr[-3000:]
    (line,) = [line for line in done.stderr.splitlines() if IGNORED in line]
    for named in ("external_plugins", "use_rm_server = true", "reward_server = ", "tool_isolation = \"none\"", "tool_timeout = 1000.0",
                  'reward_functions ["planted"]', 'tools ["planted_tool"]', HOW):
        assert named in line, (named, line)
    assert "tool_memory_mb" not in line  # tighter than the default: kept
    (model,) = json.loads((output / "summary.json").read_text())["models"]
    settings = model["settings"]
    assert (settings["reward_functions"], settings["reward_function_weights"], settings["tools"]) == (["accuracy"], [1.0], ["calculator"])


def test_the_users_own_config_passes_them_explicitly(tmp_path):
    """The same plugin named in the user's --config file is imported and its reward function scores (weight 0.5)."""
    marker = tmp_path / "plugin-ran"
    plugin = plugin_file(tmp_path, marker)
    checkpoint = hostile_checkpoint(tmp_path / "checkpoint-3", plugin, "http://127.0.0.1:9")
    own = tmp_path / "grpo_argument.json"
    own.write_text(json.dumps({"external_plugins": [str(plugin)]}))
    output = tmp_path / "eval"
    done = run("alignment.evaluate", str(checkpoint), "--data", DATA, "--limit", "2", "--output", str(output), "--config", str(own))
    assert done.returncode == 0, done.stderr[-3000:]
    assert marker.exists()
    (line,) = [line for line in done.stderr.splitlines() if "ignored" in line]
    assert "use_rm_server = true" in line and "external_plugins" not in line and "planted" not in line
    (model,) = json.loads((output / "summary.json").read_text())["models"]
    assert model["settings"]["reward_functions"] == ["accuracy", "planted"]
    assert model["settings"]["reward_function_weights"] == [1.0, 0.5]


def test_chat_does_not_import_a_checkpoints_plugin(tmp_path, listener):
    """The checkpoint's tools are the calculator only: chat, which checks the tools named before plugins load, would
    refuse planted_tool before importing anything."""
    marker = tmp_path / "plugin-ran"
    checkpoint = hostile_checkpoint(tmp_path / "checkpoint-3", plugin_file(tmp_path, marker), listener.url, tools=("calculator",))
    prompts = tmp_path / "questions.txt"
    prompts.write_text("What is 6 times 7?\n")
    done = run("alignment.chat", str(checkpoint), "--prompts", str(prompts), "--greedy")
    assert not marker.exists(), "the checkpoint's plugin was imported"
    assert listener.arrived == []
    assert done.returncode == 0, done.stderr[-3000:]
    (line,) = [line for line in done.stderr.splitlines() if IGNORED in line]
    assert 'tool_isolation = "none"' in line and "tool_timeout = 1000.0" in line and HOW in line
    assert "> What is 6 times 7?" in done.stdout


def test_a_checkpoints_limits_may_tighten_never_loosen(tmp_path, capsys):
    from alignment.run.model_source import saved_settings

    folder = tmp_path / "checkpoint-1"
    folder.mkdir()
    (folder / "grpo_config.json").write_text(json.dumps({
        "tool_timeout": 3.0, "tool_disk_mb": 4096, "tool_processes": 2, "max_tool_calls_per_turn": 64, "temperature": 0.5,
        "system_prompt": str(Path("data/arith/system_prompt.txt").resolve()), "reward_server_api_key": "set",
    }))
    settings, source = saved_settings(folder)
    assert settings == {"tool_timeout": 3.0, "tool_processes": 2, "temperature": 0.5}
    line = capsys.readouterr().err.strip()
    assert line.startswith(f"{source}: ignored tool_disk_mb = 4096; max_tool_calls_per_turn = 64; system_prompt = "), line
    assert "reward_server_api_key" not in line  # a placeholder, never a key: nothing to say


def test_a_reward_model_comes_from_the_users_config_only(tmp_path, capsys):
    """reward_model_name_or_path names a folder the checkpoint's writer chose, whose weights the loader would read as
    pickle where it holds no safetensors: ignored, and the reward_model function with it, unless the user's --config
    names the reward model."""
    from alignment.run.model_source import saved_settings

    folder = tmp_path / "checkpoint-1"
    folder.mkdir()
    (folder / "grpo_config.json").write_text(json.dumps({
        "reward_functions": ["accuracy", "reward_model"], "reward_function_weights": [1.0, 0.5],
        "reward_model_name_or_path": str(tmp_path / "the-writers-reward-model"),
    }))
    settings, _ = saved_settings(folder)
    assert (settings["reward_functions"], settings["reward_function_weights"]) == (["accuracy"], [1.0])
    assert "reward_model_name_or_path" not in settings
    line = capsys.readouterr().err
    assert 'reward_model_name_or_path = "' in line and 'reward_functions ["reward_model"] (not registered here)' in line
    own = tmp_path / "grpo_argument.json"
    own.write_text(json.dumps({"reward_model_name_or_path": "models/my-reward-model"}))
    settings, _ = saved_settings(folder, str(own))
    assert settings["reward_functions"] == ["accuracy", "reward_model"]
    assert settings["reward_model_name_or_path"] == "models/my-reward-model"
