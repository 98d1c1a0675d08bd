"""Run the benchmark suite behind docs/benchmarks.md.

    python benchmarks/bench.py --write docs/benchmarks.md --plot docs/img/hit_ratio.png

Arguments are those of ``contextpilot-rag bench``; install the reference implementation
first (``make bench`` does) to include its arm.
"""

import sys

from contextpilot_rag.cli import main

if __name__ == "__main__":
    raise SystemExit(main(["bench", *sys.argv[1:]]))
