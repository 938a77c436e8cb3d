#!/usr/bin/env python3
"""Why the gpu-labelled suites skip on this machine (issue 25, item 1).

Runs each suite, reads GoogleTest's output case by case and fails unless every case of a GPU
backend either ran or skipped for a reason that is the machine's, never the build's:

- a backend this build made (--built) skips only as "[no-gpu]" naming a missing driver or
  device; "does not include it" or a module that cannot be loaded is a failure (on a GPU host
  such a run would be green without testing anything);
- a backend this build did not make skips as "[no-gpu]" "does not include it" (or, when a
  module is found anyway, for a missing driver or device);
- the suite itself exits 0 (a built module that does not load fails its cases) and has at least
  one case of each backend.

    check_gpu_skips.py --built cuda,hip SUITE...    # --built '' for a build without either
"""
import argparse
import re
import subprocess
import sys

# The loader's words (core/src/runtime/gpu/backend_modules.cpp) for a machine without a usable
# driver or device, which a built backend may skip for; and for a module it could not use.
DRIVER_OR_DEVICE = ("no driver is installed", "the installed driver supports", "no usable device",
                    "no device visible", "unusable: ")
MODULE_FAULT = ("does not include", "module could not be loaded", "exports no",
                "implements vendor table version")
START = re.compile(r"^\[ RUN      \] (\S+)")
END = re.compile(r"^\[ +(OK|SKIPPED|FAILED) +\] (\S+)")


def cases(output):
    """(name, verdict, text between RUN and the verdict) for each case."""
    name, lines = None, []
    for line in output.splitlines():
        if m := START.match(line):
            name, lines = m.group(1), []
        elif (m := END.match(line)) and name is not None and m.group(2) == name:
            yield name, m.group(1), "\n".join(lines)
            name = None
        elif name is not None:
            lines.append(line)


def check(suite, built, problems):
    run = subprocess.run([suite, "--gtest_color=no"], capture_output=True, text=True, timeout=600,
                         check=False)
    out = run.stdout + run.stderr
    if run.returncode != 0:
        problems.append(f"{suite} exited {run.returncode}:\n{out[-3000:]}")
    seen = {"cuda": 0, "hip": 0}
    for name, verdict, text in cases(out):
        backend = name.rsplit("/", 1)[-1]
        if backend not in seen:
            continue
        seen[backend] += 1
        if verdict != "SKIPPED":
            continue
        where = f"{suite}: {name} skipped"
        if "[no-gpu]" not in text:
            problems.append(f"{where} without the [no-gpu] tag: {text.strip()}")
        elif backend in built:
            if any(p in text for p in MODULE_FAULT) or not any(p in text for p in DRIVER_OR_DEVICE):
                problems.append(f"{where}, but {backend} was built: the reason must be a missing "
                                f"driver or device, not the module: {text.strip()}")
        elif "does not include" not in text and not any(p in text for p in DRIVER_OR_DEVICE):
            # Not built here, but a module may still be found (one installed on the linker's
            # path): then its driver or device is what is missing.
            problems.append(f"{where} and {backend} was not built, yet the reason is neither "
                            f"'does not include it' nor a missing driver or device: {text.strip()}")
    for backend, n in seen.items():
        if n == 0:
            problems.append(f"{suite}: no case of the {backend} backend ran or skipped")
    return seen


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--built", default="", help="the backends this build made, comma-separated")
    parser.add_argument("suites", nargs="+")
    args = parser.parse_args()
    built = {b for b in args.built.split(",") if b}
    problems = []
    for suite in args.suites:
        seen = check(suite, built, problems)
        print(f"{suite}: {seen['cuda']} cuda and {seen['hip']} hip cases (built: "
              f"{', '.join(sorted(built)) or 'neither'})")
    for p in problems:
        print("FAIL:", p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
