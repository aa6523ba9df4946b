"""Re-read artifacts from disk and prove the manifest still holds (``res.verify_weights()``):
every stored copy of every weight, against the one state_dict."""

from __future__ import annotations

import hashlib
import pathlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from ..errors import WeightMismatchError
from ..shared_state.tensor_bytes import tensor_sha256
from .locate import encoded_sha256
from .manifest import FAILING_STATUSES, WeightEntry, WeightLocation, WeightManifest
from .readers import SCALE_KEY_PREFIX, read_onnx, read_pte

__all__ = ["WeightCheck", "verify_manifest"]


@dataclass(frozen=True)
class WeightCheck:
    """What was proven: entries checked, and per artifact the entries whose copies were all
    checked bit for bit (``exact``, or ``transformed`` when one copy was permuted), those checked
    by other means (``not_stored``), and every stored copy checked from disk (``copies``)."""

    entries: int
    exact: Mapping[str, int]
    transformed: Mapping[str, int]
    not_stored: Mapping[str, int]
    copies: Mapping[str, int] | None = None


def _expected(e: WeightEntry, loc: WeightLocation) -> str:
    return loc.stored_sha256 if loc.status == "transformed" and loc.stored_sha256 else e.sha256


def _copy_ok(target: str, store: Any, e: WeightEntry, loc: WeightLocation) -> bool:
    """The bytes at ``loc`` in the file are the manifest's (for a permuted copy, its digest)."""
    expected, kind, ref = _expected(e, loc), loc.kind, loc.ref
    if target == "onnx":
        return kind == "initializer" and store.sha256.get(ref.split("@")[0]) == expected
    if kind == "named_data":
        return ref.removeprefix(SCALE_KEY_PREFIX) == expected and store.named_ok(ref)
    if kind == "constant_buffer":
        idx = int(ref)
        return store.bound(idx, e.nbytes) and store.constant_sha(idx, e.nbytes) == expected
    if kind == "delegate_payload":
        off = int(ref)
        return hashlib.sha256(store.raw[off : off + e.nbytes]).hexdigest() == expected
    return False


def verify_manifest(
    manifest: WeightManifest, out_dir: pathlib.Path, holder: Mapping[str, torch.Tensor] | None
) -> WeightCheck:
    """Every copy the manifest records, read back from disk: a copy whose bytes changed names
    the weight, the copy and the file. ``holder`` (the one state_dict's tensors): each must still
    hash to the manifest's digest (the files carry those values), and a permuted copy must be
    the permutation of the holder's tensor."""
    problems: list[str] = []
    if holder is not None:
        for e in manifest.entries:
            t = holder.get(e.name)
            if t is None:
                problems.append(f"holder: weight {e.name!r} is no longer in the shared program")
            elif tensor_sha256(t) != e.sha256:
                problems.append(
                    f"holder: weight {e.name!r} is stale: it changed after export "
                    "(the artifacts carry the old values)"
                )
    stores: dict[str, Any] = {}
    for target, info in manifest.artifacts.items():
        path = out_dir / info["file"]
        stores[target] = read_onnx(path) if target == "onnx" else read_pte(path)
    exact = dict.fromkeys(stores, 0)
    transformed = dict.fromkeys(stores, 0)
    not_stored = dict.fromkeys(stores, 0)
    copies = dict.fromkeys(stores, 0)
    for e in manifest.entries:
        for target, records in e.copies.items():
            if target not in stores:
                continue
            file = manifest.artifacts[target]["file"]
            bad = False
            for loc in records:
                if loc.status in FAILING_STATUSES:
                    problems.append(f"{target}: weight {e.name!r} is {loc.status}: {loc.reason}")
                    bad = True
                    continue
                if loc.status not in ("exact", "transformed"):
                    continue
                ok = _copy_ok(target, stores[target], e, loc)
                if ok and loc.status == "transformed" and holder is not None and e.name in holder:
                    ok = encoded_sha256(
                        holder[e.name], tuple(loc.permutation or ()), loc.encoding
                    ) == _expected(e, loc)
                if not ok:
                    bad = True
                    problems.append(
                        f"{target}: weight {e.name!r} differs on disk from the manifest: copy "
                        f"{loc.where} in {file}"
                    )
                else:
                    copies[target] += 1
            statuses = {loc.status for loc in records}
            if bad:
                continue
            if statuses & {"exact", "transformed"}:
                if "transformed" in statuses:
                    transformed[target] += 1
                else:
                    exact[target] += 1
            else:
                not_stored[target] += 1
    if problems:
        raise WeightMismatchError(
            f"{len(problems)} weight problem(s):\n  " + "\n  ".join(problems),
            problems=tuple(problems),
            hint="re-export from the current model; never edit artifacts by hand",
        )
    return WeightCheck(len(manifest.entries), exact, transformed, not_stored, copies)
