"""Re-read artifacts from disk and prove the manifest still holds (``res.verify_weights()``)."""

from __future__ import annotations

import hashlib
import pathlib
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from ..errors import WeightMismatchError
from ..shared_state.tensor_bytes import tensor_sha256
from .locate import permuted_sha256
from .manifest import FAILING_STATUSES, WeightManifest
from .readers import read_onnx, read_pte

__all__ = ["WeightCheck", "verify_manifest"]


@dataclass(frozen=True)
class WeightCheck:
    """Counts of what was proven: entries checked bit for bit per artifact, and by other means."""

    entries: int
    exact: Mapping[str, int]
    transformed: Mapping[str, int]
    not_stored: Mapping[str, int]


def verify_manifest(
    manifest: WeightManifest, out_dir: pathlib.Path, holder: Mapping[str, torch.Tensor] | None
) -> WeightCheck:
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
    stores: dict = {}
    for target, info in manifest.artifacts.items():
        path = out_dir / info["file"]
        stores[target] = read_onnx(path) if target == "onnx" else read_pte(path)
    exact: dict[str, int] = {t: 0 for t in stores}
    transformed: dict[str, int] = {t: 0 for t in stores}
    not_stored: dict[str, int] = {t: 0 for t in stores}
    for e in manifest.entries:
        for target, loc in e.locations.items():
            if target not in stores:
                continue
            store = stores[target]
            if loc.status in FAILING_STATUSES:
                problems.append(f"{target}: weight {e.name!r} is {loc.status}: {loc.reason}")
                continue
            if loc.status == "not_stored":
                not_stored[target] += 1
                continue
            kind, _, ref = (loc.where or "").partition(":")
            ok = False
            if target == "onnx":
                init = ref.split("@")[0]
                expected = loc.stored_sha256 if loc.status == "transformed" else e.sha256
                ok = store.sha256.get(init) == expected
                if ok and loc.status == "transformed" and holder is not None and e.name in holder:
                    ok = permuted_sha256(holder[e.name], tuple(loc.permutation or ())) == expected
            elif kind == "named_data":
                expected = loc.stored_sha256 if loc.status == "transformed" else e.sha256
                ok = ref == expected and store.named_ok(ref)
                if ok and loc.status == "transformed" and holder is not None and e.name in holder:
                    ok = permuted_sha256(holder[e.name], tuple(loc.permutation or ())) == ref
            elif kind == "delegate_payload":
                off = int(ref)
                ok = hashlib.sha256(store.raw[off : off + e.nbytes]).hexdigest() == e.sha256
            elif kind == "constant_buffer":
                ok = store.constant_sha(int(ref), e.nbytes) == e.sha256
            if not ok:
                problems.append(
                    f"{target}: weight {e.name!r} differs on disk from the manifest "
                    f"({loc.where} in {manifest.artifacts[target]['file']})"
                )
            elif loc.status == "transformed":
                transformed[target] += 1
            else:
                exact[target] += 1
    if problems:
        raise WeightMismatchError(
            f"{len(problems)} weight problem(s):\n  " + "\n  ".join(problems),
            problems=tuple(problems),
            hint="re-export from the current model; never edit artifacts by hand",
        )
    return WeightCheck(len(manifest.entries), exact, transformed, not_stored)
