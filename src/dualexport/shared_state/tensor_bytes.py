"""Bytes and digests of tensors, without copying them where the layout allows.

Why one place: the fingerprint, the manifest and the artifact readers must hash exactly the same
bytes (row-major, native little-endian, the tensor's own dtype), or a bit-exact check turns into a
false alarm.
"""

from __future__ import annotations

import hashlib

import torch

__all__ = ["tensor_bytes", "tensor_sha256", "storage_key"]


def tensor_bytes(tensor: torch.Tensor) -> memoryview:
    """The tensor's elements as contiguous bytes (a view when it is already contiguous)."""
    t = tensor.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    if not t.is_contiguous():
        t = t.contiguous()
    if t.numel() == 0:
        return memoryview(b"")
    flat = t.reshape(-1)
    if flat.dtype == torch.bool:
        flat = flat.view(torch.uint8)
    u8 = flat.view(torch.uint8)
    return u8.numpy().data.cast("B")


def tensor_sha256(tensor: torch.Tensor) -> str:
    """sha256 hex digest of :func:`tensor_bytes`; the key XNNPACK uses for its named data."""
    return hashlib.sha256(tensor_bytes(tensor)).hexdigest()


def storage_key(tensor: torch.Tensor) -> tuple[int, int, tuple[int, ...], tuple[int, ...], str]:
    """Identity of the memory a tensor shows: two names with the same key are one (tied) weight."""
    t = tensor.detach()
    return (
        t.untyped_storage().data_ptr() if t.numel() else id(t),
        int(t.storage_offset()),
        tuple(t.shape),
        tuple(t.stride()),
        str(t.dtype),
    )
