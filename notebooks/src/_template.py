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
# On Colab or Kaggle the next cell installs {{package}}, never torch; locally `make lab` did. The cell after it
# reads the *profile*, how much work each experiment does (`ci` for automated checks, `quick` by default on a
# CPU, `full` on a GPU; `LABKIT_PROFILE` chooses), and reports the hardware.

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
    ) from None{{torchao_install}}

# %% [markdown]
# {{body}}

# %% [markdown]
# ---
# {{next}}
