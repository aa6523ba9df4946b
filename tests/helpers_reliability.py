"""Shared pieces of the reliability tests: tiny models, folder snapshots, and the check that a
folder holds one complete, self-consistent artifact set."""

from __future__ import annotations

import hashlib
import pathlib

import torch
from torch import nn

from dualexport.outputs.atomic import STAGING_PREFIX


class Tiny(nn.Module):
    """Linear + ReLU: the smallest model that has weights both targets store."""

    def __init__(self, features: int = 4, out: int = 3) -> None:
        super().__init__()
        self.fc = nn.Linear(features, out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.fc(x))


def tiny(seed: int, features: int = 4) -> tuple[Tiny, tuple[torch.Tensor]]:
    """A model and example input that differ per seed, so two exports are told apart on disk."""
    g = torch.Generator().manual_seed(seed)
    m = Tiny(features)
    with torch.no_grad():
        m.fc.weight.copy_(torch.randn(m.fc.weight.shape, generator=g))
        m.fc.bias.copy_(torch.randn(m.fc.bias.shape, generator=g))
    return m.eval(), (torch.randn(2, features, generator=g),)


def tiny512() -> Tiny:
    """A factory for the CLI (``helpers_reliability:tiny512``)."""
    return tiny(2, features=512)[0]


def weight_sha(model: nn.Module, name: str = "fc.weight") -> str:
    t = dict(model.state_dict())[name].detach().contiguous()
    return hashlib.sha256(t.numpy().tobytes()).hexdigest()


def snapshot(root: pathlib.Path, *, exclude: pathlib.Path | None = None) -> dict[str, tuple[int, str]]:
    """Relative path -> (size, sha256) of every file under ``root`` (except ``exclude``)."""
    out: dict[str, tuple[int, str]] = {}
    for p in sorted(root.rglob("*")):
        if exclude is not None and (p == exclude or exclude in p.parents):
            continue
        if p.is_file() and not p.is_symlink():
            data = p.read_bytes()
            out[str(p.relative_to(root))] = (len(data), hashlib.sha256(data).hexdigest())
        elif p.is_dir() or p.is_symlink():
            out[str(p.relative_to(root))] = (-1, "dir-or-link")
    return out


def visible(out: pathlib.Path) -> dict[str, tuple[int, str]]:
    """The artifacts a user sees (hidden bookkeeping files are left out)."""
    if not out.exists():
        return {}
    return {k: v for k, v in snapshot(out).items() if not k.startswith(".")}


def leftovers(out: pathlib.Path) -> list[str]:
    """Partial files: temp files, staging folders, an unfinished commit journal."""
    if not out.exists():
        return []
    return sorted(
        p.name
        for p in out.iterdir()
        if p.name.startswith(STAGING_PREFIX) or p.name.endswith(".tmp") or p.name.endswith(".commit.json")
    )


def assert_complete_set(out: pathlib.Path, name: str, targets: tuple[str, ...] = ("onnx", "xnnpack")) -> str:
    """Every visible file of ``name`` belongs to one export, and that export is whole.

    Returns the manifest's sha256 of ``fc.weight``, which says which export it was. The reference
    .pt2, the manifest and each artifact are cross-checked by verify_manifest (the .pt2's weights
    must match the manifest, and so must the bytes in every artifact), so a mix of two exports
    fails here.
    """
    from dualexport.parity.folder import load_manifest, load_program
    from dualexport.parity.inputs import load_inputs
    from dualexport.weights import verify_manifest
    from dualexport.weights.locate import holder_tensors

    manifest = load_manifest(out, name)
    assert sorted(manifest.artifacts) == sorted(targets), manifest.artifacts
    expected = {f"{name}.weights.json", f"{name}.pt2", f"{name}.inputs.npz"}
    for t, info in manifest.artifacts.items():
        expected.update(info["files"])
        if t == "xnnpack":
            expected.update({f"{name}.delegation.json", f"{name}.delegation.md"})
    seen = {k for k in visible(out) if k.startswith(name + ".")}
    assert seen == expected, f"stale or missing files: {sorted(seen ^ expected)}"
    verify_manifest(manifest, out, holder_tensors(load_program(out / f"{name}.pt2")))
    assert load_inputs(out / f"{name}.inputs.npz")
    return next(e.sha256 for e in manifest.entries if e.name == "fc.weight")
