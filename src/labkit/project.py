"""What labkit is and where it lives: its version, and the one place the repository URL is written
(`make notebooks` writes each notebook's badges and install cell from it, and a test checks that every
committed notebook equals its build)."""

__version__ = "0.1.0"
REPO = "labkit-lab/labkit"
BRANCH = "main"
DISTRIBUTION = "labkit-finetune"  # the pip name; "labkit" on the package index is an unrelated project
REPO_URL = f"https://github.com/{REPO}"


# Extras a notebook needs beyond the base install (pyproject's optional-dependencies).
NOTEBOOK_EXTRAS = {"03_memory_savers.ipynb": ("memory",), "06_quantization.ipynb": ("quant",),
                   "08_lora.ipynb": ("lora", "memory"), "09_recipe.ipynb": ("memory",)}


def install_spec(notebook: str | None = None) -> str:
    """What the Colab/Kaggle setup cell of ``notebook`` installs, with the extras it needs.

    pip keeps the preinstalled torch: labkit's torch requirement is a loose lower bound.
    """
    extras = NOTEBOOK_EXTRAS.get(notebook, ())
    name = f"{DISTRIBUTION}[{','.join(extras)}]" if extras else DISTRIBUTION
    return f"{name} @ git+{REPO_URL}@{BRANCH}"


def notebook_url(notebook: str) -> str:
    return f"{REPO_URL}/blob/{BRANCH}/notebooks/{notebook}"


def badges(notebook: str) -> str:
    """Markdown for the "Open in Colab" and "Open in Kaggle" badges of ``notebook`` (a file name)."""
    colab = f"https://colab.research.google.com/github/{REPO}/blob/{BRANCH}/notebooks/{notebook}"
    kaggle = f"https://kaggle.com/kernels/welcome?src={notebook_url(notebook)}"
    return (f"[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]({colab}) "
            f"[![Open In Kaggle](https://kaggle.com/static/images/open-in-kaggle.svg)]({kaggle})")
