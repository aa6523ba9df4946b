"""Input tensors saved beside the artifacts (``<name>.inputs.npz``), loaded without pickle."""

from __future__ import annotations

import pathlib

import numpy as np
import torch

from ..errors import ArtifactIOError

__all__ = ["save_inputs", "load_inputs"]

_VIEW = {torch.bfloat16: (torch.int16, "bfloat16")}


def save_inputs(path: pathlib.Path, tensors: list[torch.Tensor]) -> None:
    """Write flat input tensors as .npz (bfloat16 stored as its int16 bits, dtype name kept)."""
    from ..outputs.atomic import atomic_write_bytes
    import io

    arrays: dict[str, np.ndarray] = {}
    dtypes = []
    for i, t in enumerate(tensors):
        t = t.detach().cpu().contiguous()
        if t.dtype in _VIEW:
            view, name = _VIEW[t.dtype]
            arrays[f"t{i}"] = t.view(view).numpy()
            dtypes.append(name)
        else:
            arrays[f"t{i}"] = t.numpy()
            dtypes.append(str(t.dtype).replace("torch.", ""))
    arrays["dtypes"] = np.array(dtypes, dtype="U16")
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    atomic_write_bytes(path, buf.getvalue())


def load_inputs(path: pathlib.Path) -> list[torch.Tensor]:
    try:
        with np.load(path, allow_pickle=False) as data:
            dtypes = [str(d) for d in data["dtypes"]]
            out = []
            for i, name in enumerate(dtypes):
                arr = torch.from_numpy(np.array(data[f"t{i}"]))
                out.append(arr.view(torch.bfloat16) if name == "bfloat16" else arr)
    except (OSError, KeyError, ValueError) as exc:
        raise ArtifactIOError(f"cannot read inputs from {path.name}: {exc}",
                              hint="re-export, or pass inputs explicitly") from exc
    return out
