# ---
# jupyter:
#   accelerator: GPU
#   colab:
#     provenance: []
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
#   language_info:
#     name: python
# ---

# %% [markdown]
# # {{number}} · {{title}}
#
# {{badges}}
#
# {{header}}
#
# **Time:** {{time}}
#
# **Contents:** {{contents}}

# %% [markdown]
# ## 0. Setup
# On Colab or Kaggle the next cell installs {{package}} and keeps the preinstalled PyTorch (labkit never
# reinstalls torch); locally, `make lab` has installed it already. The cell after it reads the *profile*,
# which sets how much work every experiment does (`ci`: seconds, for automated checks; `quick`: minutes on
# a laptop CPU, the default without a GPU; `full`: the default on a GPU; set `LABKIT_PROFILE` before
# starting Jupyter to choose), and reports the hardware.

# %%
import os
import sys

if "google.colab" in sys.modules or "KAGGLE_KERNEL_RUN_TYPE" in os.environ:
    %pip install -q "{{install_spec}}"
try:
    import labkit
except ModuleNotFoundError:  # the install above failed, or this Jupyter is not the one `make lab` set up
    raise SystemExit(
        "labkit is not installed. On Kaggle: Settings > Internet on (or add labkit's wheel as a dataset and "
        "%pip install it), then run this cell again. On Colab: run it again. Locally: start with `make lab`."
    ) from None

# %% [markdown]
# {{body}}

# %% [markdown]
# ---
# {{next}}
