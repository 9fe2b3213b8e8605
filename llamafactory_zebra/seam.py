"""The one door to upstream code: the :class:`Seam` record, :func:`wrap`/:func:`original`, the drift check,
and :func:`install`, which loops over a side's table.

Every upstream name the plugin replaces, or relies on by signature or by source, is a :class:`Seam` in
one of the per-side tables — LLaMA-Factory and the libraries it drives (``integration/seams.py``), vLLM
and the vLLM API surface the serving layer reads (``serving/vllm/seams.py``), fla for the ROCm
workaround (``kernels/fla_seams.py``); transformers' registries are their own table
(``integration/registrations.py``'s ``TRANSFORMERS_REGISTRATIONS``). A record says what was relied on when the
change was written: the leading ``parameters`` in order (positional calls), the ``keywords`` in any
order (keyword calls), the ``fields`` its objects are read by (a dataclass's fields), the SHA-256 of the
upstream source (a wrapper whose correctness depends on the body it wraps), or one SHA-256 per upstream
version whose source the change was re-read against (``{"0.32.0": ..., "0.33.0": ...}``: one plugin version
for several upstream ones; :func:`recorded_source` says which one is running). :func:`drift` checks the
signature kinds and the source kind alike; each side's test runs it over
its whole table, and :func:`install` runs it over a module's records before changing anything, so an
upgrade fails naming the seam instead of patching the wrong thing.

:func:`wrap` is the only code that assigns an upstream attribute: the wrapper must be made with
``functools.wraps`` around the current value (``__wrapped__``), it is marked with that original
(:data:`ORIGINAL`), and a name that already holds a plugin wrapper is refused. A leaf module: it imports
nothing from the package, so every side can use it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import importlib
import inspect
from collections.abc import Callable, Iterable, Iterator, Mapping
from types import ModuleType
from typing import Any

# Attribute on every installed wrapper: the upstream object it replaced.
ORIGINAL = "__zebra_original__"


class UpstreamSeamChanged(RuntimeError):
    pass


class AlreadyWrapped(RuntimeError):
    pass


@dataclasses.dataclass(frozen=True)
class Seam:
    """One upstream name and what the plugin relies on about it."""

    module: str
    attribute: str  # dotted for class members: "Engine.resume"
    parameters: tuple[str, ...] | None = None  # the leading parameters, in order (called positionally)
    keywords: tuple[str, ...] = ()  # parameter names, any order (called by keyword)
    fields: tuple[str, ...] = ()  # attributes read from its instances: dataclass fields or class attributes
    # The upstream source the change was written against: one SHA-256, or upstream version -> SHA-256 of the
    # source read there (any of them is as recorded).
    source_sha256: str | Mapping[str, str] | None = None
    # Builds the replacement from the (imported) module; None: the name is only called or read.
    wrapper: Callable[[ModuleType], Any] | None = None
    # A registration through upstream's own ``register`` call (no attribute replaced); run by install().
    register: Callable[[ModuleType], None] | None = None
    on_import: bool = True  # install() applies the wrapper; False: named code applies it when needed
    why: str = ""

    @property
    def name(self) -> str:
        return f"{self.module}.{self.attribute}"


def _lookup(owner: Any, attribute: str) -> Any:
    for part in attribute.split("."):
        owner = getattr(owner, part, None)
        if owner is None:
            return None
    return owner


def _owner(module: Any, attribute: str) -> tuple[Any, str]:
    """The object holding the last part of a (dotted) attribute, and that part's name."""
    owner_path, _, name = attribute.rpartition(".")
    return (_lookup(module, owner_path) if owner_path else module), name


def original(module: ModuleType | str, attribute: str) -> Any:
    """``module.attribute`` as upstream defines it, also after :func:`wrap` replaced it."""
    if isinstance(module, str):
        module = importlib.import_module(module)
    current = _lookup(module, attribute)
    return getattr(current, ORIGINAL, current)


def is_wrapped(module: ModuleType, attribute: str) -> bool:
    """Whether ``module.attribute`` is currently a llamafactory-zebra wrapper."""
    return hasattr(_lookup(module, attribute), ORIGINAL)


def source_hash(obj: Any) -> str:
    """SHA-256 of the source of ``obj``, or of the function under it (a Triton kernel's ``.fn`` chain)."""
    while True:
        try:
            return hashlib.sha256(inspect.getsource(obj).encode()).hexdigest()
        except TypeError:
            if not hasattr(obj, "fn"):
                raise
            obj = obj.fn


def drift(seam: Seam, module: ModuleType | None = None) -> str | None:
    """What changed upstream since ``seam`` was recorded, or ``None`` when nothing did."""
    if module is None:
        try:
            module = importlib.import_module(seam.module)
        except ImportError as error:
            return f"{seam.module} does not import ({error})"
    target = original(module, seam.attribute)
    if target is None:
        return f"{seam.name} is gone"
    if seam.parameters is not None or seam.keywords:
        try:
            actual = tuple(inspect.signature(target).parameters)
        except (TypeError, ValueError) as error:
            return f"{seam.name} has no signature to check ({error})"
        if seam.parameters is not None and actual[: len(seam.parameters)] != seam.parameters:
            return f"{seam.name} now takes {actual}, expected {seam.parameters} first"
        missing = [name for name in seam.keywords if name not in actual]
        if missing:
            return f"{seam.name} no longer takes {', '.join(missing)} (it takes {actual})"
    if seam.fields:
        known = {f.name for f in dataclasses.fields(target)} if dataclasses.is_dataclass(target) else set()
        missing = [name for name in seam.fields if name not in known and not hasattr(target, name)]
        if missing:
            return f"{seam.name} has no {', '.join(missing)} any more"
    if seam.source_sha256 is not None:
        current = source_hash(target)
        if current not in _recorded_sources(seam).values():
            return f"{seam.name}'s source changed (SHA-256 {current}, recorded {_describe_sources(seam)})"
    return None


def _recorded_sources(seam: Seam) -> Mapping[str, str]:
    """The record's source SHA-256s by upstream version (``""`` for a single, unversioned one)."""
    if isinstance(seam.source_sha256, str):
        return {"": seam.source_sha256}
    return seam.source_sha256 or {}


def _describe_sources(seam: Seam) -> str:
    return "; ".join(f"{version}: {sha}" if version else sha for version, sha in _recorded_sources(seam).items())


def recorded_source(seam: Seam, module: ModuleType | None = None) -> str | None:
    """The upstream version whose recorded source ``seam``'s upstream object has (``""`` for an unversioned
    record), or ``None`` when its source matches none of them: for code and tests whose expectations differ
    between the recorded versions (an upstream bug fixed in a later one)."""
    if module is None:
        module = importlib.import_module(seam.module)
    current = source_hash(original(module, seam.attribute))
    return next((version for version, sha in _recorded_sources(seam).items() if sha == current), None)


def check(seam: Seam, module: ModuleType, hint: str = "") -> Any:
    """The upstream object of ``seam``, or :class:`UpstreamSeamChanged` naming what drifted (and ``hint``)."""
    changed = drift(seam, module)
    if changed is not None:
        raise UpstreamSeamChanged(changed + (f"; {hint}" if hint else ""))
    return original(module, seam.attribute)


def wrap(seam: Seam, module: ModuleType, wrapper: Any, hint: str = "", strict: bool = True) -> None:
    """Replace ``module.attribute`` of ``seam`` by ``wrapper`` (the one assignment to upstream names).

    ``wrapper`` must carry the attribute's current value as ``__wrapped__`` (``functools.wraps``), so
    signatures and names stay upstream's; it is marked with that original (:data:`ORIGINAL`). A name
    that already holds a plugin wrapper is refused: two wrappers on one name would run in an order
    nobody chose. ``strict=False`` (``install`` with ``warn``) leaves drift to the caller.
    """
    current = check(seam, module, hint) if strict else original(module, seam.attribute)
    if current is None:
        raise UpstreamSeamChanged(f"{seam.name} is gone" + (f"; {hint}" if hint else ""))
    if is_wrapped(module, seam.attribute):
        raise AlreadyWrapped(
            f"{seam.name} is already wrapped by llamafactory-zebra; extend that wrapper instead of wrapping the name "
            "again"
        )
    if getattr(wrapper, "__wrapped__", None) is not current:
        raise ValueError(f"the wrapper for {seam.name} must be made with functools.wraps around its current value")
    setattr(wrapper, ORIGINAL, current)
    owner, name = _owner(module, seam.attribute)
    setattr(owner, name, wrapper)


def unwrap(module: ModuleType, attribute: str) -> None:
    """Put the original back (for wrappers that live during one call, e.g. ``deepspeed.initialize``)."""
    owner, name = _owner(module, attribute)
    current = getattr(owner, name)
    if not hasattr(current, ORIGINAL):
        raise ValueError(f"{module.__name__}.{attribute} is not wrapped by llamafactory-zebra")
    setattr(owner, name, getattr(current, ORIGINAL))


@contextlib.contextmanager
def wrapped(seam: Seam, module: ModuleType, wrapper: Any, hint: str = "") -> Iterator[None]:
    """:func:`wrap` for the duration of a ``with`` block, then the original back."""
    wrap(seam, module, wrapper, hint)
    try:
        yield
    finally:
        unwrap(module, seam.attribute)


@contextlib.contextmanager
def wrapped_method(seam: Seam, instance: Any, wrapper: Callable, hint: str = "") -> Iterator[None]:
    """``instance.method`` (the record's ``attribute`` is ``Class.method`` of a class ``instance`` is) is ``wrapper``
    for one ``with`` block: this object only, its class untouched (an instance attribute shadows the
    class's method and is deleted afterwards). ``wrapper`` is made with ``functools.wraps`` around the
    bound method, as :func:`wrap` requires."""
    method = seam.attribute.rpartition(".")[2]
    check(seam, importlib.import_module(seam.module), hint)
    bound = getattr(instance, method)
    if method in vars(instance):
        raise AlreadyWrapped(f"{seam.name} is already replaced on this {type(instance).__name__}")
    if getattr(wrapper, "__wrapped__", None) != bound:
        raise ValueError(f"the wrapper for {seam.name} must be made with functools.wraps around it")
    setattr(wrapper, ORIGINAL, bound)
    setattr(instance, method, wrapper)
    try:
        yield
    finally:
        delattr(instance, method)


def install(
    seams: Iterable[Seam],
    module: ModuleType,
    only: tuple[str, ...] | None = None,
    hint: str = "",
    warn: Callable[[str], None] | None = None,
) -> None:
    """Loop over the table's records of ``module``: check every one (wrapped or relied on), then apply the
    wrappers and registrations that apply at import (or exactly the attributes named in ``only``).
    Idempotent: a name that already holds the plugin's wrapper is left as it is.

    A drifted record raises :class:`UpstreamSeamChanged`; with ``warn`` it is reported there instead and
    the change is still applied (a side whose drift is for its test to catch, not for a user's run to
    stop on)."""
    mine = [seam for seam in seams if seam.module == module.__name__]
    if only is not None:
        unknown = set(only) - {seam.attribute for seam in mine}
        if unknown:
            raise KeyError(f"{module.__name__}: {', '.join(sorted(unknown))} not declared in the seam table")
    for seam in mine:
        changed = drift(seam, module)
        if changed is not None and warn is None:
            raise UpstreamSeamChanged(changed + (f"; {hint}" if hint else ""))
        if changed is not None:
            warn(f"{changed}; {hint}" if hint else changed)
    for seam in mine:
        if (seam.attribute in only) if only is not None else seam.on_import:
            if seam.register is not None:
                seam.register(module)
            elif seam.wrapper is not None and not is_wrapped(module, seam.attribute):
                wrap(seam, module, seam.wrapper(module), hint, strict=False)


def declared(seams: Iterable[Seam], module: str, attribute: str) -> Seam:
    """The record of ``module.attribute`` in a table; ``KeyError`` naming it when it is not declared."""
    for seam in seams:
        if seam.module == module and seam.attribute == attribute:
            return seam
    raise KeyError(f"{module}.{attribute} is not declared in the seam table")
