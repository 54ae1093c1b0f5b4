"""Installing the project keeps the paddle already installed: paddlepaddle (CPU) and paddlepaddle-gpu are two
distributions of one `paddle` package, so a requirement on either would install it over the other. The CPU
wheel comes only with the `cpu` extra (the Makefile's choice).

pip's own resolver answers, offline: a bare virtual environment gets a stand-in paddlepaddle-gpu wheel
installed by pip and the metadata of every other distribution this environment holds (paddle excepted), and
`pip install --dry-run --report` resolves the project's wheel (its metadata from setup.py through setuptools)
against it with --no-index, a stand-in paddlepaddle 3.3.1 being on offer in the local folder."""

import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
PIP_ENV = {**os.environ, "PIP_CONFIG_FILE": os.devnull, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1"}
PADDLE = {"paddlepaddle", "paddlepaddle-gpu"}


def write_wheel(folder: Path, name: str, version: str, metadata: str, files: dict) -> Path:
    """A pure-Python wheel (PEP 427) holding `files` ({path: text}) and METADATA."""
    stem = f"{name.replace('-', '_')}-{version}"
    info = f"{stem}.dist-info"
    contents = {
        **files,
        f"{info}/METADATA": metadata,
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: tests/project/test_install.py\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    contents[f"{info}/RECORD"] = "".join(f"{path},,\n" for path in [*contents, f"{info}/RECORD"])
    path = folder / f"{stem}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as wheel:
        for member, text in contents.items():
            wheel.writestr(member, text)
    return path


def project_wheel(folder: Path, tmp_path: Path) -> Path:
    """The project's wheel as far as a resolver reads it: the metadata setup.py gives. setuptools writes it as
    egg-info (the setuptools 65 that venv brings builds no wheel without the `wheel` package), and
    importlib.metadata turns requires.txt's sections into Requires-Dist lines with `extra ==` markers."""
    source = tmp_path / "source"
    source.mkdir()
    shutil.copy(ROOT / "setup.py", source)
    subprocess.run([sys.executable, "setup.py", "-q", "egg_info", "--egg-base", str(tmp_path)], cwd=source, check=True, capture_output=True)
    dist = importlib.metadata.Distribution.at(tmp_path / "paddle_grpo.egg-info")
    metadata = dist.read_text("PKG-INFO") + "".join(f"Requires-Dist: {requirement}\n" for requirement in dist.requires)
    return write_wheel(folder, dist.metadata["Name"], dist.version, metadata, {})


def stand_in_paddle(folder: Path, name: str) -> Path:
    """A wheel named `name` that, like both real ones, provides the `paddle` package."""
    metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: 3.3.1\n"
    package = {"paddle/__init__.py": f'"""A stand-in for {name} (tests/project/test_install.py)."""\n'}
    return write_wheel(folder, name, "3.3.1", metadata, package)


def bare_environment(folder: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True)
    return folder / "bin" / "python"


def pip(python: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), *args], env=PIP_ENV, capture_output=True, text=True, timeout=120
    )


@pytest.fixture(scope="module")
def gpu_environment(tmp_path_factory) -> tuple:
    """(python, wheels): an environment holding paddlepaddle-gpu and this project's other dependencies, and a
    folder of wheels with the project and paddlepaddle (CPU)."""
    tmp = tmp_path_factory.mktemp("install")
    wheels = tmp / "wheels"
    wheels.mkdir()
    project_wheel(wheels, tmp)
    stand_in_paddle(wheels, "paddlepaddle")
    python = bare_environment(tmp / "env")
    installed = pip(python, "install", "--no-index", "--no-deps", str(stand_in_paddle(tmp, "paddlepaddle-gpu")))
    assert installed.returncode == 0, installed.stderr
    # every other distribution installed here, as metadata: what pip's resolver reads of an installed one
    target = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                 capture_output=True, text=True, check=True).stdout.strip())
    for info in Path(sysconfig.get_paths()["purelib"]).glob("*.dist-info"):
        if canonicalize_name(importlib.metadata.Distribution.at(info).metadata["Name"]) not in PADDLE | {"paddle-grpo"}:
            shutil.copytree(info, target / info.name)
    return python, wheels


def would_install(python: Path, wheels: Path, requirement: str) -> dict:
    """{name: version} that pip would install for `requirement`, offline."""
    done = pip(python, "install", "--dry-run", "--quiet", "--report", "-", "--no-index", "--find-links", str(wheels), requirement)
    assert done.returncode == 0, done.stderr
    return {item["metadata"]["name"]: item["metadata"]["version"] for item in json.loads(done.stdout)["install"]}


def test_installing_the_project_beside_paddlepaddle_gpu_adds_no_second_paddle(gpu_environment):
    python, wheels = gpu_environment
    assert would_install(python, wheels, "paddle-grpo") == {"paddle-grpo": "0.1.0"}
    assert would_install(python, wheels, "paddle-grpo[test]") == {"paddle-grpo": "0.1.0"}


def test_the_cpu_extra_brings_the_cpu_wheel(gpu_environment):
    python, wheels = gpu_environment
    assert would_install(python, wheels, "paddle-grpo[cpu]") == {"paddle-grpo": "0.1.0", "paddlepaddle": "3.3.1"}


def test_without_paddle_the_trainer_says_how_to_install_it(tmp_path):
    done = subprocess.run([str(bare_environment(tmp_path / "env")), str(ROOT / "run_grpo.py"), "config/tiny/grpo_argument.json"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert done.stderr.startswith("paddle is not installed in this environment: `pip install -e '.[cpu]'` adds the CPU wheel")
    assert len(done.stderr.splitlines()) == 1


@pytest.mark.parametrize("command, module", [([str(ROOT / "run_grpo.py"), "config/tiny/grpo_argument.json"], "paddle"),
                                             (["-m", "alignment.curves", "output/tiny"], "matplotlib")], ids=["paddle", "matplotlib"])
def test_a_python_without_the_packages_points_to_the_venv_beside_it(tmp_path, command, module):
    """The system python run where `make train` made .venv (its commands copied without the .venv/bin/ prefix): one line
    naming the module, the Python that ran and the one to use, not a traceback."""
    (tmp_path / ".venv" / "bin").mkdir(parents=True)
    (tmp_path / ".venv" / "bin" / "python").touch()  # only its being there counts
    python = bare_environment(tmp_path / "system")
    done = subprocess.run([str(python), *command], cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and len(done.stderr.splitlines()) == 1, done.stderr
    assert done.stderr.startswith(f"{module} is not installed in this environment ({python}); ./.venv/bin/python, the environment "
                                  "make sets up, is here: run the command with .venv/bin/python instead"), done.stderr
