"""What labkit is and where it lives: its version, and the one place the repository URL is written
(`make notebooks` writes each notebook's badges and install cell from it, and a test checks that every
committed notebook equals its build)."""

from importlib import metadata

__version__ = "0.1.0"
REPO = "labkit-lab/labkit"
BRANCH = "main"
DISTRIBUTION = "labkit-finetune"  # the pip name; "labkit" on the package index is an unrelated project
REPO_URL = f"https://github.com/{REPO}"


# Extras a notebook needs beyond the base install (pyproject's optional-dependencies).
NOTEBOOK_EXTRAS = {"03_memory_savers.ipynb": ("memory",), "06_quantization.ipynb": ("quant",),
                   "08_lora.ipynb": ("lora", "memory"), "09_recipe.ipynb": ("memory",),
                   "10_language_models.ipynb": ("lm",), "11_your_finetune.ipynb": ("lm", "memory")}

# torchao's compiled kernels are built against one torch release, and a torchao too new for the installed torch
# fails to import (torchao 0.18 on torch 2.9: "cannot import name 'ScalingType'"), which also breaks PEFT, since
# PEFT imports torchao when it is installed. pip cannot choose by the installed torch, so the quant extra leaves
# torchao out and the notebook's setup cell installs the release built for the torch it finds. From torchao's
# compatibility table (https://github.com/pytorch/ao/issues/2919; 0.18 needs torch 2.11+, its release notes):
# (oldest torch, torchao), newest first.
TORCHAO_FOR_TORCH = (((2, 11), "0.18.0"), ((2, 10), "0.16.0"), ((2, 9, 1), "0.15.0"), ((2, 9), "0.14.1"),
                     ((2, 8), "0.13.0"), ((2, 5), "0.12.0"))
# Notebooks whose setup cell installs a torchao matched to the torch it finds: 06 quantizes with it, and 08's PEFT
# imports it when it is installed, refusing one older than 0.16 (PEFT 0.19+), as Colab preinstalls (0.10).
NEEDS_TORCHAO = ("06_quantization.ipynb", "08_lora.ipynb")
# PEFT releases and the oldest torchao each accepts (peft/import_utils.py, is_torchao_available): (peft, torchao).
PEFT_MIN_TORCHAO = (((0, 19), (0, 16)), ((0, 0), (0, 4)))


def release_of(version: str) -> tuple[int, ...]:
    """``2.9.1+cu128`` -> (2, 9, 1): the release numbers of a version string."""
    numbers = []
    for part in version.split("+")[0].split(".")[:3]:
        digits = "".join(c for c in part if c.isdigit()) if part[:1].isdigit() else ""
        if not digits:
            break
        numbers.append(int(digits))
        if not part.isdigit():  # 2.10.0a0, 2.9.0rc1: a pre-release of this number
            break
    return tuple(numbers)


def installed_torch() -> str:
    """The installed torch's version, read from its package metadata (torch itself is not imported)."""
    return metadata.version("torch")


def torchao_requirement(torch_version: str | None = None) -> str:
    """The torchao release to install beside ``torch_version``: the one built against it (`TORCHAO_FOR_TORCH`).

    Args:
        torch_version: e.g. ``2.9.1+cu128``; None: the installed torch's.

    Example:
        >>> torchao_requirement("2.9.1+cu128")
        'torchao==0.15.0'
    """
    torch_version = installed_torch() if torch_version is None else torch_version
    release = release_of(torch_version)
    for oldest, torchao in TORCHAO_FOR_TORCH:
        if release >= oldest:
            return f"torchao=={torchao}"
    raise ValueError(f"torch_version={torch_version!r} is not allowed: torch 2.5 or newer (labkit's floor)")


def peft_torchao_problem(peft_version: str, torchao_version: str | None) -> str | None:
    """Why PEFT ``peft_version`` will refuse torchao ``torchao_version`` at ``get_peft_model`` (an ImportError there),
    or None: PEFT checks an installed torchao's version when it adapts a layer, and 0.19+ wants torchao 0.16+.

    Example:
        >>> peft_torchao_problem("0.20.0", "0.10.0")
        'PEFT 0.20.0 refuses it as soon as it adapts a layer: it needs torchao 0.16 or newer'
    """
    if torchao_version is None:
        return None
    peft, torchao = release_of(peft_version), release_of(torchao_version)
    oldest = next(needed for since, needed in PEFT_MIN_TORCHAO if peft >= since)
    if torchao >= oldest:
        return None
    needed = ".".join(map(str, oldest))
    return f"PEFT {peft_version} refuses it as soon as it adapts a layer: it needs torchao {needed} or newer"


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
