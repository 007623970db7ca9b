"""A faster `__init__` for the frozen, slotted dataclasses built on every request.

A frozen dataclass's generated `__init__` sets each field through `object.__setattr__` (its own
`__setattr__` refuses): about 0.25 us a field here, against 0.04 for a plain one, and a 1 KB
request builds about 20 such objects (~180 fields: the message view, the plan context, the
measurement, the session record, the history row ...). `fast_init(cls)` replaces that
`__init__` with one that stores each argument through the field's slot descriptor (its C-level
`__set__`, which a class's `__setattr__` does not intercept), about half the cost; everything
else stays the dataclass's: the signature (names, order, defaults, default factories), `repr`,
`eq`, `hash`, `dataclasses.replace`, and `FrozenInstanceError` on any later assignment.

Only for what it can reproduce exactly: a frozen dataclass with `slots=True`, every field in
`__init__`, none keyword-only, no `InitVar` and no `__post_init__`; anything else raises
`TypeError` at import time (so a change to the class cannot silently diverge).
`original_init(cls)` is the dataclass's own `__init__` (the tests compare the two).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Final, TypeVar

T = TypeVar("T")

_ORIGINAL: Final = "__dataclass_original_init__"
_NO_ARGUMENT: Final = object()
"""Default of a field with a `default_factory` (the factory is called when it is left out)."""


def fast_init(cls: type[T]) -> type[T]:
    """`cls` with the faster `__init__` (module docstring); raises `TypeError` when `cls` is not
    a dataclass it reproduces exactly."""
    params = getattr(cls, "__dataclass_params__", None)
    if params is None or not params.frozen or "__slots__" not in cls.__dict__:
        raise TypeError(f"{cls.__qualname__}: fast_init needs a frozen dataclass with slots=True")
    if hasattr(cls, "__post_init__"):
        raise TypeError(f"{cls.__qualname__}: fast_init does not run __post_init__")
    declared = cls.__dataclass_fields__  # type: ignore[attr-defined]
    if any(f._field_type is dataclasses._FIELD_INITVAR for f in declared.values()):  # type: ignore[attr-defined]
        raise TypeError(f"{cls.__qualname__}: fast_init does not take InitVar fields")
    namespace: dict[str, Any] = {"_NO_ARGUMENT": _NO_ARGUMENT}
    arguments, body = [], []
    for field in dataclasses.fields(cls):  # type: ignore[arg-type]
        name = field.name
        if not field.init or field.kw_only:
            raise TypeError(f"{cls.__qualname__}.{name}: fast_init needs every field positional in __init__")
        slot: Any = getattr(cls, name, None)
        if type(slot).__name__ != "member_descriptor":
            raise TypeError(f"{cls.__qualname__}.{name}: not a slot")
        namespace[f"_set_{name}"] = slot.__set__
        if field.default is not dataclasses.MISSING:
            namespace[f"_default_{name}"] = field.default
            arguments.append(f"{name}=_default_{name}")
        elif field.default_factory is not dataclasses.MISSING:
            namespace[f"_factory_{name}"] = field.default_factory
            arguments.append(f"{name}=_NO_ARGUMENT")
            body.append(f"    if {name} is _NO_ARGUMENT:\n        {name} = _factory_{name}()\n")
        else:
            arguments.append(name)
        body.append(f"    _set_{name}(self, {name})\n")
    source = f"def __init__(self, {', '.join(arguments)}):\n" + ("".join(body) or "    pass\n")
    exec(source, namespace)  # noqa: S102 - generated from the class's own field names, as dataclasses does
    init: Callable[..., None] = namespace["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__module__ = cls.__module__
    init.__doc__ = cls.__init__.__doc__
    setattr(cls, _ORIGINAL, cls.__init__)
    setattr(cls, "__init__", init)  # noqa: B010 - replacing the method is the point
    return cls


def original_init(cls: type) -> Callable[..., None]:
    """The dataclass's own `__init__` of a class `fast_init` changed."""
    found: Callable[..., None] = getattr(cls, _ORIGINAL)
    return found
