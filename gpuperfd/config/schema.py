"""Declarative, strict validation for the configuration, in the subset of pydantic's API it uses.

Why not pydantic: the daemon's resident memory is a budget (docs/benchmarks.md), and pydantic with
the config's compiled schemas cost about 10 MB of it, a sixth of the whole daemon, to validate one
small YAML file once. The configuration needs only this much: typed fields with defaults, bounds,
``Literal`` choices, optional values, lists, dicts and nested sections, unknown keys rejected,
per-field and whole-model validators, and errors that name the dotted field. The names and
behaviour follow pydantic v2 (``BaseModel``, ``Field``, ``field_validator``, ``model_validator``,
``model_validate``, ``model_dump``, ``model_copy``, ``ValidationError.errors()``) so that the
models in :mod:`gpuperfd.config` read exactly as before and its error messages stay the same.

Coercion is pydantic's lax mode for what a YAML file or a command-line flag can give: integers from
whole floats and numeric strings, floats from integers and numeric strings, booleans from
true/false/yes/no/on/off/1/0, paths from strings. Booleans are never numbers.
"""

from __future__ import annotations

import copy
import math
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, Union

__all__ = [
    "BaseModel",
    "ConfigDict",
    "Field",
    "FieldInfo",
    "OneOf",
    "ValidationError",
    "field_validator",
    "model_validator",
    "field_problem",
]

_MISSING: Any = object()
_TRUE = {"true", "yes", "on", "1", "t", "y"}
_FALSE = {"false", "no", "off", "0", "f", "n"}


def ConfigDict(**settings: Any) -> dict[str, Any]:  # noqa: N802 - pydantic's spelling
    """Accepted for compatibility; every model here is strict (unknown keys rejected) and frozen."""
    return settings


class Field:
    """Bounds on a value, used inside ``Annotated[T, Field(...)]``."""

    def __init__(self, *, ge: float | None = None, gt: float | None = None, le: float | None = None,
                 lt: float | None = None, max_length: int | None = None, min_length: int | None = None) -> None:
        self.ge, self.gt, self.le, self.lt = ge, gt, le, lt
        self.max_length, self.min_length = max_length, min_length

    def check(self, value: Any) -> str | None:
        """The pydantic-style message for the first bound ``value`` breaks, or None."""
        if isinstance(value, (int, float)):
            for bound, ok, words in (
                (self.ge, lambda b: value >= b, "greater than or equal to"),
                (self.gt, lambda b: value > b, "greater than"),
                (self.le, lambda b: value <= b, "less than or equal to"),
                (self.lt, lambda b: value < b, "less than"),
            ):
                if bound is not None and not ok(bound):
                    return f"Input should be {words} {bound}"
        if isinstance(value, (str, list, dict)):
            noun = "String" if isinstance(value, str) else type(value).__name__.capitalize()
            unit = "characters" if isinstance(value, str) else "items"
            if self.max_length is not None and len(value) > self.max_length:
                return f"{noun} should have at most {self.max_length} {unit}"
            if self.min_length is not None and len(value) < self.min_length:
                return f"{noun} should have at least {self.min_length} {unit}"
        return None


class ValidationError(ValueError):
    """Every problem found in one validation, each with its location (a tuple of keys and indices)."""

    def __init__(self, title: str, problems: list[dict[str, Any]]) -> None:
        self.title = title
        self._problems = problems
        super().__init__(self._summary())

    def _summary(self) -> str:
        lines = [f"{len(self._problems)} validation error(s) for {self.title}"]
        for item in self._problems:
            lines.append(f"{'.'.join(map(str, item['loc'])) or '(top level)'}: {item['msg']}")
        return "\n".join(lines)

    def errors(self) -> list[dict[str, Any]]:
        return list(self._problems)

    def error_count(self) -> int:
        return len(self._problems)


class _Problems(Exception):
    """Raised inside validation to carry problems up to the model that reports them."""

    def __init__(self, problems: list[dict[str, Any]]) -> None:
        self.problems = problems


def _problem(loc: tuple, msg: str, kind: str, value: Any) -> _Problems:
    return _Problems([{"loc": loc, "msg": msg, "type": kind, "input": value}])


def field_problem(loc: tuple, message: str, value: Any) -> Exception:
    """For a model validator that checks fields across sections (a schedule's interval against the
    probe's own time): raise this to report ``message`` at ``loc`` (a tuple of keys and indices from
    the model validated), as a field validator's error would be, not at the top level."""
    return _problem(loc, f"Value error, {message}", "value_error", value)


class _Validator:
    def __init__(self, func: Any, fields: tuple[str, ...] = ()) -> None:
        self.func, self.fields = func, fields


class _FieldValidator(_Validator):
    pass


class _ModelValidator(_Validator):
    pass


def field_validator(*fields: str) -> Callable[[Any], _FieldValidator]:
    """Mark a classmethod ``(cls, value) -> value`` that checks the named fields after their type."""
    return lambda func: _FieldValidator(func, fields)


def model_validator(*, mode: Literal["after"]) -> Callable[[Any], _ModelValidator]:
    """Mark a method ``(self) -> self`` that checks the whole model once its fields are valid."""
    if mode != "after":
        raise NotImplementedError("only mode='after' model validators are supported")
    return lambda func: _ModelValidator(func)


class OneOf:
    """The choices of an ``Annotated[Any, OneOf(source)]`` value, read when it is checked: names another
    package owns (the configuration is a leaf, so they are handed in), checked as a ``Literal``'s are;
    ``source`` returning None leaves the value unchecked."""

    def __init__(self, source: Callable[[], tuple[str, ...] | None]) -> None:
        self.source = source


class FieldInfo:
    """What :attr:`BaseModel.model_fields` says about one field."""

    def __init__(self, annotation: Any, default: Any) -> None:
        self.annotation, self.default = annotation, default

    def is_required(self) -> bool:
        return self.default is _MISSING


# --- values ------------------------------------------------------------------------------


def _describe_literal(choices: tuple[Any, ...]) -> str:
    shown = [repr(c) for c in choices]
    return shown[0] if len(shown) == 1 else ", ".join(shown[:-1]) + " or " + shown[-1]


def _coerce_int(value: Any, loc: tuple) -> int:
    if isinstance(value, bool):
        raise _problem(loc, "Input should be a valid integer", "int_type", value)
    if isinstance(value, int):
        return value
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            pass
    raise _problem(loc, "Input should be a valid integer", "int_type", value)


def _coerce_float(value: Any, loc: tuple) -> float:
    if isinstance(value, bool):
        raise _problem(loc, "Input should be a valid number", "float_type", value)
    if isinstance(value, (int, float)):
        result = float(value)
    elif isinstance(value, str):
        try:
            result = float(value.strip())
        except ValueError:
            raise _problem(loc, "Input should be a valid number", "float_type", value) from None
    else:
        raise _problem(loc, "Input should be a valid number", "float_type", value)
    if math.isnan(result):
        raise _problem(loc, "Input should be a finite number", "finite_number", value)
    return result


def _coerce_bool(value: Any, loc: tuple) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
        return value.strip().lower() in _TRUE
    raise _problem(loc, "Input should be a valid boolean", "bool_type", value)


def _validate(tp: Any, value: Any, loc: tuple) -> Any:
    """``value`` checked and coerced to ``tp``; raises _Problems naming ``loc``."""
    origin = typing.get_origin(tp)
    if origin is typing.Annotated:
        base, *extras = typing.get_args(tp)
        result = _validate(base, value, loc)
        for extra in extras:
            if isinstance(extra, Field):
                message = extra.check(result)
                if message:
                    raise _problem(loc, message, "constraint", value)
            elif isinstance(extra, OneOf) and (choices := extra.source()) is not None and result not in choices:
                raise _problem(loc, f"Input should be {_describe_literal(choices)}", "literal_error", value)
        return result
    if origin in (Union, types.UnionType):
        members = typing.get_args(tp)
        if value is None and type(None) in members:
            return None
        first: _Problems | None = None
        for member in members:
            if member is type(None):
                continue
            try:
                return _validate(member, value, loc)
            except _Problems as exc:
                first = first or exc
        raise first or _problem(loc, "Input should be None", "none_required", value)
    if origin is Literal:
        choices = typing.get_args(tp)
        if value in choices and not (isinstance(value, bool) and True not in choices and False not in choices):
            return value
        raise _problem(loc, f"Input should be {_describe_literal(choices)}", "literal_error", value)
    if origin is list:
        if not isinstance(value, (list, tuple)):
            raise _problem(loc, "Input should be a valid list", "list_type", value)
        (item_type,) = typing.get_args(tp) or (Any,)
        return _collect([(lambda i=i, v=v: _validate(item_type, v, loc + (i,))) for i, v in enumerate(value)])
    if origin is dict:
        if not isinstance(value, dict):
            raise _problem(loc, "Input should be a valid dictionary", "dict_type", value)
        key_type, value_type = typing.get_args(tp) or (Any, Any)
        pairs = _collect([
            (lambda k=k, v=v: (_validate(key_type, k, loc + (k,)), _validate(value_type, v, loc + (k,))))
            for k, v in value.items()
        ])
        return dict(pairs)
    if tp is Any:
        return value
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        if isinstance(value, tp):
            return value
        if not isinstance(value, dict):
            raise _problem(loc, f"Input should be a valid dictionary or instance of {tp.__name__}", "model_type", value)
        return tp._validate_mapping(value, loc)
    if tp is bool:
        return _coerce_bool(value, loc)
    if tp is int:
        return _coerce_int(value, loc)
    if tp is float:
        return _coerce_float(value, loc)
    if tp is str:
        if isinstance(value, str):
            return value
        raise _problem(loc, "Input should be a valid string", "string_type", value)
    if tp is Path:
        if isinstance(value, (str, Path)) and str(value):
            return Path(value)
        raise _problem(loc, "Input is not a valid path", "path_type", value)
    raise TypeError(f"schema: unsupported field type {tp!r}")  # a programming error, not bad input


def _collect(thunks: list[Callable[[], Any]]) -> list[Any]:
    """Run every check, gathering all problems rather than stopping at the first."""
    results, problems = [], []
    for thunk in thunks:
        try:
            results.append(thunk())
        except _Problems as exc:
            problems.extend(exc.problems)
    if problems:
        raise _Problems(problems)
    return results


def _dump(value: Any, mode: str, exclude_unset: bool) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode=mode, exclude_unset=exclude_unset)
    if isinstance(value, list):
        return [_dump(v, mode, exclude_unset) for v in value]
    if isinstance(value, dict):
        return {k: _dump(v, mode, exclude_unset) for k, v in value.items()}
    if mode == "json" and isinstance(value, Path):
        return str(value)
    return value


def _frozen_key(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(_frozen_key(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((repr(k), _frozen_key(v)) for k, v in value.items()))
    return value


# --- models ------------------------------------------------------------------------------


class _ModelMeta(type):
    @property
    def model_fields(cls) -> dict[str, FieldInfo]:
        """Field name -> :class:`FieldInfo`, as pydantic's ``Model.model_fields``."""
        return dict(cls._fields())  # type: ignore[attr-defined]


class BaseModel(metaclass=_ModelMeta):
    """A strict, frozen record validated on construction; see the module docstring."""

    model_config: typing.ClassVar[dict[str, Any]] = {}
    __field_validators: typing.ClassVar[dict[str, list[Any]]]
    __model_validators: typing.ClassVar[list[Any]]
    __fields: typing.ClassVar[dict[str, FieldInfo] | None]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        field_validators: dict[str, list[Any]] = {}
        model_validators: list[Any] = []
        for klass in reversed(cls.__mro__):
            for name, attr in list(vars(klass).items()):
                if isinstance(attr, _FieldValidator):
                    for field_name in attr.fields:
                        field_validators.setdefault(field_name, []).append(attr.func)
                elif isinstance(attr, _ModelValidator):
                    model_validators.append(attr.func)
        cls._BaseModel__field_validators = field_validators
        cls._BaseModel__model_validators = model_validators
        cls._BaseModel__fields = None  # resolved on first use: annotations may name later classes

    @classmethod
    def _fields(cls) -> dict[str, FieldInfo]:
        fields = cls._BaseModel__fields
        if fields is None:
            module = typing.get_type_hints(cls, include_extras=True)
            fields = {}
            for name, annotation in module.items():
                if name.startswith("_") or typing.get_origin(annotation) is typing.ClassVar or name == "model_config":
                    continue
                fields[name] = FieldInfo(annotation, cls.__dict__.get(name, _find_default(cls, name)))
            cls._BaseModel__fields = fields
        return fields

    def __init__(self, **data: Any) -> None:
        try:
            values, given = type(self)._check(data, ())
        except _Problems as exc:
            raise ValidationError(type(self).__name__, exc.problems) from None
        self._assign(values, given)
        self._run_model_validators(())

    @classmethod
    def model_validate(cls, data: Any) -> BaseModel:
        """Validate a mapping (or return an instance of this model unchanged)."""
        if isinstance(data, cls):
            return data
        try:
            if not isinstance(data, dict):
                raise _problem((), f"Input should be a valid dictionary or instance of {cls.__name__}", "model_type", data)
            return cls._validate_mapping(data, ())
        except _Problems as exc:
            raise ValidationError(cls.__name__, exc.problems) from None

    @classmethod
    def _validate_mapping(cls, data: dict[str, Any], loc: tuple) -> BaseModel:
        values, given = cls._check(data, loc)
        instance = cls.__new__(cls)
        instance._assign(values, given)
        instance._run_model_validators(loc)
        return instance

    @classmethod
    def _check(cls, data: dict[str, Any], loc: tuple) -> tuple[dict[str, Any], frozenset[str]]:
        fields = cls._fields()
        problems: list[dict[str, Any]] = []
        for key in data:
            if key not in fields:
                problems.append({"loc": loc + (key,), "msg": "Extra inputs are not permitted",
                                 "type": "extra_forbidden", "input": data[key]})
        values: dict[str, Any] = {}
        for name, info in fields.items():
            where = loc + (name,)
            if name not in data:
                if info.is_required():
                    problems.append({"loc": where, "msg": "Field required", "type": "missing", "input": data})
                else:
                    values[name] = copy.deepcopy(info.default) if isinstance(info.default, (list, dict)) else info.default
                continue
            try:
                value = _validate(info.annotation, data[name], where)
                for check in cls._BaseModel__field_validators.get(name, ()):
                    try:
                        value = check.__get__(None, cls)(value)
                    except ValueError as exc:
                        raise _problem(where, f"Value error, {exc}", "value_error", data[name]) from None
                values[name] = value
            except _Problems as exc:
                problems.extend(exc.problems)
        if problems:
            raise _Problems(problems)
        return values, frozenset(k for k in data if k in fields)

    def _assign(self, values: dict[str, Any], given: frozenset[str]) -> None:
        for name, value in values.items():
            object.__setattr__(self, name, value)
        object.__setattr__(self, "model_fields_set", given)

    def _run_model_validators(self, loc: tuple) -> None:
        for check in type(self)._BaseModel__model_validators:
            try:
                check(self)
            except _Problems as exc:
                if loc:
                    raise
                raise ValidationError(type(self).__name__, exc.problems) from None
            except ValueError as exc:
                problem = _problem(loc, f"Value error, {exc}", "value_error", self)
                if loc:
                    raise problem from None
                raise ValidationError(type(self).__name__, problem.problems) from None

    # -- the record ---------------------------------------------------------------------

    def __setattr__(self, name: str, value: Any) -> None:
        raise TypeError(f"{type(self).__name__} is frozen: use model_copy(update=...)")

    def __delattr__(self, name: str) -> None:
        raise TypeError(f"{type(self).__name__} is frozen")

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return all(getattr(self, n) == getattr(other, n) for n in type(self)._fields())

    def __hash__(self) -> int:
        return hash((type(self), tuple(_frozen_key(getattr(self, n)) for n in type(self)._fields())))

    def __repr__(self) -> str:
        inner = ", ".join(f"{n}={getattr(self, n)!r}" for n in type(self)._fields())
        return f"{type(self).__name__}({inner})"

    def __copy__(self) -> BaseModel:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> BaseModel:
        return self  # frozen: sharing is safe

    def model_dump(self, *, mode: str = "python", exclude_unset: bool = False) -> dict[str, Any]:
        """The fields as plain data (``mode="json"``: paths as strings); ``exclude_unset``: only those given."""
        names = [n for n in type(self)._fields() if not exclude_unset or n in self.model_fields_set]
        return {n: _dump(getattr(self, n), mode, exclude_unset) for n in names}

    def model_copy(self, *, update: dict[str, Any] | None = None) -> BaseModel:
        """A copy with ``update`` applied as is (not validated, as in pydantic)."""
        clone = type(self).__new__(type(self))
        values = {n: getattr(self, n) for n in type(self)._fields()}
        values.update(update or {})
        clone._assign(values, self.model_fields_set | frozenset(update or {}))
        return clone


def _find_default(cls: type, name: str) -> Any:
    for klass in cls.__mro__[1:]:
        if name in vars(klass):
            return vars(klass)[name]
    return _MISSING
