"""``make bench``: run every benchmark script in this folder, one after another."""

from __future__ import annotations

import pathlib
import subprocess
import sys

for script in sorted(pathlib.Path(__file__).parent.glob("bench_*.py")):
    print(f"== {script.name}", flush=True)
    subprocess.run([sys.executable, str(script)], check=True)
