import subprocess
import sys

import labkit


def test_import_labkit_pulls_in_no_notebook_only_package():
    """`labkit bench` must run on a bare GPU machine without ipywidgets or Jupyter."""
    code = ("import sys, labkit; bad = [m for m in ('ipywidgets', 'IPython', 'matplotlib') if m in sys.modules];"
            "print(bad); sys.exit(1 if bad else 0)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_public_api_names():
    for name in ("RunConfig", "RunResult", "env_report", "fit", "sweep", "load_config", "load_reference",
                 "profile", "find_max_batch_size", "estimate_memory"):
        assert hasattr(labkit, name), name
