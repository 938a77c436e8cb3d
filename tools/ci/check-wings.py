#!/usr/bin/env python3
"""Every wing of the library includes only what docs/DESIGN.md §2.2 allows it: the public headers of
the wings it lists, its own internal headers, and the internal headers of the low wings it lists
(util/, sys/, live/ exist to be shared). An internal include names its wing's path
("region/header.hpp", never a bare "header.hpp"). Reads sources only (no build).

    tools/ci/check-wings.py [SOURCE_DIR]

Fails naming each file, the include and what its wing may include. The table below is §2.2's:
change both together.
"""
import os
import re
import sys

# wing: (directories under core/src, public headers it owns, wings it may include)
BASE = "base"
WINGS = {
    BASE: (["util"], ["error.hpp", "error_codes.h", "export.h", "version.hpp"], []),
    "sys": (["sys"], [], [BASE]),
    "live": (["live"], ["live_page.hpp"], [BASE]),
    "key": (["key"], ["block_key.hpp", "hash.hpp"], [BASE]),
    "region": (["region"], ["region.hpp", "geometry.hpp", "platform.hpp", "live_stats.hpp"],
               [BASE, "sys", "live", "key"]),
    "runtime": (["runtime"], ["device_runtime.hpp"], [BASE, "kernels"]),
    "transfer": (["transfer"], ["transfer_engine.hpp", "kv_layout.hpp"],
                 [BASE, "live", "region", "runtime"]),
    "manager": (["manager"],
                ["manager.hpp", "eviction_policy.hpp", "policy_kinds.h", "stats_fields.h"],
                [BASE, "key", "live"]),
    "pool": (["pool"], ["node_pool.hpp"], [BASE, "key", "region", "manager"]),
    "tier": (["tier"], ["tier.hpp", "tiered_store.hpp", "file_tier.hpp", "remote_tier.hpp",
                        "remote_url.hpp"], [BASE, "sys", "live", "key", "region", "manager"]),
    "stack": (["stack"], ["offload_stack.hpp"],
              [BASE, "sys", "live", "key", "region", "runtime", "transfer", "manager", "pool",
               "tier"]),
    "capi": (["capi"], ["kvoffload.h"],
             [BASE, "sys", "live", "key", "region", "runtime", "transfer", "manager", "pool",
              "tier", "stack"]),
}
# Shared internals: the wings whose core/src headers another wing may include (when it lists them).
LOW = {BASE, "sys", "live"}
# Not wings, but named by an include: the batch copy kernel's source (kernels/, on runtime/sim's
# include path: the simulator compiles it for the host).
OTHER = {"kernels"}

INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]')


def wing_of_dir(d):
    for wing, (dirs, _, _) in WINGS.items():
        if d in dirs:
            return wing
    return None


def public_owner(header):
    for wing, (_, headers, _) in WINGS.items():
        if header in headers:
            return wing
    return None


def check_file(root, path, rel, wing, problems):
    allowed = set(WINGS[wing][2]) | {wing}
    with open(path, encoding="utf-8", errors="replace") as f:
        for lineno, line in enumerate(f, 1):
            m = INCLUDE.match(line)
            if not m:
                continue
            kind, name = m.groups()
            where = f"{rel}:{lineno}: {wing} includes {kind}{name}{'>' if kind == '<' else kind}"
            if kind == "<":
                if not name.startswith("kvoffload/"):
                    continue  # system and third-party headers
                header = name[len("kvoffload/"):]
                owner = public_owner(header)
                if owner is None:
                    problems.append(f"{where}: no wing owns kvoffload/{header} (add it to the table "
                                    f"here and in docs/DESIGN.md §2.1)")
                elif owner not in allowed:
                    problems.append(f"{where}, a public header of {owner}; {wing} may include "
                                    f"{', '.join(sorted(allowed))}")
                continue
            first = name.split("/", 1)[0] if "/" in name else None
            if first is None and os.path.isfile(os.path.join(root, "kernels", name)):
                first = "kernels"
                name = f"kernels/{name}"
            if first is None:
                problems.append(f"{where}: name an internal header with its wing's path "
                                f"(\"{os.path.dirname(rel).removeprefix('core/src/') or '.'}/{name}\")")
                continue
            target = first if first in OTHER else wing_of_dir(first)
            if target is None:
                problems.append(f"{where}: {first}/ is no wing of core/src")
            elif target in OTHER:
                if target not in allowed:
                    problems.append(f"{where}: {wing} may not include {target}/")
            elif target != wing and (target not in allowed or target not in LOW):
                why = ("internal headers of a wing are its own" if target not in LOW else
                       f"{wing} does not list {target}")
                problems.append(f"{where}, an internal header of {target} ({why}); {wing} may "
                                f"include the public headers of {', '.join(sorted(allowed))} and "
                                f"the internal ones of {', '.join(sorted(allowed & LOW))}")


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else
                           os.path.join(os.path.dirname(__file__), "..", ".."))
    problems = []
    checked = 0
    src = os.path.join(root, "core", "src")
    for dirpath, _, files in sorted(os.walk(src)):
        relparts = os.path.relpath(dirpath, src).split(os.sep)
        for fname in sorted(files):
            if not fname.endswith((".cpp", ".hpp", ".h", ".cu")):
                continue
            path = os.path.join(dirpath, fname)
            rel = os.path.relpath(path, root)
            wing = BASE if relparts == ["."] else wing_of_dir(relparts[0])
            if wing is None:
                problems.append(f"{rel}: core/src/{relparts[0]}/ is no wing: add it to the table "
                                f"here and in docs/DESIGN.md §2.1")
                continue
            check_file(root, path, rel, wing, problems)
            checked += 1
    inc = os.path.join(root, "core", "include", "kvoffload")
    for fname in sorted(os.listdir(inc)):
        path = os.path.join(inc, fname)
        if not os.path.isfile(path):
            continue
        rel = os.path.relpath(path, root)
        header = fname.removesuffix(".in")
        wing = public_owner(header)
        if wing is None:
            problems.append(f"{rel}: no wing owns this public header (add it to the table here and "
                            f"in docs/DESIGN.md §2.1)")
            continue
        check_file(root, path, rel, wing, problems)
        checked += 1
    for p in problems:
        print(f"check-wings: {p}")
    print(f"check-wings: {checked} files, {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
