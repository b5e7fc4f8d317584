#!/usr/bin/env python3
"""Checks that no library file grows past 800 lines: `scripts/file-sizes.py [DIR]` (DIR: a
checkout, by default this one).

Reads the Rust files of `crates/*/src` and the Python files of the package
(`crates/jaccl-py/python`). A file past 800 lines does several jobs, which the next engineer
has to take apart. Exempt: the RDMA verbs declarations (`verbs.rs`: one file of foreign
declarations, long by nature). Exits 1 naming every file over the limit, else prints the
largest and exits 0.
"""

import pathlib
import sys

ROOT = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).parent.parent).resolve()

LIMIT = 800
EXEMPT = {"crates/jaccl/src/transport/rdma/verbs.rs"}


def main() -> int:
    files = sorted(ROOT.glob("crates/*/src/**/*.rs")) + sorted(ROOT.glob("crates/jaccl-py/python/**/*.py"))
    sizes = {str(f.relative_to(ROOT)): len(f.read_text().splitlines()) for f in files}
    over = [f"{name}: {lines} lines" for name, lines in sizes.items() if name not in EXEMPT and lines > LIMIT]
    if over:
        print(f"files past their limit ({LIMIT} lines; split by concern):", *over, sep="\n  ")
        return 1
    largest = max((n for n in sizes if n not in EXEMPT), key=sizes.get)
    print(f"{len(sizes)} library files within {LIMIT} lines (the largest: {largest}, {sizes[largest]})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
