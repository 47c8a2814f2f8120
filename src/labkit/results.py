"""Many runs -> one DataFrame: `sweep`, the per-run JSON cache, and reference results from real GPUs.

`cached_model` keeps the trained weights too, as ``<key>.pt`` beside the run's JSON, so that later calls get
the trained model back without training again (a pruning or quantization notebook starts from it). The weights
are written before the run's JSON, each atomically: an interrupted call leaves either both or a run that is
trained again. A model rebuilt from the cache has the trained weights, the run's checkpointing, freezing and
memory format, and is in training mode, as ``labkit.fit``'s model is. A run that `cached_fit` stored without
weights is trained again for them, and keeps the result it measured first, so that every table of a notebook
shows the same numbers for the same config. A config that prunes or quantizes for inference trains as
`trained_config` (cached once for all of them) and scores its deployed copy on top (``result.inference``); the
model returned is then the trained float model.
"""

from __future__ import annotations

import datetime
import functools
import hashlib
import io
import itertools
import json
import os
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path

import pandas as pd
import torch

from . import models
from .config import RunConfig, check_keys, field_names
from .data import cache_dir
from .env import env_report, hardware_key, is_online, profile, resolve_device
from .errors import ConfigError, DatasetUnavailableError
from .evaluation import exports, score_inference
from .kinds import prepare_model
from .messages import note
from .models import checkpoint_dir
from .project import __version__
from .result import MEMORY_CATEGORIES, RunResult
from .train import fit, run_splits

REFERENCE_DIR = Path(__file__).parent / "assets" / "reference"
METRIC_COLUMNS = (
    "precision_used", "steps", "planned_steps", "timed_steps", "step_time_s", "step_time_p10_s", "step_time_p90_s",
    "throughput",
    "train_time_s", "peak_memory_bytes", "reserved_memory_bytes", "accuracy", "flops_per_step", "achieved_flops",
    "peak_flops", "mfu", "model_size_bytes", "num_params", "num_trainable_params", "weights",
    "tokens_per_s", "real_tokens_per_s", "pad_fraction", "compile_time_s",  # language models (None otherwise)
    "test_loss", "perplexity",
)

INFERENCE_COLUMNS = ("method", "accuracy", "size_bytes", "nonzero_share")  # as inference_<name>: `RunResult.inference`


def results_dir() -> Path:
    """Where finished runs are cached: ``<data cache>/results``."""
    return cache_dir() / "results"


@functools.lru_cache(maxsize=1)
def code_fingerprint() -> str:
    """A hash of labkit's own source and shipped checkpoints: a code change invalidates cached runs."""
    package = Path(__file__).parent
    digest = hashlib.sha256(__version__.encode())
    for path in sorted(package.rglob("*.py")) + sorted((package / "assets" / "checkpoints").glob("*.json")):
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def files_fingerprint(cfg: RunConfig) -> list:
    """A learner's own model folder and data (a file, an image folder) as where they are and their files' sizes and
    times: a cached run is reused only while they are unchanged (the same name in another folder is another run)."""
    found = []
    for spec in (cfg.model, cfg.dataset):
        path = Path(str(spec)).expanduser()
        if ":" in str(spec) or not path.exists():  # a catalog name, a hub id, torchvision:NAME, hf:...
            continue
        files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
        found.append([str(path.resolve()), [(str(p.relative_to(path)) if p != path else "", p.stat().st_size,
                                             p.stat().st_mtime_ns) for p in files]])
    return found


def cache_key(cfg: RunConfig, env: dict) -> str:
    """The cache key of a run of ``cfg`` on ``env``: equal for two runs when one can reuse the other.

    A run is reusable when the config, the hardware, torch/torchvision, the profile, whether labkit may
    download (which decides the starting weights), labkit's code and a learner's own files (`files_fingerprint`)
    all match.
    """
    blob = json.dumps({"config": cfg.to_dict(), "hardware": hardware_key(env), "torchvision": env.get("torchvision"),
                       "online": is_online(), "checkpoints": str(checkpoint_dir()), "code": code_fingerprint(),
                       "files": files_fingerprint(cfg)}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


def write_json_atomic(path: Path, payload: dict) -> None:
    # Write to a temporary file in the same folder, then rename: an interrupted run never leaves
    # a half-written JSON behind, and finished runs are never lost.
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as handle:
            json.dump(payload, handle)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def cached_fit(cfg: RunConfig, refresh: bool = False, progress: bool = True, on_step=None) -> RunResult:
    """`labkit.fit` with a per-run JSON cache; ``refresh=True`` reruns and overwrites.

    Example:
        >>> res = cached_fit(cfg)   # a second call returns the stored result at once
    """
    env = env_report(cfg.device)
    path = results_dir() / f"{cache_key(cfg, env)}.json"
    if exports(cfg):  # trained as the config without its inference fields, so configs that differ there train once
        return cached_model(cfg, refresh=refresh, progress=progress, on_step=on_step)[1]
    if path.exists() and not refresh:
        try:
            result = RunResult.from_dict(json.loads(path.read_text()))
        except (ValueError, TypeError):
            path.unlink()  # unreadable (e.g. written by an older labkit): run again
        else:
            for message in result.warnings:  # a cached run tells what the live one did (once per session)
                note(message)
            return result
    result = fit(cfg, progress=progress, on_step=on_step)
    write_json_atomic(path, result.to_dict())
    return result


def trained_config(cfg: RunConfig) -> RunConfig:
    """``cfg`` without the fields that act on the trained model (pruning and quantization for inference)."""
    return cfg.replace(prune_amount=None, prune_structured=False, quantize=None, quantize_keep_float=())


def cached_model(cfg: RunConfig, refresh: bool = False, progress: bool = True,
                 on_step=None) -> tuple[torch.nn.Module, RunResult]:
    """`cached_fit` that also keeps the trained weights (``<key>.pt`` beside the run's JSON) and returns the model.

    Args:
        cfg: the run; one that prunes or quantizes trains as `trained_config` (``model`` is the float model).
        refresh: train again and overwrite the cache.
        progress: show a progress bar.
        on_step: ``on_step(done, total)`` after each optimizer step, as in `labkit.fit`.

    Returns:
        ``(model, result)``; ``result.model`` is ``model`` too.

    Example:
        >>> model, result = cached_model(labkit.config.baseline())
        >>> result.accuracy
    """
    if exports(cfg):
        model, trained = cached_model(trained_config(cfg), refresh=refresh, progress=progress, on_step=on_step)
        result = RunResult.from_dict({**trained.to_dict(), "config": cfg.to_dict(),
                                      "inference": score_inference(model, cfg, run_splits(cfg))})
        result.model = model
        return model, result
    env = env_report(cfg.device)
    key = cache_key(cfg, env)
    json_path, weights_path = results_dir() / f"{key}.json", results_dir() / f"{key}.pt"
    if json_path.exists() and weights_path.exists() and not refresh:
        try:
            result = RunResult.from_dict(json.loads(json_path.read_text()))
            state = torch.load(weights_path, map_location="cpu", weights_only=True)
        except (ValueError, TypeError, RuntimeError, EOFError):
            pass  # unreadable: train again
        else:
            split = run_splits(cfg, training=False)["train"]
            model = models.build_for_split(cfg.model, split, False, cfg.attn_implementation)[0]
            prepare_model(model, cfg)  # the run's LoRA layers (their weights are in the state), checkpointing, freezing
            model.load_state_dict(state)
            memory_format = torch.channels_last if cfg.channels_last else torch.preserve_format
            model = model.to(resolve_device(cfg.device), memory_format=memory_format).train()
            for message in result.warnings:
                note(message)
            result.model = model
            return model, result
    measured = None  # a run cached without its weights (by cached_fit) keeps the numbers it measured first
    if json_path.exists() and not refresh:
        try:
            measured = RunResult.from_dict(json.loads(json_path.read_text()))
        except (ValueError, TypeError):
            measured = None
    result = fit(cfg, progress=progress, on_step=on_step)
    weights_path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=weights_path.parent, prefix=f".{key}.", suffix=".tmp")
    os.close(fd)
    try:
        torch.save({k: v.detach().cpu() for k, v in models.unwrap(result.model).state_dict().items()}, tmp)
        os.replace(tmp, weights_path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    if measured is not None:
        measured.model = result.model
        return result.model, measured
    write_json_atomic(json_path, result.to_dict())
    return result.model, result


def to_row(result: RunResult, source: str = "live") -> dict:
    """One DataFrame row: config fields, metrics, ``mem_<category>_bytes`` and provenance."""
    row = dict(result.config)
    # a column mapping as one hashable cell ("prompt=question"), None when there is none
    row["data_columns"] = ", ".join(f"{k}={v}" for k, v in (row.get("data_columns") or {}).items()) or None
    for name in METRIC_COLUMNS:
        row[name] = getattr(result, name)
    for category in MEMORY_CATEGORIES:
        row[f"mem_{category}_bytes"] = result.memory.get(category)
    for name in INFERENCE_COLUMNS:  # the deployed (pruned, quantized) copy's figures, when the config makes one
        row[f"inference_{name}"] = (result.inference or {}).get(name)
    env = result.env
    row.update(
        device=env.get("device"), gpu=env.get("gpu"), torch=env.get("torch"), labkit=env.get("labkit"),
        profile=env.get("profile"), repeats=result.timed_steps, source=source, error=result.error,
    )
    return row


def to_frame(results: Iterable[RunResult], source: str = "live") -> pd.DataFrame:
    """A DataFrame with one row per result."""
    return pd.DataFrame([to_row(r, source) for r in results])


def sweep(cfg: RunConfig, refresh: bool = False, progress: bool = True, **axes) -> pd.DataFrame:
    """Run every combination of ``axes`` over ``cfg`` and return one row per run.

    Finished runs are cached (see `cached_fit`); a run that fails (out of memory, non-finite loss)
    becomes a row with its ``error`` instead of stopping the sweep. Invalid combinations are
    rejected before anything runs.

    Args:
        cfg: the base config.
        refresh: rerun even when a cached result exists.
        **axes: RunConfig field -> list of values.

    Example:
        >>> df = labkit.sweep(cfg, batch_size=[32, 64, 128], precision=["fp32", "bf16"])
    """
    check_keys(axes, "sweep axis")
    for name, values in axes.items():
        if isinstance(values, (str, bytes)) or not isinstance(values, Iterable) or not list(values):
            raise ConfigError(f"sweep axis {name}", values, "a non-empty list of values, e.g. [32, 64]")
    names = list(axes)
    configs = [cfg.replace(**dict(zip(names, combo, strict=True))) for combo in itertools.product(*axes.values())]
    return to_frame(run_configs(configs, refresh=refresh, progress=progress))


def run_configs(configs: Iterable[RunConfig], refresh: bool = False, progress: bool = True) -> list[RunResult]:
    """Run each config (through the cache, see `cached_fit`) and return one `RunResult` per config, in order.

    The loop behind `sweep` and the labs' sweeps (e.g. `labkit.labs.batch_size.batch_sweep`). A run that fails (out of
    memory, a non-finite loss, a torch error) becomes a result with its ``error`` set instead of
    stopping the others; a missing dataset stops everything, since every run would fail the same way.

    Example:
        >>> results = run_configs([cfg.replace(batch_size=b) for b in (32, 64)])
        >>> [r.step_time_s for r in results]
    """
    configs = list(configs)
    for run_cfg in configs:  # a device that is not there fails every run: say so before running any
        resolve_device(run_cfg.device)
    done = []
    for run_cfg in configs:
        try:
            result = cached_fit(run_cfg, refresh=refresh, progress=progress)
        except DatasetUnavailableError:
            raise  # not this run's failure: every run would fail the same way
        except Exception as exc:  # out of memory, a non-finite loss, a torch error: one failed row
            error = f"{type(exc).__name__}: {exc}"
            del exc  # drop the traceback (and the failed run's tensors) before freeing GPU memory
            _free_cuda_memory()
            result = RunResult(config=run_cfg.to_dict(), env=dict(env_report(run_cfg.device)), error=error)
        done.append(result)
    return done


def cached_record(key: str, compute: Callable[[], dict], refresh: bool = False) -> dict:
    """A small JSON-serialisable measurement stored next to the cached runs as ``<key>.json``.

    ``compute()`` runs only when there is no stored record (or ``refresh``); build ``key`` from
    `cache_key` so that a change of config, hardware or code measures again.

    Example:
        >>> cached_record(f"{cache_key(cfg, env)}-inference-64", lambda: {"latency_s": 0.01})
    """
    path = results_dir() / f"{key}.json"
    if path.exists() and not refresh:
        try:
            return json.loads(path.read_text())
        except ValueError:
            path.unlink()
    record = compute()
    write_json_atomic(path, record)
    return record


def cached_frame(name: str, cfgs: Iterable[RunConfig], compute: Callable[[], pd.DataFrame], refresh: bool = False,
                 **params) -> pd.DataFrame:
    """A measured table (latencies, accuracies of quantized models...), computed once, then read from the cache.

    It is computed once per configs, hardware, code and ``params``, then read from the cache like a training
    run (``refresh=True`` measures again).

    Example:
        >>> table = cached_frame("quant-compare", [cfg], lambda: measure_everything(cfg), methods=["fp32"])
    """
    cfgs = list(cfgs)
    keys = [cache_key(cfg, env_report(cfg.device)) for cfg in cfgs]
    blob = json.dumps({"keys": keys, "params": params}, sort_keys=True, default=str)
    key = f"{name}-{hashlib.sha256(blob.encode()).hexdigest()[:20]}"
    record = cached_record(key, lambda: {"frame": compute().to_json(orient="split", double_precision=15)},
                           refresh=refresh)
    return _frame_of(record)


def _frame_of(record: dict) -> pd.DataFrame:
    return pd.read_json(io.StringIO(record["frame"]), orient="split", dtype=False)


def read_cached_frame(path: Path) -> pd.DataFrame:
    """A table `cached_frame` stored at ``path`` (``<name>-<key>.json`` in `results_dir`), read back as it was."""
    return _frame_of(json.loads(Path(path).read_text()))


def _free_cuda_memory() -> None:
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def load_reference(pattern: str = "*", **where) -> pd.DataFrame:
    """Reference results from ``src/labkit/assets/reference/<pattern>.json``: measured or published.

    A measured file holds ``{"gpu", "date", "versions", "runs": [RunResult dicts], "rows": [...]}``: runs
    become rows shaped like `sweep`'s; ``rows`` (a frame written as records, e.g. a batch sweep with
    its extra columns) are taken as they are. Every row gets ``source = "reference: <gpu> <date>"``.
    A published file (``"provenance": "published"``, with ``citation``, ``url`` and the ``quote`` it
    rests on) holds ``rows`` only, and its rows get ``source = "published: <citation>"``.
    ``where`` filters on columns (config fields, or a part's own columns such as ``lr_setting``).

    Example:
        >>> ref = labkit.load_reference("01_mixed_precision-compare*", model="small_cnn")
    """
    frames = []
    for path in sorted(REFERENCE_DIR.glob(f"{pattern}.json")):
        payload = json.loads(path.read_text())
        if payload.get("provenance") == "published":  # a figure from a paper or official docs, never ours
            source = f"published: {payload['citation']}"
        else:
            source = f"reference: {payload.get('gpu', path.stem)} {payload.get('date', '')}".strip()
        if payload.get("runs"):
            frames.append(to_frame((RunResult.from_dict(r) for r in payload["runs"]), source=source))
        if payload.get("rows"):
            frames.append(pd.DataFrame(payload["rows"]).assign(source=source))
    frame = (pd.concat(frames, ignore_index=True) if frames
             else pd.DataFrame(columns=[*field_names(), *METRIC_COLUMNS, "source", "error"]))
    for name, value in where.items():
        if name not in frame.columns:
            if name in field_names() or frame.empty:
                return frame.iloc[0:0]  # nothing shipped for this filter yet
            raise ConfigError("load_reference filter", name,
                              f"a column of these references ({', '.join(frame.columns)})")
        frame = frame[frame[name] == value]
    return frame.reset_index(drop=True)


def published(*patterns: str) -> pd.DataFrame:
    """Published reference rows as a learner reads them: ``setup``, the figures, ``source`` (citation and link).

    One row per published row of the files that ``patterns`` match (as in `load_reference`), in file order. A
    figure a learner compares with the live run, never presented as measured here.

    Args:
        patterns: file patterns under ``src/labkit/assets/reference/``, e.g. ``"02_batch_size-warmup*"``.

    Example:
        >>> display.table(labkit.results.published("02_batch_size-warmup*"))
    """
    rows = []
    for pattern in patterns:
        # Measured files (labkit bench, the GPU suite) may match a pattern too: they are shown as measured elsewhere.
        payloads = [json.loads(path.read_text()) for path in sorted(REFERENCE_DIR.glob(f"{pattern}.json"))]
        payloads = [payload for payload in payloads if payload.get("provenance") == "published"]
        if not payloads:
            raise ConfigError("pattern", pattern,
                              "a pattern that matches a published file of src/labkit/assets/reference/")
        for payload in payloads:
            source = f"{payload['citation']}, {payload['url']}"
            rows += [{**row, "source": source} for row in payload["rows"]]
    frame = pd.DataFrame(rows)
    return frame[["setup", *[c for c in frame.columns if c not in ("setup", "source")], "source"]]


def write_reference(results: list[RunResult], path: Path, extras: dict | None = None, rows=None,
                    env: dict | None = None) -> Path:
    """Write results as a reference file labelled with GPU, date and versions (see `load_reference`).

    Args:
        results: RunResults, stored whole.
        path: the file to write.
        extras: anything else worth keeping (JSON-serialisable).
        rows: a DataFrame stored as records (None: none).
        env: the machine's report (default: the first result's, else this machine's).
    """
    env = env or (results[0].env if results else env_report())
    payload = {
        "gpu": env.get("gpu") or f"CPU ({env.get('cpu')})",
        "date": datetime.date.today().isoformat(),
        "profile": env.get("profile") or profile().name,  # the profile the runs used, not the caller's
        "versions": {k: env.get(k) for k in ("torch", "torchvision", "labkit", "python")},
        "runs": [r.to_dict() for r in results],
        "rows": [] if rows is None else json.loads(rows.to_json(orient="records")),
        "extras": extras or {},
    }
    write_json_atomic(Path(path), payload)
    return Path(path)
