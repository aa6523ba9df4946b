"""Fleet export: a manifest of models exported to both targets, on this machine (a child process
per entry, admitted by memory) or on a Ray cluster, with one record and one page for the run."""

from __future__ import annotations

from .batch import BATCH_HTML, BATCH_JSON, ENGINES, batch
from .diff import diff_batches, load_batch
from .estimate import Estimate, estimate_entry
from .manifest import Entry, Malformed, Manifest, parse_manifest, read_manifest
from .memory import TreeSampler, tree_pss_mb
from .progress import BatchEvent, ProgressCallback
from .record import BATCH_SCHEMA, STATUSES, BatchRecord, EntryRecord, FileRecord, ParitySummary, TargetRecord

__all__ = [
    # run a zoo
    "batch",
    "ENGINES",
    "BATCH_JSON",
    "BATCH_HTML",
    # the manifest
    "Entry",
    "Malformed",
    "Manifest",
    "read_manifest",
    "parse_manifest",
    # memory admission
    "Estimate",
    "estimate_entry",
    "tree_pss_mb",
    "TreeSampler",
    # progress
    "BatchEvent",
    "ProgressCallback",
    # records and their difference
    "BatchRecord",
    "EntryRecord",
    "TargetRecord",
    "FileRecord",
    "ParitySummary",
    "BATCH_SCHEMA",
    "STATUSES",
    "diff_batches",
    "load_batch",
]
