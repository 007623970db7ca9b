"""`proxy.frozen.fast_init`: the same objects as the dataclass's own `__init__`, and still frozen.

Every class of the project that uses it is checked against its original `__init__` (found by
importing the modules that use it), so a field added later is covered without a test change."""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
from dataclasses import InitVar, dataclass, field

import pytest

import proxy
from proxy.frozen import fast_init, original_init


def _project_classes() -> list[type]:
    found = []
    for info in pkgutil.walk_packages(proxy.__path__, "proxy."):
        if info.name.endswith("__main__"):
            continue
        module = importlib.import_module(info.name)
        for value in vars(module).values():
            is_own = isinstance(value, type) and value.__module__ == module.__name__
            if is_own and "__dataclass_original_init__" in vars(value):
                found.append(value)
    return found


PROJECT_CLASSES = _project_classes()


def test_the_request_path_classes_use_it() -> None:
    names = {c.__qualname__ for c in PROJECT_CLASSES}
    assert {"MessageView", "PlanContext", "Measurement", "SessionRecord", "Sidecar", "RequestRow"} <= names


def _build(cls: type, init: object, *args: object, **kwargs: object) -> object:
    instance = object.__new__(cls)
    init(instance, *args, **kwargs)  # type: ignore[operator]
    return instance


def _fields(instance: object) -> list[object]:
    return [getattr(instance, f.name) for f in dataclasses.fields(instance)]  # type: ignore[arg-type]


@pytest.mark.parametrize("cls", PROJECT_CLASSES, ids=lambda c: f"{c.__module__}.{c.__qualname__}")
def test_same_fields_defaults_and_errors_as_the_dataclass_init(cls: type) -> None:
    fields = dataclasses.fields(cls)
    values = [object() for _ in fields]
    ours, theirs = cls(*values), _build(cls, original_init(cls), *values)
    assert all(a is b for a, b in zip(_fields(ours), values, strict=True))
    assert all(a is b for a, b in zip(_fields(theirs), values, strict=True))
    by_name = {f.name: v for f, v in zip(fields, values, strict=True)}
    assert _fields(cls(**by_name)) == _fields(ours)
    required = [f for f in fields if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    head = values[: len(required)]
    # the fields left out get the dataclass's defaults (a factory's result: equal, fresh each time)
    assert _fields(cls(*head)) == _fields(_build(cls, original_init(cls), *head))
    with pytest.raises(TypeError):
        cls(*values, object())
    with pytest.raises(TypeError):
        _build(cls, original_init(cls), *values, object())
    if required:
        with pytest.raises(TypeError):
            cls(*head[:-1])
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(ours, fields[0].name, None)
    assert ours == theirs and repr(ours) == repr(theirs)


@fast_init
@dataclass(frozen=True, slots=True)
class _Sample:
    a: int
    b: tuple[int, ...] = ()
    c: list[int] = field(default_factory=list)


def test_a_default_factory_runs_per_object_and_replace_works() -> None:
    first, second = _Sample(1), _Sample(2, (3,))
    assert first.c == [] and first.c is not second.c
    assert (first.a, first.b, second.b) == (1, (), (3,))
    assert dataclasses.replace(second, a=5) == _Sample(5, (3,), [])
    assert _Sample(1) != _Sample(2) and _Sample(1, (2,)) == _Sample(1, (2,), [])


def test_what_it_cannot_reproduce_is_refused() -> None:
    @dataclass(frozen=True)
    class NoSlots:
        a: int

    @dataclass(slots=True)
    class NotFrozen:
        a: int

    @dataclass(frozen=True, slots=True)
    class PostInit:
        a: int

        def __post_init__(self) -> None:
            pass

    @dataclass(frozen=True, slots=True)
    class KeywordOnly:
        a: int = field(kw_only=True)

    @dataclass(frozen=True, slots=True)
    class NotInInit:
        a: int = field(default=0, init=False)

    @dataclass(frozen=True, slots=True)
    class WithInitVar:
        a: int
        b: InitVar[int] = 0

    for cls in (NoSlots, NotFrozen, PostInit, KeywordOnly, NotInInit, WithInitVar):
        with pytest.raises(TypeError):
            fast_init(cls)
