"""The batch manifest: a TOML file (read with the standard library's ``tomllib``) with a
``[defaults]`` table and one ``[models.NAME]`` table per entry.

Why each entry is checked on its own: a zoo of a hundred entries must not stop at one typo. A
malformed entry becomes a ``Malformed`` value naming the entry and its line, and the others run; a
file that is not TOML at all is an ``InputError`` naming the line tomllib reports.

An entry::

    [models.llama_tiny]
    hf = "LlamaConfig"                  # or model = "MODULE:ATTR" (as in `dualexport export`)
    task = "causal-lm"                  # or model_class = "LlamaForCausalLM"
    config = { hidden_size = 32, num_hidden_layers = 2, vocab_size = 128 }
    inputs = ["1x8:int64:0..127"]        # the CLI's --input grammar
    dynamic = ["0.1=seq:2..16"]         # the CLI's --dynamic grammar
    targets = ["onnx", "xnnpack"]
    quantize = "int8"                   # optional; calibration = 4 random batches by default
"""

from __future__ import annotations

import difflib
import hashlib
import os
import pathlib
import re
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

from ..errors import DualExportError, InputError
from ..exporters import normalize_targets
from ..loading import DynamicDim, InputSpec, parse_dynamic, parse_input
from ..outputs import check_name

__all__ = ["Entry", "Malformed", "Manifest", "read_manifest", "parse_manifest", "entry_digest"]


@dataclass(frozen=True)
class Entry:
    """One model of the zoo, with its defaults applied and every field checked.

    ``search_path``: folders (absolute) where ``model``'s module is looked up first (the
    manifest's ``path``, relative to the manifest's folder)."""

    name: str
    inputs: tuple[InputSpec, ...]
    model: str | None = None
    hf: str | None = None
    config: Mapping[str, Any] = field(default_factory=dict)
    task: str = "base"
    model_class: str | None = None
    input_names: tuple[str, ...] = ("input_ids",)
    outputs: int = 1
    attention: str | None = None  # transformers' own choice (SDPA where supported)
    dynamic: tuple[DynamicDim, ...] = ()
    targets: tuple[str, ...] = ("onnx", "xnnpack")
    quantize: str | None = None
    calibration: int = 4
    optimize: bool = True
    bundle: bool = False
    compare: bool = True
    edges: bool = True
    generate: int = 0
    rtol: float | None = None
    atol: float | None = None
    bn_batches: int = 0
    seed: int = 0
    timeout: float = 1800.0
    memory_mb: float | None = None
    search_path: tuple[str, ...] = ()
    line: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """A plain form (for a Ray task or a spawned worker, and for the entry's digest)."""
        out: dict[str, Any] = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name == "inputs":
                v = [[list(s.shape), s.dtype, s.low, s.high] for s in v]
            elif f.name == "dynamic":
                v = [[d.input, d.dim, d.min, d.max, d.name] for d in v]
            elif isinstance(v, tuple):
                v = list(v)
            elif isinstance(v, Mapping):
                v = dict(v)
            out[f.name] = v
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Entry:
        kw = dict(d)
        kw["inputs"] = tuple(InputSpec(tuple(s), t, lo, hi) for s, t, lo, hi in d["inputs"])
        kw["dynamic"] = tuple(DynamicDim(*x) for x in d.get("dynamic", ()))
        for k in ("input_names", "targets", "search_path"):
            if k in kw:
                kw[k] = tuple(kw[k])
        return cls(**kw)


@dataclass(frozen=True)
class Malformed:
    """An entry that cannot run as written: its name, line and what is wrong."""

    name: str
    line: int | None
    reason: str


@dataclass(frozen=True)
class Manifest:
    path: pathlib.Path | None
    entries: tuple[Entry, ...]
    malformed: tuple[Malformed, ...]
    sha256: str

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(e.name for e in self.entries) + tuple(m.name for m in self.malformed)


#: Keys an entry (or [defaults]) may set, with the type each must have.
_TYPES: dict[str, tuple[type, ...]] = {
    "model": (str,),
    "hf": (str,),
    "config": (dict,),
    "task": (str,),
    "model_class": (str,),
    "input_names": (list,),
    "outputs": (int,),
    "attention": (str,),
    "inputs": (list,),
    "dynamic": (list,),
    "targets": (list, str),
    "quantize": (str,),
    "calibration": (int,),
    "optimize": (bool,),
    "bundle": (bool,),
    "compare": (bool,),
    "edges": (bool,),
    "generate": (int,),
    "rtol": (float, int),
    "atol": (float, int),
    "bn_batches": (int,),
    "seed": (int,),
    "timeout": (float, int),
    "memory_mb": (float, int),
    "path": (list, str),
}
_TOP = {"defaults", "models"}
_RESERVED = {"batch.json", "batch.html"}


def _line_of(text: str, name: str) -> int | None:
    """The line of ``[models.NAME]`` (or ``models.NAME = {...}``) in the manifest's text."""
    quoted = re.escape(name)
    pat = re.compile(
        rf"^[ \t]*(\[[ \t]*models\s*\.\s*(?:{quoted}|\"{quoted}\"|'{quoted}')\s*\]"
        rf"|models\s*\.\s*(?:{quoted}|\"{quoted}\")\s*=)",
        re.M,
    )
    m = pat.search(text)
    return text.count("\n", 0, m.start()) + 1 if m else None


def _check_types(table: Mapping[str, Any], where: str) -> None:
    for key, value in table.items():
        if key not in _TYPES:
            close = difflib.get_close_matches(key, list(_TYPES), n=1, cutoff=0.6)
            raise InputError(
                f"{where}: unknown key {key!r}",
                hint=f"did you mean {close[0]!r}?" if close else f"known keys: {', '.join(sorted(_TYPES))}",
            )
        if isinstance(value, bool) and bool not in _TYPES[key]:
            raise InputError(f"{where}: {key} must be {_TYPES[key][0].__name__}, not a boolean")
        if not isinstance(value, _TYPES[key]):
            raise InputError(
                f"{where}: {key} must be {' or '.join(t.__name__ for t in _TYPES[key])}, "
                f"not {type(value).__name__}"
            )


def _entry(name: str, table: Mapping[str, Any], defaults: Mapping[str, Any], base: pathlib.Path) -> Entry:
    where = f"entry {name!r}"
    _check_types(table, where)
    merged = {**defaults, **table}
    if ("model" in table) == ("hf" in table):
        raise InputError(
            f"{where}: give exactly one of model = 'MODULE:ATTR' or hf = 'ConfigClass'",
            hint="e.g. model = 'dualexport.examples:TinyConvNet'",
        )
    if "hf" in table:
        merged.pop("model", None)
    else:
        merged.pop("hf", None)
        for key in ("config", "task", "model_class", "input_names", "outputs", "attention"):
            if key in table:
                raise InputError(f"{where}: {key} applies to hf entries only")
    if "model" in merged and ":" not in merged["model"]:
        raise InputError(f"{where}: model {merged['model']!r} is not MODULE:ATTR")
    raw_inputs = merged.get("inputs")
    if not raw_inputs:
        raise InputError(f"{where}: inputs is required", hint='e.g. inputs = ["1x3x224x224:float32"]')
    if not all(isinstance(s, str) for s in raw_inputs):
        raise InputError(f"{where}: inputs must be strings like '1x3x32x32:float32'")
    inputs = tuple(parse_input(s) for s in raw_inputs)
    raw_dyn = merged.pop("dynamic", [])
    if not all(isinstance(s, str) for s in raw_dyn):
        raise InputError(f"{where}: dynamic must be strings like '0.1=1..64'")
    dynamic = tuple(parse_dynamic(s) for s in raw_dyn)
    for d in dynamic:
        if d.input >= len(inputs) or d.dim >= len(inputs[d.input].shape):
            raise InputError(f"{where}: dynamic dim {d.input}.{d.dim} does not exist in the inputs")
        if not d.min <= inputs[d.input].shape[d.dim] <= d.max:
            raise InputError(
                f"{where}: dynamic dim {d.input}.{d.dim}: the example's size "
                f"{inputs[d.input].shape[d.dim]} is outside {d.min}..{d.max}"
            )
    targets = merged.pop("targets", ("onnx", "xnnpack"))
    targets = normalize_targets(targets if isinstance(targets, str) else tuple(targets))
    quantize = merged.get("quantize")
    if quantize not in (None, "int8"):
        raise InputError(f"{where}: quantize must be 'int8' (or absent), not {quantize!r}")
    raw_path = merged.pop("path", [])
    paths = [raw_path] if isinstance(raw_path, str) else list(raw_path)
    search = tuple(str((base / p).resolve()) for p in paths)
    for key in ("timeout", "rtol", "atol", "memory_mb"):
        if key in merged:
            merged[key] = float(merged[key])
            if merged[key] <= 0:
                raise InputError(f"{where}: {key} must be positive")
    for key in ("calibration", "generate", "bn_batches", "outputs"):
        if merged.get(key, 0) < 0:
            raise InputError(f"{where}: {key} must not be negative")
    if "input_names" in merged:
        merged["input_names"] = tuple(str(x) for x in merged["input_names"])
    merged.pop("inputs")
    return Entry(name=name, inputs=inputs, dynamic=dynamic, targets=targets, search_path=search, **merged)


def parse_manifest(text: str, *, base: pathlib.Path, path: pathlib.Path | None = None) -> Manifest:
    """Entries and malformed entries of a manifest's text, in the file's order."""
    where = str(path) if path is not None else "manifest"
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise InputError(
            f"{where} is not valid TOML: {exc}", hint="fix the TOML syntax where the message points"
        ) from None
    unknown = set(data) - _TOP
    if unknown:
        raise InputError(
            f"{where}: unknown top-level table(s) {sorted(unknown)}",
            hint="put options in [defaults] and each model in [models.NAME]",
        )
    defaults = data.get("defaults", {})
    if not isinstance(defaults, dict):
        raise InputError(f"{where}: defaults must be a table")
    _check_types(defaults, f"{where} [defaults]")
    for key in ("model", "hf"):
        if key in defaults:
            raise InputError(f"{where} [defaults]: {key} belongs to an entry, not the defaults")
    models = data.get("models", {})
    if not isinstance(models, dict) or not models:
        raise InputError(f"{where}: no [models.NAME] tables", hint="add one table per model")
    entries: list[Entry] = []
    malformed: list[Malformed] = []
    for name, table in models.items():
        line = _line_of(text, name)
        try:
            check_name(name)
            if name in _RESERVED:
                raise InputError(f"entry name {name!r} is the batch's own file", hint="rename the entry")
            if not isinstance(table, dict):
                raise InputError(f"entry {name!r} must be a table")
            entries.append(replace(_entry(name, table, defaults, base), line=line))
        except DualExportError as exc:
            malformed.append(Malformed(name, line, str(exc)))
    return Manifest(path, tuple(entries), tuple(malformed), hashlib.sha256(text.encode()).hexdigest())


def read_manifest(path: str | os.PathLike[str]) -> Manifest:
    p = pathlib.Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise InputError(f"cannot read manifest {p}: {exc.strerror or exc}") from None
    return parse_manifest(text, base=p.resolve().parent, path=p)


def entry_digest(entry: Entry) -> str:
    """A digest of what the manifest asks of an entry (not of the model it builds)."""
    import json

    d = entry.to_dict()
    d.pop("line", None)
    return hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()


def names_unique(entries: Sequence[Entry]) -> None:
    seen: set[str] = set()
    for e in entries:
        if e.name in seen:
            raise InputError(f"entry {e.name!r} appears twice")
        seen.add(e.name)
