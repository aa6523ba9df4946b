"""Passes over an ExportedProgram that say what they are, in the style of onnx-ir's passes.

Why declare: a pass that serves one target must run on that target's decomposed program and
leave the shared program alone (invariant 4), and a pass that says it returns a new program must
not have edited its input on the way. Each pass declares the program it serves (``serves``:
``"shared"``, ``"onnx"`` or ``"xnnpack"``) and whether it edits its input (``in_place``); the base
class checks the second after every call and raises ``PassContractError`` when it is broken.

It also checks that the program it returns is still a valid program where passes most often
break it: the signature's output names against the graph's output node (cheap, always). Under
``DUALEXPORT_CHECK_PASSES=1`` (the tests set it) a pass that leaves them apart is an error that
names the pass; in production the names are repaired from the output node and a warning logged,
so a user's export does not die on our bookkeeping.
"""

from __future__ import annotations

import abc
import logging
import os
import time
from dataclasses import dataclass
from typing import ClassVar

from torch.export import ExportedProgram

from ...errors import InternalError
from ..fingerprint import graph_digest
from .signature import output_signature_problems, sync_output_signature

__all__ = ["ProgramPass", "PassResult", "PassRecord", "PassContractError", "SERVES"]

SERVES = ("shared", "onnx", "xnnpack")

logger = logging.getLogger(__name__)
#: set to "1" to turn a pass that leaves the program invalid into an error (the tests do)
CHECK_ENV = "DUALEXPORT_CHECK_PASSES"


class PassContractError(InternalError):
    """A pass broke what it declared (edited its input while declaring it would not, or
    returned another program while declaring it edits in place)."""


@dataclass(frozen=True)
class PassResult:
    program: ExportedProgram
    modified: bool


@dataclass(frozen=True)
class PassRecord:
    """One pass as it ran: its name, the program it serves, whether it changed anything."""

    name: str
    serves: str
    modified: bool
    seconds: float


class ProgramPass(abc.ABC):
    """A pass: ``call`` does the work; ``__call__`` checks the declaration around it."""

    #: the program the pass serves: "shared" (both targets), "onnx" or "xnnpack"
    serves: ClassVar[str]
    #: True: edits the given program and returns it; False: returns a new program (or, with
    #: nothing to do, the given one) and leaves the given one as it was
    in_place: ClassVar[bool]

    @property
    def name(self) -> str:
        return type(self).__name__

    @abc.abstractmethod
    def call(self, program: ExportedProgram) -> ExportedProgram: ...

    def __call__(self, program: ExportedProgram) -> PassResult:
        before = graph_digest(program)
        out = self.call(program)
        if self.in_place and out is not program:
            raise PassContractError(f"pass {self.name} declares in_place but returned another program")
        if not self.in_place and graph_digest(program) != before:
            raise PassContractError(
                f"pass {self.name} declares it returns a new program but edited its input"
            )
        problems = output_signature_problems(out)
        if problems:
            if os.environ.get(CHECK_ENV) == "1":
                raise PassContractError(
                    f"pass {self.name} left the output signature apart from the graph: {'; '.join(problems)}"
                )
            logger.warning("pass %s: %s (repaired from the output node)", self.name, "; ".join(problems))
            sync_output_signature(out)
        return PassResult(out, graph_digest(out) != before)

    def run(self, program: ExportedProgram) -> tuple[ExportedProgram, PassRecord]:
        """The pass and its record."""
        start = time.perf_counter()
        result = self(program)
        return result.program, PassRecord(
            self.name, self.serves, result.modified, time.perf_counter() - start
        )
