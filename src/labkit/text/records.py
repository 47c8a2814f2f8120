"""A learner's own text data: records read from a file, a Hugging Face dataset or objects, and their shape.

- `read_records`: a local ``.jsonl``, ``.json``, ``.csv`` or ``.parquet`` file (JSON read here, so that an invalid
  line is named by its number; CSV and Parquet by Hugging Face ``datasets``), a ``hf:ORG/NAME[/CONFIG][@SPLIT]`` id
  (online), a ``datasets.Dataset``, a list of strings or of dicts;
- `detect_shape`: which of `SHAPES` the columns are (after a ``columns`` mapping), or an error listing the columns
  found and the shapes accepted;
- `to_examples`: each record as an `Example`: text segments with whether the loss is on them, or chat messages.

The shapes, as TRL's ``SFTTrainer`` and the Alpaca and ShareGPT datasets write them: ``text``; ``prompt`` +
``completion``; ``messages`` (``role`` and ``content``); Alpaca (``instruction``, optional ``input``, ``output``);
ShareGPT (``conversations`` of ``from`` and ``value``).
"""

from __future__ import annotations

import importlib
import json
from dataclasses import dataclass
from pathlib import Path

from ..errors import ConfigError, DatasetUnavailableError

SHAPES = ("text", "prompt_completion", "messages", "alpaca", "sharegpt")
FILE_SUFFIXES = (".jsonl", ".json", ".csv", ".parquet")
HF_PREFIX = "hf:"
# the loss on: ``completion`` (what follows the prompt), ``assistant`` (the assistant's turns), ``all`` (every token)
LOSS_ON = ("completion", "assistant", "all")
DEFAULT_LOSS_ON = {"text": "all", "prompt_completion": "completion", "alpaca": "completion", "messages": "assistant",
                   "sharegpt": "assistant"}
_COLUMNS = {"messages": ("messages",), "sharegpt": ("conversations",), "prompt_completion": ("prompt", "completion"),
            "alpaca": ("instruction", "output"), "text": ("text",)}  # detected in this order
_SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "system": "system",
                   "chatgpt": "assistant", "bing": "assistant", "bard": "assistant"}
ALPACA_PROMPT = "### Instruction:\n{instruction}\n\n{input}### Response:\n"  # {input}: "### Input:\n...\n\n" or ""


@dataclass(frozen=True)
class Example:
    """One record: ``segments`` (text pieces, each with whether the loss is on it) or ``messages`` (chat turns)."""

    segments: tuple[tuple[str, bool], ...] = ()
    messages: tuple[dict, ...] = ()


def is_data_file(spec) -> bool:
    """Whether ``spec`` names a local data file by its suffix (it need not exist yet)."""
    return isinstance(spec, str) and Path(spec).suffix.lower() in FILE_SUFFIXES


def is_hf_dataset(spec) -> bool:
    return isinstance(spec, str) and spec.startswith(HF_PREFIX)


def parse_hf(spec: str) -> tuple[str, str | None, str | None]:
    """``hf:ORG/NAME[/CONFIG][@SPLIT]`` -> (repo, config, split).

    Example:
        >>> parse_hf("hf:tatsu-lab/alpaca@train")
        ('tatsu-lab/alpaca', None, 'train')
    """
    body, _, split = spec[len(HF_PREFIX):].partition("@")
    parts = body.split("/")
    if len(parts) not in (2, 3) or not all(parts) or (split == "" and "@" in spec):
        raise ConfigError("dataset", spec, "hf:ORG/NAME, hf:ORG/NAME/CONFIG or either with @SPLIT (e.g. "
                          "'hf:tatsu-lab/alpaca@train')")
    return "/".join(parts[:2]), parts[2] if len(parts) == 3 else None, split or None


def _datasets():
    try:
        return importlib.import_module("datasets")
    except ImportError as exc:
        raise ConfigError("dataset", "a data file", "Hugging Face `datasets` installed (`pip install datasets`; "
                          "Colab and Kaggle have it)", str(exc)) from exc


def _read_text(path: Path) -> str:
    if not path.is_file():
        raise ConfigError("dataset", str(path), f"an existing {'/'.join(FILE_SUFFIXES)} file",
                          "no such file" if not path.exists() else "it is a folder")
    raw = path.read_bytes()
    if not raw.strip():
        raise ConfigError("dataset", str(path), "a file with at least one record", "this one is empty")
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw[:exc.start].count(b"\n") + 1
        raise ConfigError("dataset", str(path), "UTF-8 text", f"byte {exc.start} (line {line}) is not UTF-8: "
                          "save the file as UTF-8") from None


def _read_json(path: Path) -> tuple[list, list[str]]:
    """The records of a JSON or JSON Lines file and where each is (its line)."""
    content = _read_text(path)
    if path.suffix.lower() == ".json":
        try:
            loaded = json.loads(content)
        except json.JSONDecodeError as exc:
            raise ConfigError("dataset", str(path), "valid JSON: a list of records", f"line {exc.lineno}: {exc.msg}") \
                from None
        loaded = loaded if isinstance(loaded, list) else [loaded]
        return loaded, [f"{path.name} record {i + 1}" for i in range(len(loaded))]
    records, where = [], []
    for number, line in enumerate(content.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as exc:
            raise ConfigError("dataset", f"{path}:{number}", "one JSON object per line (JSON Lines)",
                              f"line {number} is not valid JSON ({exc.msg}): {line[:60]!r}") from None
        where.append(f"{path.name} line {number}")
    return records, where


def read_records(spec, online: bool = True) -> tuple[list, list[str], str]:
    """The records of ``spec`` (see the module), where each one is (for errors) and where they came from.

    Args:
        spec: a file path, a ``hf:`` id, a ``datasets.Dataset``, a torch ``Dataset`` or a list, of strings (a
            ``text`` record each) or of dicts.
        online: whether a ``hf:`` id may be downloaded.
    """
    if isinstance(spec, (list, tuple)):
        records = [{"text": r} if isinstance(r, str) else r for r in spec]
        return records, [f"record {i + 1}" for i in range(len(records))], f"{len(records)} records passed in"
    if hasattr(spec, "column_names") and hasattr(spec, "to_list"):  # a datasets.Dataset
        records = spec.to_list()
        return records, [f"row {i}" for i in range(len(records))], "a datasets.Dataset passed in"
    if isinstance(spec, dict):
        raise ConfigError("data", "a dict", "a list of records (dicts), a list of strings, a datasets.Dataset or a "
                          "torch Dataset", "wrap a single record in a list")
    if hasattr(spec, "__getitem__") and hasattr(spec, "__len__") and not isinstance(spec, str):  # a torch Dataset
        records = [spec[i] for i in range(len(spec))]
        records = [{"text": r} if isinstance(r, str) else r for r in records]
        return records, [f"item {i}" for i in range(len(records))], f"a {type(spec).__name__} passed in"
    if is_hf_dataset(spec):
        repo, config, split = parse_hf(spec)
        if not online:
            raise DatasetUnavailableError(f"{spec} is a Hugging Face dataset and this machine is offline "
                                          "($LABKIT_OFFLINE or no network): download it on a machine that is "
                                          "online and save it as a JSONL file, then pass its path")
        records = _datasets().load_dataset(repo, config, split=split or "train").to_list()
        return records, [f"{repo} row {i}" for i in range(len(records))], f"{spec} ({split or 'train'} split)"
    path = Path(str(spec)).expanduser()
    if path.suffix.lower() in (".jsonl", ".json"):
        records, where = _read_json(path)
        return records, where, str(path)
    if path.suffix.lower() == ".csv":
        _read_text(path)  # a missing, empty or non-UTF-8 file named as such
    elif not path.is_file():
        raise ConfigError("dataset", str(path), f"an existing {'/'.join(FILE_SUFFIXES)} file", "no such file")
    records = _datasets().load_dataset(path.suffix.lower().lstrip("."), data_files=str(path), split="train").to_list()
    first = 2 if path.suffix.lower() == ".csv" else 0  # a CSV's first line is its header; Parquet counts rows from 0
    return records, [f"{path.name} {'line' if first else 'row'} {i + first}" for i in range(len(records))], str(path)


def detect_shape(records: list, columns: dict | None = None, source: str = "the data") -> tuple[str, list]:
    """The records' shape (one of `SHAPES`) and the records with ``columns`` renamed (``{shape's name: theirs}``)."""
    if not records:
        raise ConfigError("dataset", source, "at least one record", "it has none")
    mapping = {theirs: ours for ours, theirs in (columns or {}).items()}
    renamed = [{mapping.get(k, k): v for k, v in r.items()} if isinstance(r, dict) else r for r in records]
    first = renamed[0]
    if not isinstance(first, dict):
        raise ConfigError("dataset", source, "records that are JSON objects (or a list of strings)",
                          f"record 1 is a {type(first).__name__}")
    for shape, needed in _COLUMNS.items():
        if all(name in first for name in needed):
            return shape, renamed
    raise ConfigError("dataset", source, f"records of one of the shapes {list(SHAPES)}: columns "
                      f"{[list(c) for c in _COLUMNS.values()]}", f"the columns found are {sorted(first)}; map yours "
                      "with data_columns, e.g. {'prompt': 'question', 'completion': 'answer'}")


def _field(record: dict, name: str, where: str, optional: bool = False) -> str:
    value = record.get(name)
    if value is None and optional:
        return ""
    if not isinstance(value, str):
        shown = "missing" if name not in record else f"{type(value).__name__} {value!r:.40}"
        raise ConfigError(f"{where} field {name!r}", shown, "text (a string)")
    return value


def _turns(record: dict, shape: str, where: str) -> tuple[dict, ...]:
    raw = record.get("messages" if shape == "messages" else "conversations")
    if not isinstance(raw, list) or not raw:
        raise ConfigError(f"{where} field {'messages' if shape == 'messages' else 'conversations'!r}",
                          f"{raw!r:.40}", "a non-empty list of turns")
    turns = []
    for index, turn in enumerate(raw):
        at = f"{where} turn {index + 1}"
        if not isinstance(turn, dict):
            raise ConfigError(at, f"{turn!r:.40}", "an object with role and content (from and value in ShareGPT)")
        if shape == "messages":
            role, content = _field(turn, "role", at), _field(turn, "content", at)
        else:
            speaker = _field(turn, "from", at)
            if speaker not in _SHAREGPT_ROLES:
                raise ConfigError(f"{at} field 'from'", speaker, f"one of {sorted(_SHAREGPT_ROLES)}")
            role, content = _SHAREGPT_ROLES[speaker], _field(turn, "value", at)
        turns.append({"role": role, "content": content})
    return tuple(turns)


def to_example(record: dict, shape: str, where: str) -> Example:
    """One record as an `Example` (``where`` names it in errors: the file and its line or record number)."""
    if not isinstance(record, dict):
        raise ConfigError(where, f"{record!r:.40}", "a JSON object with the first record's fields")
    if shape == "text":
        return Example(segments=((_field(record, "text", where), True),))
    if shape == "prompt_completion":
        return Example(segments=((_field(record, "prompt", where), False), (_field(record, "completion", where), True)))
    if shape == "alpaca":
        extra = _field(record, "input", where, optional=True)
        prompt = ALPACA_PROMPT.format(instruction=_field(record, "instruction", where),
                                      input=f"### Input:\n{extra}\n\n" if extra else "")
        return Example(segments=((prompt, False), (_field(record, "output", where), True)))
    return Example(messages=_turns(record, shape, where))


def check_loss_on(loss_on: str | None, shape: str) -> str:
    """``loss_on`` for records of ``shape`` (None: the shape's default, `DEFAULT_LOSS_ON`), or `ConfigError`."""
    if loss_on is None:
        return DEFAULT_LOSS_ON[shape]
    allowed = {"text": ("all",), "prompt_completion": ("completion", "all"), "alpaca": ("completion", "all"),
               "messages": ("assistant", "all"), "sharegpt": ("assistant", "all")}[shape]
    if loss_on not in allowed:
        raise ConfigError("loss_on", loss_on, f"None or one of {list(allowed)} for {shape} records")
    return loss_on
