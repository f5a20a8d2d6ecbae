"""Loading: YAML → dataclasses with every key and type checked, dotted overrides."""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar, Union, get_args, get_origin

import yaml

from components.config.checks import ConfigError
from components.errors import clip

# Values a YAML document may hold beyond those written out in it, once its aliases (``*name``)
# are expanded: a config shares a few blocks this way; nine levels of nine aliases ("billion
# laughs", 302 bytes) would be 387 million values.
ALIAS_BUDGET = 10_000

T = TypeVar("T")


# ---------------------------------------------------------------------------------------------
# Loading.


def _type_name(tp: Any) -> str:
    if get_origin(tp) is Literal:
        return " | ".join(repr(a) for a in get_args(tp))
    if get_origin(tp) in (Union, types.UnionType):
        return " | ".join(_type_name(a) for a in get_args(tp))
    if isinstance(tp, type):
        return tp.__name__
    return str(tp).replace("typing.", "")


def _convert(key: str, value: Any, tp: Any, tagged: Mapping[str, Mapping[str, type]]) -> Any:
    """Check ``value`` against the annotation ``tp`` and convert nested mappings."""
    origin = get_origin(tp)
    if tp is Any:
        return value
    if origin is Literal:
        if value not in get_args(tp):
            allowed = ", ".join(repr(a) for a in get_args(tp))
            raise ConfigError(f"{key}={clip(value)} is not allowed: choose one of {allowed}")
        return value
    if origin in (Union, types.UnionType):
        args = get_args(tp)
        if value is None and type(None) in args:
            return None
        leaf = key.rsplit(".", 1)[-1]
        if leaf in tagged:
            return _from_tagged(key, value, tagged[leaf])
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _convert(key, value, arg, tagged)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(f"{key}={clip(value)} matches none of {_type_name(tp)}: "
                          f"{'; '.join(errors)}")
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        if not isinstance(value, Mapping):
            raise ConfigError(
                f"{key} must be a mapping of {tp.__name__} fields, got {clip(value)}")
        return _build(tp, value, key)
    if origin in (list, tuple, Sequence):
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{key}={clip(value)} must be a list")
        (item_tp, *_) = get_args(tp) or (Any,)
        items = [_convert(f"{key}[{i}]", v, item_tp, tagged) for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin is dict:
        if not isinstance(value, Mapping):
            raise ConfigError(f"{key}={clip(value)} must be a mapping")
        return dict(value)
    if tp is float:
        # YAML reads `1e-3` as a string (YAML 1.1); accept it, and ints, as floats.
        if isinstance(value, bool):
            raise ConfigError(f"{key}={clip(value)} must be a number, not a boolean")
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                raise ConfigError(f"{key}={clip(value)} must be a number") from None
        if isinstance(value, int | float):
            return float(value)
        raise ConfigError(f"{key}={clip(value)} must be a number")
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{key}={clip(value)} must be an integer")
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{key}={clip(value)} must be true or false")
        return value
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{key}={clip(value)} must be a string")
        return value
    if isinstance(tp, type) and not isinstance(value, tp):
        raise ConfigError(f"{key}={clip(value)} must be of type {_type_name(tp)}")
    return value


def _from_tagged(key: str, value: Any, choices: Mapping[str, type]) -> Any:
    if not isinstance(value, Mapping):
        raise ConfigError(f"{key} must be a mapping with a 'name', got {clip(value)}")
    name = value.get("name")
    if not isinstance(name, str) or name not in choices:
        raise ConfigError(
            f"{key}.name={clip(name)} is not allowed: choose one of {', '.join(sorted(choices))}"
        )
    return _build(choices[name], value, key)


def _key(key: object) -> str:
    """A key as written, unless it is long (then :func:`clip`'s cut repr)."""
    text = str(key)
    return text if len(text) <= 80 else clip(text, 80)


def _build(cls: type[T], data: Mapping[str, Any], prefix: str) -> T:
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}  # type: ignore[arg-type]
    tagged = getattr(cls, "tagged_unions", {})
    unknown = [k for k in data if k not in fields]
    if unknown:
        where = f"{prefix}." if prefix else ""
        what = f"'{data['name']}'" if "name" in fields and "name" in data else cls.__name__
        raise ConfigError(
            f"unknown key {where}{_key(unknown[0])} for {what}; allowed keys: {', '.join(fields)}"
        )
    kwargs = {}
    for name, value in data.items():
        key = f"{prefix}.{name}" if prefix else name
        kwargs[name] = _convert(key, value, hints[name], tagged)
    try:
        return cls(**kwargs)
    except TypeError as e:  # a required field is missing
        raise ConfigError(f"{prefix or cls.__name__}: {e}") from None


def from_dict(cls: type[T], data: Mapping[str, Any] | None) -> T:
    """Build the dataclass ``cls`` from a plain mapping, validating every key."""
    return _build(cls, data or {}, "")


def to_dict(cfg: Any) -> dict[str, Any]:
    """The inverse of :func:`from_dict`: plain data, safe for ``yaml.safe_dump``."""
    return dataclasses.asdict(cfg)


# Sections whose ``name`` picks a dataclass (see ``tagged_unions``).
TAGGED_SECTIONS = frozenset({"loss"})


def apply_overrides(data: Mapping[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """Return a copy of ``data`` with ``a.b.c=value`` overrides applied.

    Values are parsed with ``yaml.safe_load`` (``0.2`` is a float, ``true`` a bool, ``[1,2]`` a
    list, ``{a: 1}`` a mapping; ``json:`` stays text). Switching a tagged section's ``name``
    (``loss.name=sincere``) keeps only the keys given after it for that section, so the old
    loss's parameters do not leak into the new one.
    """
    out: dict[str, Any] = _deep_copy(data)
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {clip(item)} must look like key.path=value")
        path, raw = item.split("=", 1)
        keys = path.strip().split(".")
        if not all(keys):
            raise ConfigError(f"override {clip(item)} has an empty key in {clip(path)}")
        try:
            value = safe_load(raw, f"override {clip(item)}") if raw.strip() else ""
        except yaml.YAMLError as e:
            where = getattr(e, "problem_mark", None)
            at = f" at column {where.column + 1}" if where is not None else ""
            raise ConfigError(
                f"override {clip(item)}: the value {clip(raw)} is not valid YAML{at} "
                f"({getattr(e, 'problem', None) or e}); quote list entries that contain "
                "brackets or commas, e.g. overrides=['data.augment.mean=[0.5,0.5,0.5]']"
            ) from None
        if isinstance(value, dict) and not raw.strip().startswith("{"):
            # ``json:`` / ``a: b`` typed on a command line is text, not a block mapping
            # (``{json: null}``); a mapping is written in flow style, ``{a: 1}``
            value = raw.strip()
        _set(out, keys, value, f"override {clip(item)}")
    return out


def set_values(data: Mapping[str, Any], values: Mapping[str, Any]) -> dict[str, Any]:
    """Return a copy of ``data`` with each dotted path of ``values`` set to its value, in
    order: the typed counterpart of :func:`apply_overrides` (values are Python values, never
    text to parse; a sweep trial's sampled parameters go in this way). Switching a tagged
    section's ``name`` resets that section as it does there."""
    out: dict[str, Any] = _deep_copy(data)
    for path, value in values.items():
        keys = path.split(".")
        if not all(keys):
            raise ConfigError(f"config path {path!r} has an empty key")
        _set(out, keys, value, f"config path {path!r}")
    return out


def _set(out: dict[str, Any], keys: Sequence[str], value: Any, what: str) -> None:
    """Set ``out[k0][k1]...`` = ``value`` in place (sections made as needed)."""
    node = out
    for k in keys[:-1]:
        child = node.get(k)
        if child is None:
            child = node[k] = {}
        elif not isinstance(child, dict):
            raise ConfigError(f"{what}: {k!r} is a value, not a section")
        node = child
    # Only a tagged section (``loss``) switches kind by name; ``name=`` of a run or
    # ``optim.name=`` keep their siblings.
    if (keys[-1] == "name" and len(keys) > 1 and keys[-2] in TAGGED_SECTIONS
            and node.get("name") not in (None, value)):
        node.clear()
    node[keys[-1]] = value


def flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested config dict as dotted keys: ``{"loss": {"tau": 0.1}}`` → ``{"loss.tau": 0.1}``
    (the keys overrides use)."""
    out: dict[str, Any] = {}
    for k, v in data.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def _deep_copy(data: Mapping[str, Any]) -> dict[str, Any]:
    return {k: _deep_copy(v) if isinstance(v, Mapping) else v for k, v in data.items()}


def _expanded(node: yaml.Node, memo: dict[int, int], limit: int) -> int:
    """How many nodes ``node`` stands for once every alias is expanded (shared nodes counted
    each time they are used), stopping above ``limit``."""
    got = memo.get(id(node))
    if got is not None:
        return got
    total = 1
    if isinstance(node, yaml.SequenceNode):
        children: list[yaml.Node] = list(node.value)
    elif isinstance(node, yaml.MappingNode):
        children = [n for pair in node.value for n in pair]
    else:
        children = []
    for child in children:
        total += _expanded(child, memo, limit)
        if total > limit:
            break
    memo[id(node)] = total
    return total


def safe_load(text: str, where: str) -> Any:
    """``yaml.safe_load`` (never executes tags) that refuses a document whose aliases expand
    to more than :data:`ALIAS_BUDGET` values beyond those written out.

    Raises:
        ConfigError: too many values once expanded (naming ``where``); ``yaml.YAMLError`` as
            ``safe_load`` raises it.
    """
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        memo: dict[int, int] = {}
        written = len({id(n) for n in _nodes(node)})
        if _expanded(node, memo, written + ALIAS_BUDGET) > written + ALIAS_BUDGET:
            raise ConfigError(
                f"{where}: its aliases (*name) expand to more than {ALIAS_BUDGET} values beyond "
                f"the {written} written out; a config needs far fewer: write the values out, "
                "or check that it is the file you meant")
        return loader.construct_document(node)
    finally:
        loader.dispose()


def _nodes(root: yaml.Node) -> list[yaml.Node]:
    """Every distinct node under ``root`` (each shared one once)."""
    seen: set[int] = set()
    out: list[yaml.Node] = []
    stack = [root]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        out.append(node)
        if isinstance(node, yaml.SequenceNode):
            stack += node.value
        elif isinstance(node, yaml.MappingNode):
            stack += [n for pair in node.value for n in pair]
    return out


def load_yaml(path: str | Path) -> dict[str, Any]:
    """Read a YAML mapping with :func:`safe_load` (never executes tags; a bounded alias
    expansion)."""
    try:
        data = safe_load(Path(path).read_text(encoding="utf-8"), str(path))
    except OSError as e:
        raise ConfigError(f"cannot read {path}: {e}") from None
    except UnicodeDecodeError as e:  # before yaml sees it: a binary or mis-encoded file
        line = Path(path).read_bytes()[: e.start].count(b"\n") + 1
        raise ConfigError(f"{path} is not UTF-8 text (byte 0x{e.object[e.start]:02x} on line "
                          f"{line}): save it as UTF-8, or check that it is the config you "
                          "meant") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{path} is not valid YAML: {e}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping, got {type(data).__name__}")
    return data


def load_config(path: str | Path, cls: type[T], overrides: Sequence[str] = ()) -> T:
    """Load ``path`` as ``cls`` after applying dotted ``overrides``."""
    data = load_yaml(path)  # its errors name the file already
    try:
        return from_dict(cls, apply_overrides(data, overrides))
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None
