"""Install: pip install -e '.[cpu]' on a CPU machine (the Makefile installs '.[cpu,test]' inside .venv);
with a GPU, install paddlepaddle-gpu first (README), then pip install -e ."""

from setuptools import find_packages, setup

# Pins, each for a reason found on paddle 3.3.1 CPU:
# - paddleformers 1.0.0: 1.1 and 1.2 import paddlefleet for Qwen2, which PyPI does not have.
# - transformers 4.57.6 and huggingface_hub < 1.0: paddleformers 1.0.0 imports
#   huggingface_hub.repo_type_and_id_from_hf_id, gone in hub 1.x, and transformers 5.x needs hub >= 1.31.
# - datasets 4.4.2: the newest datasets that accepts huggingface_hub < 1.0.
# paddle itself is not among them: paddlepaddle (CPU) and paddlepaddle-gpu are two distributions of one
# `paddle` package, so requiring either would install it over the other. The CPU wheel is the `cpu` extra;
# GPU users install paddlepaddle-gpu 3.3.1 first (paddleformers leaves paddle out for the same reason).
INSTALL_REQUIRES = [
    "paddleformers==1.0.0",
    "transformers==4.57.6",
    "huggingface_hub>=0.34,<1.0",
    "datasets==4.4.2",
    "tokenizers>=0.22,<0.24",
    "safetensors>=0.4",
    "numpy>=1.26,<2",
    "visualdl==2.5.3",
    "matplotlib>=3.8",  # alignment/storage/curves.py draws curves.png (visualdl pulls it in too)
    "math-verify==0.9.0",
    "tqdm>=4.66",
    "scipy>=1.11",  # alignment/algo/eval_stats.py: the Wilson interval, the t quantile and the exact binomial test
    # The reward server and its client (reward_server/, alignment/rewards/remote.py), at the versions tested.
    # httpx 0.28 is what paddlepaddle 3.3.1 already pulls in.
    "fastapi==0.165.0",
    "uvicorn==0.54.0",
    "httpx==0.28.1",
    # GGUF files (llama.cpp, Ollama) in: alignment/models/gguf_import.py reads and dequantizes them with llama.cpp's own Python
    # package (numpy only); 0.19.0 is the version its dequantization was checked against ggml's definitions with.
    "gguf==0.19.0",
    # The tools' sandbox (alignment/tools/sandbox.py) compiles its seccomp filter with libseccomp through these ctypes
    # bindings: the system's libseccomp.so.2 (Debian's libseccomp2, which systemd needs too), nothing to build; 0.1.2 tested.
    "pyseccomp==0.1.2",
    # The instruction-following rewards (alignment/rewards/instructions.py): IFEval's and IFBench's verifiers as
    # if-verifiable 0.1.2 carries them; emoji, immutabledict, langdetect and syllapy, which they read, come as its requirements.
    "if-verifiable==0.1.2",
    "nltk==3.10.4",  # the verifiers' sentence tokenizer and stop words; its data comes from alignment/rewards/nltk_resources.py
    "pyarrow==21.0.0",  # datasets (which if_verifiable's __init__ imports) on numpy < 2: pyarrow 26 fails to import with numpy 1.26
]

# The documentation site (make docs): mkdocs with the Material theme, the newest versions tested.
DOCS = ["mkdocs==1.6.1", "mkdocs-material==9.8.1"]

setup(
    name="paddle-grpo",
    version="0.1.0",
    description="GRPO trainer for PaddlePaddle, driven by one JSON file",
    python_requires=">=3.10",
    packages=find_packages(include=["alignment", "alignment.*", "reward_server"]),
    py_modules=["run_grpo"],
    install_requires=INSTALL_REQUIRES,
    extras_require={
        "cpu": ["paddlepaddle==3.3.1"],
        # report_to's other dashboards (alignment/storage/dashboards.py); VisualDL, the default, is a requirement above.
        # tensorboardX writes TensorBoard's event files without torch or TensorFlow.
        "tensorboard": ["tensorboardX>=2.6"],
        "wandb": ["wandb>=0.19"],
        "test": [
            "pytest>=8",
            "pytest-timeout>=2.3",
            "pytest-xdist==3.8.0",  # the make targets run the suite in one worker per core, up to four (TEST_WORKERS)
            "absl-py==2.5.1",  # IFBench's reference test cases (tests/rewards/test_instructions.py) are absl parameterized tests
            "ruff==0.17.6",  # make lint (the first step of make test): one version, so a new rule cannot fail CI unannounced
            # fuzzing the reward server from its OpenAPI schema, and checking that schema
            "schemathesis==4.32.5",
            "hypothesis==6.170.15",
            "openapi-spec-validator==0.9.0",
            # report_to: the writers, and the readers the tests read their files back with (tensorboard's EventAccumulator;
            # wandb's own `wandb leet inspect --json`, which 0.31 has)
            "tensorboardX==2.6.5",
            "tensorboard==2.21.0",
            "wandb==0.31.0",
            *DOCS,  # make test builds the documentation site
        ],
        "docs": DOCS,
    },
    entry_points={
        "console_scripts": ["run-grpo=run_grpo:main", "grpo-reward-server=reward_server.reward_server:main"]
    },
)
