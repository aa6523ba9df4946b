"""Imported once by the local engine's fork server (not by ``import dualexport``): the stack
every entry needs, so that each forked child starts without paying for the imports."""

from __future__ import annotations

import executorch.exir  # noqa: F401
import onnx  # noqa: F401
import onnxruntime  # noqa: F401
import onnxscript  # noqa: F401
import torch  # noqa: F401
from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner  # noqa: F401
from executorch.extension.pybindings import portable_lib  # noqa: F401

from .. import api  # noqa: F401
from ..reporting import write_export_page  # noqa: F401
from . import worker  # noqa: F401
