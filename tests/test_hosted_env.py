"""scripts/hosted_env.py: Colab's and Kaggle's images from scripts/hosted_images.toml (the CI part itself runs them)."""

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("hosted_env", ROOT / "scripts" / "hosted_env.py")
hosted_env = importlib.util.module_from_spec(spec)
spec.loader.exec_module(hosted_env)


def test_every_image_names_its_versions_and_what_runs_there():
    import tomllib

    names = list(tomllib.loads(hosted_env.IMAGES.read_text()))
    assert {"colab", "kaggle", "floor"} <= set(names)
    for name in names:
        entry = hosted_env.image(name)
        assert entry["read"] and all(entry["preinstalled"][p] for p in hosted_env.REQUIRED)
        assert all((ROOT / path).exists() for path in [*entry["tests"], *entry["notebooks"]]), name


def test_colab_is_its_current_image_with_the_notebooks_learners_open_first():
    colab = hosted_env.image("colab")
    # googlecolab/backend-info, 2026-08-19: Python 3.13, torch 2.11, and a torchao PEFT 0.20 refuses
    assert colab["python"] == "3.13" and colab["preinstalled"]["torch"] == "2.11.0"
    assert colab["preinstalled"]["torchao"] == "0.10.0" and "bitsandbytes" in colab["absent"]
    names = {Path(nb).name for nb in colab["notebooks"]}
    assert {"00_start_here.ipynb", "08_lora.ipynb", "10_language_models.ipynb"} <= names
    kaggle = hosted_env.image("kaggle")
    assert kaggle["preinstalled"]["ipywidgets"].startswith("8.")  # Kaggle pins its own ipywidgets over Colab's


def test_notebooks_that_import_peft_install_a_torchao_it_accepts():
    from labkit import project

    assert "08_lora.ipynb" in project.NEEDS_TORCHAO and "06_quantization.ipynb" in project.NEEDS_TORCHAO
    colab = hosted_env.image("colab")["preinstalled"]
    assert project.peft_torchao_problem(colab["peft"], colab["torchao"]) is not None  # what learners met
    installed = project.torchao_requirement(colab["torch"]).split("==")[1]
    assert project.peft_torchao_problem(colab["peft"], installed) is None  # after 08's setup cell


def test_the_floor_is_the_one_pyproject_and_labkit_state():
    import tomllib

    import labkit.env

    floor = hosted_env.image("floor")["preinstalled"]["torch"]
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert f"torch>={floor.rsplit('.', 1)[0]}" in dependencies
    assert labkit.env.MIN_TORCH == tuple(int(x) for x in floor.split(".")[:2])


def test_an_unknown_image_or_python_is_named(tmp_path, monkeypatch):
    with pytest.raises(hosted_env.HostedEnvError, match=r"image='colbab' is not allowed: one of \['colab', "):
        hosted_env.image("colbab")
    (tmp_path / "images.toml").write_text('[x]\npython = "3.12"\npreinstalled = { torch = "2.11.0" }\n')
    with pytest.raises(hosted_env.HostedEnvError, match=r"\[x\] lacks \['absent', 'tests', 'notebooks', "
                                                        r"'preinstalled.torchvision', "):
        hosted_env.image("x", tmp_path / "images.toml")
    monkeypatch.setenv("PYENV_ROOT", str(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(hosted_env.HostedEnvError, match=r"python='3.99': no Python 3.99 here"):
        hosted_env.find_python("3.99")


def test_labkit_is_installed_as_the_setup_cell_installs_it():
    from labkit import project

    spec = hosted_env.setup_cell_spec()
    assert spec.startswith(f"{project.DISTRIBUTION}[") and spec.endswith(f"@ {ROOT.as_uri()}")
    assert set(spec.split("[")[1].split("]")[0].split(",")) == {e for n in project.NOTEBOOK_EXTRAS.values() for e in n}
