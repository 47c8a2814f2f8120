# The README's two commands: `make lab` (set up, open the lab) and `make test` (set up, run every test).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# The torch build the lab is tested with. On Colab/Kaggle the notebooks never reinstall torch.
TORCH_PIN ?= torch==2.14.1 torchvision==0.29.1
# torch 2.14 from PyPI is built with CUDA 13.0, which needs an NVIDIA driver of the R580 series or newer (and has no
# Volta kernels). With an older driver on this machine (nvidia-smi says which), take PyTorch's CUDA 12.8 build instead.
NVIDIA_DRIVER := $(shell nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -n 1)
TORCH_INDEX ?= $(if $(NVIDIA_DRIVER),$(if $(shell [ "$(firstword $(subst ., ,$(NVIDIA_DRIVER)))" -lt 580 ] && echo old),\
	--index-url https://download.pytorch.org/whl/cu128))
LAB_ARGS ?=
# torch is installed with --no-compile: byte-compiling its and the CUDA wheels' thousands of files took a core for
# about 60 of the setup's 230 s; Python compiles only what a run imports, once, and keeps it (so the lab and the
# tests may write bytecode even where the environment says not to). The rest is compiled as pip does: torchao, for
# one, has an invalid escape sequence, which Python 3.12 would show as a SyntaxWarning box in the notebook that
# first imports it (torch's own files compile without one).
unexport PYTHONDONTWRITEBYTECODE
# Jupyter refuses to start as root (containers, cloud VMs) unless told that it is meant.
ROOT_ARGS := $(if $(filter 0,$(shell id -u)),--allow-root)

.PHONY: install lab test notebooks strip clean-cache

# JupyterLab's settings for this environment only (its sys.prefix overrides): no news pop-up over the notebook.
LAB_OVERRIDES := $(VENV)/share/jupyter/lab/settings/overrides.json

$(BIN)/.labkit-installed: pyproject.toml scripts/jupyterlab-overrides.json
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --no-compile $(TORCH_INDEX) $(TORCH_PIN)
	$(BIN)/python -m pip install -q -e ".[dev]"
	mkdir -p $(dir $(LAB_OVERRIDES)) && cp scripts/jupyterlab-overrides.json $(LAB_OVERRIDES)
	touch $@

install: $(BIN)/.labkit-installed

lab: install
	$(BIN)/jupyter lab notebooks/00_start_here.ipynb $(ROOT_ARGS) $(LAB_ARGS)

# Sets up first: scripts/test.sh runs `make install` as its first part, with Colab's image built beside it.
test:
	PYTHON=$(BIN)/python HOST_PYTHON=$(PYTHON) MAKE=$(MAKE) bash scripts/test.sh

notebooks: install  # build every notebooks/NN_name.ipynb from its source notebooks/src/NN_name.py
	$(BIN)/python scripts/build_notebooks.py

strip:  # remove outputs from every notebook (a notebook saved from JupyterLab); `make notebooks` writes none
	$(BIN)/nbstripout notebooks/*.ipynb

clean-cache:
	rm -rf data/cache/results
