"""The `kvoffload` console script of an installed wheel: runs the program shipped in the package
(kvoffload/bin/kvoffload, next to the library it links)."""

import os
import sys
from pathlib import Path


def main() -> None:
    program = Path(__file__).resolve().parent / "bin" / "kvoffload"
    if not program.is_file():
        sys.exit(f"kvoffload: {program} is not there; this kvoffload package was installed without "
                 "the program (install it with `pip install .` from the source tree, or use the "
                 "kvoffload of a CMake install)")
    os.execv(program, [str(program), *sys.argv[1:]])


if __name__ == "__main__":
    main()
