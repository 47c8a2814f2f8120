"""How a `RunConfig` field describes itself where it is declared: ``option(default, check, needs=..., relation=...)``.

- ``check(name, value)``: the value on its own (a type, a range, one of a choice's values); returns the value kept
  (a list from YAML kept as a tuple) and raises `ConfigError` naming the field, the value and what is allowed;
- ``needs``: a `Needs`, the condition under which the field does anything ("only with lora_rank", "language models
  only"); where it does not hold, the field must keep its default, since a field with no effect is an error;
- ``relation(name, cfg)``: a check against other fields (``grad_accum`` divides ``batch_size``).

`apply` is the one loop that runs them: every ``check`` in declaration order, then every ``needs`` and ``relation``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import MISSING, Field, dataclass, field, fields

from .choices import check_choice
from .errors import ConfigError
from .validate import is_int, is_number


@dataclass(frozen=True)
class Needs:
    """When a field has an effect. ``text`` follows the default in the error (``{name}`` may name any field's value);
    ``hint`` says why."""

    holds: Callable[[object], bool]
    text: str
    hint: str = ""


def option(default, check: Callable | None = None, *, needs: Needs | None = None, relation: Callable | None = None,
           shown: str | None = None) -> Field:
    """A dataclass field with its check, what it depends on and its checks against other fields (see the module).

    Args:
        default: the field's default, written here once.
        check: ``check(name, value)``, returning the value to keep. needs: when the field has an effect.
        relation: ``relation(name, cfg)``, run after every field's own check. shown: the default as errors show it.
    """
    return field(default=default, metadata={"check": check, "needs": needs, "relation": relation, "shown": shown})


def defaults(cls, needs: Needs | None = None) -> dict:
    """The fields' defaults (those that depend on ``needs`` only, when given)."""
    return {f.name: f.default for f in fields(cls) if f.default is not MISSING
            and (needs is None or f.metadata.get("needs") is needs)}


def apply(cfg) -> None:
    """Run every field's check, then its ``needs`` and ``relation`` (see the module); values kept are set in place."""
    for f in fields(cfg):
        check = f.metadata.get("check")
        if check is not None:
            kept = check(f.name, getattr(cfg, f.name))
            object.__setattr__(cfg, f.name, kept)
    values = {f.name: getattr(cfg, f.name) for f in fields(cfg)}
    for f in fields(cfg):
        needs, value = f.metadata.get("needs"), getattr(cfg, f.name)
        if needs is not None and not needs.holds(cfg):
            if value != f.default:
                shown = f.metadata.get("shown") or repr(f.default)
                raise ConfigError(f.name, value, f"{shown} {needs.text.format(**values)}", needs.hint.format(**values))
            continue
        relation = f.metadata.get("relation")
        if relation is not None:
            relation(f.name, cfg)


# Checks on a value alone, each with the words its error uses.
def int_at_least(minimum: int, allowed: str, optional: bool = False) -> Callable:
    """An integer >= ``minimum`` (or None when ``optional``); ``allowed`` is what the error says is allowed."""
    def check(name: str, value):
        if not (optional and value is None) and (not is_int(value) or value < minimum):
            raise ConfigError(name, value, allowed)
        return value
    return check


positive_int = int_at_least(1, "a positive integer (1, 2, 3, ...)")
optional_positive_int = int_at_least(1, "None or a positive integer", optional=True)


def number_above(minimum: float, optional: bool = False, allowed: str | None = None) -> Callable:
    """A finite number > ``minimum`` (or None when ``optional``)."""
    def check(name: str, value):
        if optional and value is None:
            return value
        if not is_number(value) or not value > minimum:
            raise ConfigError(name, value, allowed or f"{'None or ' if optional else ''}a finite number > {minimum:g}")
        return value
    return check


def number_at_least(minimum: float) -> Callable:
    def check(name: str, value):
        if not is_number(value) or value < minimum:
            raise ConfigError(name, value, f"a finite number >= {minimum:g}")
        return value
    return check


def flag(name: str, value):
    if not isinstance(value, bool):
        raise ConfigError(name, value, "True or False")
    return value


def one_of(values: Iterable[str], optional: bool = False, note: str = "", what: str | None = None) -> Callable:
    """One of ``values`` (or None when ``optional``), named in the error as ``what`` (default: "one of")."""
    values = list(values)

    def check(name: str, value):
        if optional and value is None:
            return value
        return check_choice(name, value, values, what or ("None or one of" if optional else "one of"), note)
    return check


def names(allowed: str) -> Callable:
    """A non-empty string or a list of them, kept as a tuple (YAML gives a list)."""
    def check(name: str, value):
        kept = (value,) if isinstance(value, str) else value
        if not isinstance(kept, (list, tuple)) or not all(isinstance(k, str) and k for k in kept):
            raise ConfigError(name, value, allowed)
        return tuple(kept)
    return check
