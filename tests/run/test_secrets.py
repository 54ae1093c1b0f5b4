"""Secrets stay secret (docs/security.md): the reward server's key is never written where the config is, a resume reads
it again from the user's config or environment, and the trainer reads it from a file only its user can read."""

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from helpers.reward_servers import API_KEY_ENV, reward_server

from alignment.basics.errors import ConfigError
from alignment.basics.key_files import key_from_environment, read_key_file
from alignment.config.schema import GRPOConfig

KEY = "a-reward-server-key-" + os.urandom(8).hex()


def launch(tmp_path: Path, *flags: str, env: dict) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node", "1", "--log_dir", str(tmp_path / "launch"),
               "run_grpo.py", "config/tiny/grpo_argument.json", "--output_dir", str(tmp_path / "out"), "--eval_datasets", "",
               "--max_dec_len", "16", "--save_steps", "1", *flags]
    environment = {name: value for name, value in os.environ.items() if not name.startswith(API_KEY_ENV)} | env
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, env=environment)
    assert done.returncode == 0, f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


def private_file(path: Path, text: str, mode: int = 0o600) -> Path:
    path.write_text(text + "\n")
    path.chmod(mode)
    return path


def test_grpo_config_json_holds_set_or_unset_in_a_secrets_place():
    assert json.loads(GRPOConfig(reward_server_api_key=KEY).to_json())["reward_server_api_key"] == "set"
    assert json.loads(GRPOConfig().to_json())["reward_server_api_key"] == "unset"
    assert KEY not in GRPOConfig(reward_server_api_key=KEY).dashboard_settings().run_config.values()  # W&B's run config too


def test_a_key_file_is_read_only_where_nobody_else_may_read_it(tmp_path, monkeypatch):
    assert read_key_file(str(private_file(tmp_path / "key", KEY)), "--x") == KEY
    with pytest.raises(ConfigError, match=r"--x = \S+: the key file must be this user's and readable by nobody else .*mode 604"):
        read_key_file(str(private_file(tmp_path / "open", KEY, 0o604)), "--x")
    with pytest.raises(ConfigError, match=r"--x = \S+missing: the key file cannot be read \(No such file or directory\)"):
        read_key_file(str(tmp_path / "missing"), "--x")
    monkeypatch.setenv("SOME_KEY", "from-the-environment")
    assert key_from_environment("SOME_KEY") == "from-the-environment"
    monkeypatch.setenv("SOME_KEY_FILE", str(tmp_path / "key"))
    assert key_from_environment("SOME_KEY") == KEY  # the file first


def test_the_trainer_reads_the_reward_servers_key_from_its_config_a_file_or_the_environment(tmp_path, monkeypatch):
    from alignment.run.scorer import reward_server_key

    for name in ("PADDLE_TRAINER_ENDPOINTS", API_KEY_ENV, f"{API_KEY_ENV}_FILE"):
        monkeypatch.delenv(name, raising=False)
    assert reward_server_key(GRPOConfig(reward_server_api_key=KEY)) == KEY
    assert reward_server_key(GRPOConfig(reward_server_api_key="set")) is None  # grpo_config.json's placeholder: no key
    monkeypatch.setenv(API_KEY_ENV, "from-the-environment")
    assert reward_server_key(GRPOConfig(reward_server_api_key="unset")) == "from-the-environment"
    monkeypatch.setenv("PADDLE_TRAINER_ENDPOINTS", "127.0.0.1:6170")  # under paddle.distributed.launch, which logs the environment
    with pytest.warns(UserWarning, match="GRPO_REWARD_SERVER_API_KEY: paddle.distributed.launch writes the environment, this key"):
        assert reward_server_key(GRPOConfig()) == "from-the-environment"
    monkeypatch.setenv(f"{API_KEY_ENV}_FILE", str(private_file(tmp_path / "key", KEY)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the file first, and no warning
        assert reward_server_key(GRPOConfig()) == KEY


@pytest.mark.slow  # two tiny runs of a step each through the real reward server (about 40 s)
def test_the_reward_servers_key_is_never_written_and_a_resume_reads_it_again(tmp_path):
    """A run scoring through the real keyed server, its key given on the command line: grpo_config.json (in output_dir
    and the checkpoint) holds "set", and no file of the run or the launcher's log holds the key. Its resume, the key now
    in a 0600 file named by GRPO_REWARD_SERVER_API_KEY_FILE, passes the settings check and scores through the same server,
    which answers 401 to a request without the key."""
    out = tmp_path / "out"
    with reward_server(tmp_path, "--workers", "1", env={API_KEY_ENV: KEY}) as server:
        flags = ["--use_rm_server", "true", "--reward_server", server.url, "--reward_server_retries", "0"]
        launch(tmp_path, *flags, "--max_steps", "1", "--reward_server_api_key", KEY, env={})
        for config in (out / "grpo_config.json", out / "checkpoint-1" / "grpo_config.json"):
            assert json.loads(config.read_text())["reward_server_api_key"] == "set"
        written = [path for folder in (out, tmp_path / "launch") for path in folder.rglob("*") if path.is_file()]
        assert [path for path in written if KEY.encode() in path.read_bytes()] == []
        key_file = private_file(tmp_path / "reward.key", KEY)
        done = launch(tmp_path, *flags, "--max_steps", "2", "--resume_from_checkpoint", "auto",
                      env={f"{API_KEY_ENV}_FILE": str(key_file)})
        assert "reward_server_api_key" not in done.stdout + done.stderr  # not a changed setting: read again
        steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
        assert [step for step in steps if step] == [1, 2]
        assert " status=200" in server.log.read_text() and " status=401" not in server.log.read_text()
