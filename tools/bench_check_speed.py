"""Wall time of `spectool check` (the pre-commit path) on one SGLang tree, whole process.

    python tools/bench_check_speed.py DIR [runs]

Goal: under 2 s on the 2-core development machine. On an applied, unchanged tree check
answers from apply's read-back (spectool/readback.py) and parses nothing; elsewhere only the
files recipes name are parsed. The load average is printed with the times: a busy machine
measures slower.
"""

import os
import statistics
import subprocess
import sys
import time

d = sys.argv[1]
runs = int(sys.argv[2]) if len(sys.argv) > 2 else 5
times = []
for _ in range(runs):
    t = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "spectool.cli", "check", "--sglang-dir", d], capture_output=True)
    times.append(time.perf_counter() - t)
print(
    f"spectool check on {d}: median {statistics.median(times):.2f} s, min {min(times):.2f} s, "
    f"max {max(times):.2f} s over {runs} runs (exit {r.returncode}); "
    f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs"
)
