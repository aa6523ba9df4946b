"""Child process of the kill test: export, but stop inside one phase and wait to be killed.

Usage: python helpers_kill.py OUT NAME SEED PHASE MARKER [FEATURES]
(with FEATURES, the export runs through the CLI with ``helpers_reliability:tiny<FEATURES>``)
When the export reaches PHASE it writes MARKER (outside OUT) and sleeps; the parent then sends
SIGKILL. ``interrupt-<target>`` writes MARKER when that target's lowering starts and goes on
working (the parent sends SIGINT there). Patching library seams here is fine: this script is the test's own process.
"""

from __future__ import annotations

import logging
import pathlib
import sys
import time
import warnings

warnings.filterwarnings("ignore")
logging.disable(logging.CRITICAL)

sys.path.insert(0, str(pathlib.Path(__file__).parent))


def _watch_sigint_handler() -> None:
    """Report on stderr each change of the C-level SIGINT handler (a library's ``sigaction``
    replaces Python's without ``signal.getsignal`` knowing): the Ctrl-C test shows it when a
    SIGINT went unanswered."""
    import ctypes
    import threading

    libc = ctypes.CDLL(None, use_errno=True)
    buf = ctypes.create_string_buffer(256)  # struct sigaction; its first field is the handler

    def current() -> int:
        libc.sigaction(2, None, buf)
        return int.from_bytes(buf.raw[:8], "little")

    def run() -> None:
        seen = current()
        sys.stderr.write(f"sigint handler at start: {seen:#x}\n")
        while True:
            now = current()
            if now != seen:
                sys.stderr.write(f"sigint handler changed: {seen:#x} -> {now:#x}\n")
                seen = now
            time.sleep(0.01)

    threading.Thread(target=run, daemon=True).start()


def main() -> None:
    out, name, seed, phase, marker = sys.argv[1:6]
    if phase.startswith("interrupt-"):
        _watch_sigint_handler()
    features = sys.argv[6] if len(sys.argv) > 6 else ""
    marker_path = pathlib.Path(marker)

    def park() -> None:
        marker_path.write_text(phase)
        time.sleep(120)

    import torch

    import dualexport as dx
    from dualexport.exporters.onnx import OnnxExporter
    from dualexport.exporters.xnnpack import XnnpackExporter
    from dualexport.outputs import commit
    from helpers_reliability import tiny

    model, args = tiny(int(seed), features=int(features)) if features else tiny(int(seed))
    transforms = []
    if phase == "capture":
        forward = model.forward

        def slow_forward(x: torch.Tensor) -> torch.Tensor:
            park()
            return forward(x)

        model.forward = slow_forward  # torch.export runs forward while tracing
    elif phase == "transform":
        transforms = [lambda gm: park()]
    elif phase == "onnx":  # the .onnx is written into staging, not yet committed
        orig_onnx = OnnxExporter.lower

        def lower_onnx(self, *a, **k):
            lowered = orig_onnx(self, *a, **k)
            park()
            return lowered

        OnnxExporter.lower = lower_onnx
    elif phase == "xnnpack":  # the ONNX target is done
        orig_xnn = XnnpackExporter.lower

        def lower_xnn(self, *a, **k):
            park()
            return orig_xnn(self, *a, **k)

        XnnpackExporter.lower = lower_xnn
    elif phase.startswith("interrupt-"):  # real work goes on: the marker says where it is
        which = phase.removeprefix("interrupt-")
        cls = {"onnx": OnnxExporter, "xnnpack": XnnpackExporter}[which]
        orig = cls.lower

        def lower_marked(self, *a, **k):
            marker_path.write_text(phase)
            return orig(self, *a, **k)

        cls.lower = lower_marked
    elif phase == "manifest":  # both targets are done, the manifest is next
        import dualexport.pipeline.manifest as manifest

        orig_build = manifest.build_entries

        def build_entries(*a, **k):
            park()
            return orig_build(*a, **k)

        manifest.build_entries = build_entries
    elif phase == "commit":  # between two renames of the set commit
        orig_move = commit._move
        moved = []

        def move(src, dst):
            orig_move(src, dst)
            moved.append(dst)
            if len(moved) == 2:
                park()

        commit._move = move
    if features:  # through the CLI, as a user runs it (its own exit path included)
        from dualexport.cli import run

        sys.argv = ["dualexport", "export", f"helpers_reliability:tiny{features}", "--input"]
        sys.argv += [f"2x{features}:float32", "--out", out, "--name", name]
        run()
    # cache=False: the previous set holds the same graph with other weights, which would be
    # patched, never reaching the lowering phases this test parks in.
    dx.export(model, args, out_dir=out, name=name, transforms=transforms, cache=False)
    marker_path.write_text("finished")


if __name__ == "__main__":
    main()
