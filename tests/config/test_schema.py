"""gpuperfd.config.schema: the validation the configuration relies on, without pydantic."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Annotated, Any, Literal

import pytest

from gpuperfd.config.schema import (
    BaseModel,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)


class Inner(BaseModel):
    level: Annotated[int, Field(ge=0, le=3)] = 1
    name: Annotated[str, Field(max_length=4)] = "x"


class Outer(BaseModel):
    kind: Literal["a", "b"]
    ratio: Annotated[float, Field(gt=0, lt=1)] | None = None
    cap: Annotated[float, Field(gt=0)] | Literal["max", "min"] = "max"
    items: list[Annotated[int, Field(ge=0)]] = []
    limits: dict[int, Annotated[float, Field(gt=0)]] = {}
    inner: Inner = Inner()
    inners: list[Inner] = []
    path: Path | None = None
    flag: bool = False
    extra: dict[str, Any] = {}

    @field_validator("extra")
    @classmethod
    def _no_secret(cls, value: dict[str, Any]) -> dict[str, Any]:
        if "secret" in value:
            raise ValueError("no secrets here")
        return value

    @model_validator(mode="after")
    def _b_needs_ratio(self) -> Outer:
        if self.kind == "b" and self.ratio is None:
            raise ValueError("kind b needs a ratio")
        return self


def _errors(data: dict[str, Any]) -> dict[str, str]:
    with pytest.raises(ValidationError) as info:
        Outer.model_validate(data)
    return {".".join(map(str, e["loc"])): e["msg"] for e in info.value.errors()}


def test_valid_input_is_typed_and_defaults_are_fresh() -> None:
    a = Outer.model_validate({"kind": "a", "ratio": 0.5, "cap": 300, "items": [1, 2], "limits": {0: 250},
                              "inner": {"level": 2}, "inners": [{"name": "ab"}], "path": "/tmp/x", "flag": "yes"})
    assert a.ratio == 0.5 and a.cap == 300.0 and isinstance(a.cap, float)
    assert a.items == [1, 2] and a.limits == {0: 250.0}
    assert a.inner == Inner(level=2) and a.inners == [Inner(name="ab")]
    assert a.path == Path("/tmp/x") and a.flag is True
    b = Outer(kind="a")
    b.items.append(7)
    assert Outer(kind="a").items == []  # a mutable default is never shared


def test_every_problem_is_reported_with_its_dotted_location() -> None:
    errors = _errors({"kind": "c", "ratio": 1.0, "cap": -1, "items": [1, -2], "limits": {0: 0},
                      "inner": {"level": 9, "name": "toolong"}, "inners": [{}, {"bogus": 1}], "typo": 1})
    assert errors["kind"] == "Input should be 'a' or 'b'"
    assert errors["ratio"] == "Input should be less than 1"
    assert errors["cap"] == "Input should be greater than 0"  # the first union member's complaint
    assert errors["items.1"] == "Input should be greater than or equal to 0"
    assert errors["limits.0"] == "Input should be greater than 0"
    assert errors["inner.level"] == "Input should be less than or equal to 3"
    assert errors["inner.name"] == "String should have at most 4 characters"
    assert errors["inners.1.bogus"] == "Extra inputs are not permitted"
    assert errors["typo"] == "Extra inputs are not permitted"
    assert "inners.0" not in errors  # an empty mapping is a valid Inner (all defaults)


def test_required_fields_types_and_booleans_are_strict() -> None:
    assert _errors({}) == {"kind": "Field required"}
    errors = _errors({"kind": "a", "flag": 2, "items": "1,2", "inner": [1], "ratio": True})
    assert errors["flag"] == "Input should be a valid boolean"
    assert errors["items"] == "Input should be a valid list"
    assert errors["inner"].startswith("Input should be a valid dictionary")
    assert errors["ratio"] == "Input should be a valid number"  # a boolean is never a number
    assert _errors({"kind": "a", "ratio": float("nan")})["ratio"] == "Input should be a finite number"


def test_validators_run_after_types_and_name_their_field() -> None:
    assert _errors({"kind": "a", "extra": {"secret": 1}}) == {"extra": "Value error, no secrets here"}
    assert _errors({"kind": "b"}) == {"": "Value error, kind b needs a ratio"}
    nested = {"inners": [{}, {"level": 5}]}

    class Holder(BaseModel):
        outers: list[Outer] = []

    with pytest.raises(ValidationError) as info:
        Holder.model_validate({"outers": [{"kind": "a"}, {"kind": "b"}], **{}})
    assert [(e["loc"], e["msg"]) for e in info.value.errors()] == [(("outers", 1), "Value error, kind b needs a ratio")]
    assert nested  # (keeps the structure readable)


def test_frozen_equal_hashable_dump_and_copy() -> None:
    a = Outer.model_validate({"kind": "a", "path": "/x", "inner": {"level": 0}})
    with pytest.raises(TypeError):
        a.kind = "b"  # type: ignore[misc]
    assert a == Outer(kind="a", path="/x", inner={"level": 0}) and hash(a) == hash(Outer(kind="a", path="/x", inner={"level": 0}))
    assert a != Outer(kind="a")
    assert a.model_dump(mode="json", exclude_unset=True) == {"kind": "a", "path": "/x", "inner": {"level": 0}}
    assert a.model_dump()["path"] == Path("/x") and a.model_dump()["items"] == []
    b = a.model_copy(update={"flag": True})
    assert b.flag is True and a.flag is False and b.kind == "a"
    assert Outer.model_validate(a) is a
    assert Outer.model_fields["kind"].is_required() and not Outer.model_fields["flag"].is_required()


def test_the_daemon_does_not_load_pydantic() -> None:
    code = "import sys, gpuperfd.daemon, gpuperfd.cli; print(sorted(m for m in sys.modules if m.split('.')[0] == 'pydantic'))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
