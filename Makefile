# make train: a fresh machine (Python 3.11, pip, gcc) -> .venv with the pinned dependencies -> the bundled run.
# make test:  the same environment -> the whole test suite (CI runs this through .ci/run).
# make test-hf: the checks against transformers in PyTorch (a separate .venv-torch).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
INSTALLED := $(VENV)/.installed

.PHONY: venv train test test-hf data ops

$(INSTALLED): setup.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $@

# The fused rollout operators, rebuilt whenever csrc/ changes (about 25 s on 2 cores).
OPS := csrc/build/grpo_ops/grpo_ops.so
$(OPS): $(INSTALLED) $(wildcard csrc/*.cc csrc/*.h csrc/*.cu csrc/build.py)
	$(PY) csrc/build.py

venv: $(INSTALLED) $(OPS)

ops: $(OPS)

train: $(INSTALLED) $(OPS)
	$(PY) -m paddle.distributed.launch --nproc_per_node 1 --log_dir output/tiny/launch_log \
		run_grpo.py config/tiny/grpo_argument.json

test: $(INSTALLED) $(OPS)
	$(PY) -m pytest

# make test-hf: the Hugging Face interop tests against transformers in PyTorch, which lives in its own
# .venv-torch (torch is never installed beside paddle); tests/hf_side.py runs there.
VENV_TORCH := .venv-torch
TORCH_INSTALLED := $(VENV_TORCH)/.installed

$(TORCH_INSTALLED):
	$(PYTHON) -m venv $(VENV_TORCH)
	$(VENV_TORCH)/bin/python -m pip install --quiet --upgrade pip
	$(VENV_TORCH)/bin/python -m pip install --quiet torch==2.13.0 transformers==4.57.6
	touch $@

test-hf: $(INSTALLED) $(OPS) $(TORCH_INSTALLED)
	GRPO_TORCH_PYTHON=$(abspath $(VENV_TORCH))/bin/python $(PY) -m pytest -m hf

# Rebuild the bundled task and tiny model (deterministic; the model takes about 35 minutes on 2 cores).
data: $(INSTALLED)
	$(PY) data/arith_task.py
	$(PY) data/kk/make_kk.py --seed 0 --train 2000 --test 200 --out data/kk
	$(PY) data/make_tiny_model.py
