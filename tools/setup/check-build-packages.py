#!/usr/bin/env python3
"""Fails when a build used a file from a Debian package that tools/setup/install-deps.sh does not
install, so a package installed by hand can never again make CI green where a fresh machine fails.

    tools/setup/check-build-packages.py [--without PKG]... BUILD_DIR [BUILD_DIR...]

--without PKG checks as if install-deps did not list PKG: how its own test
(check_build_packages_fails_without_spdlog) shows that it fails when a package is missing.

What a build used comes from the build's own dependency records: every header of every object
(`ninja -t deps`, and the depfiles a Makefile build or a custom command such as hipcc leaves),
the compilers (compile_commands.json), what CMake found (CMakeCache.txt paths: packages' config
files, libraries, programs) and the libraries each link names (build.ninja / link.txt). Each file
is looked up in dpkg's database (what `dpkg -S` reads). Allowed: the packages install-deps lists
(read from the script itself: install-deps.sh --list), everything they pull in (Depends and
Pre-Depends of the installed versions, the way apt --no-install-recommends resolves them), and
what every Debian system has (Essential or Priority required). Files of no package are allowed
only in the source tree, the build directories and a CUDA toolkit (/usr/local/cuda*, which is
not a Debian package); anything else (a pip or hand-copied install under /usr/local, /opt) fails
too.
"""
import glob
import json
import os
import re
import shlex
import subprocess
import sys
import time

ROOT = os.path.realpath(os.path.join(os.path.dirname(__file__), "..", ".."))


def install_deps_list():
    out = subprocess.run([os.path.join(ROOT, "tools", "setup", "install-deps.sh"), "--list"],
                         check=True, capture_output=True, text=True).stdout
    return [p for p in out.split() if p]


def installed_packages():
    """name -> (priority, essential, [dependency groups], [provides])."""
    fmt = "${Package}\t${db:Status-Abbrev}\t${Priority}\t${Essential}\t${Pre-Depends}\t${Depends}\t${Provides}\n"
    out = subprocess.run(["dpkg-query", "-W", "-f", fmt], check=True, capture_output=True,
                         text=True).stdout
    pkgs = {}
    for line in out.splitlines():
        name, status, priority, essential, pre, dep, provides = (line.split("\t") + [""] * 7)[:7]
        if not status.startswith("ii"):
            continue
        groups = []
        for field in (pre, dep):
            for group in field.split(","):
                alts = [re.sub(r"[\s(].*$", "", a.strip()).split(":")[0] for a in group.split("|")]
                alts = [a for a in alts if a]
                if alts:
                    groups.append(alts)
        prov = [re.sub(r"[\s(].*$", "", p.strip()).split(":")[0] for p in provides.split(",")]
        pkgs[name] = (priority, essential == "yes", groups, [p for p in prov if p])
    return pkgs


def allowed_packages(wanted, pkgs):
    providers = {}
    for name, (_, _, _, prov) in pkgs.items():
        for p in prov:
            providers.setdefault(p, []).append(name)
    base = {n for n, (prio, ess, _, _) in pkgs.items() if ess or prio == "required"}
    todo = [p for p in wanted if p in pkgs] + sorted(base)
    seen = set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for alts in pkgs[name][2]:
            for a in alts:  # every installed alternative: apt may have chosen any of them
                for target in ([a] if a in pkgs else []) + providers.get(a, []):
                    if target not in seen:
                        todo.append(target)
    return seen, base


def dpkg_owners():
    """path -> package, from dpkg's file lists (the database `dpkg -S` reads)."""
    owners = {}
    for lst in glob.glob("/var/lib/dpkg/info/*.list"):
        pkg = os.path.basename(lst)[:-5].split(":")[0]
        with open(lst, encoding="utf-8", errors="replace") as f:
            for line in f:
                path = line.rstrip("\n")
                if path and path not in owners:
                    owners[path] = pkg
    return owners


def parse_depfile(text):
    text = text.replace("\\\n", " ")
    files = []
    for line in text.splitlines():
        if ":" not in line:
            continue
        _, deps = line.split(":", 1) if not re.match(r"^[A-Za-z]:", line) else ("", line)
        files.extend(t.replace("\\ ", " ") for t in re.split(r"(?<!\\)\s+", deps.strip()) if t)
    return files


def used_files(build):
    """(file, how) pairs the build read, absolute where possible."""
    used = []
    if os.path.exists(os.path.join(build, "build.ninja")):
        out = subprocess.run(["ninja", "-C", build, "-t", "deps"], capture_output=True, text=True).stdout
        for line in out.splitlines():
            if line.startswith("    "):
                used.append((line.strip(), "headers (ninja -t deps)"))
        with open(os.path.join(build, "build.ninja"), encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.lstrip().startswith(("LINK_LIBRARIES", "LINK_PATH")):
                    for tok in shlex.split(line.split("=", 1)[1]):
                        tok = tok[2:] if tok.startswith("-L") else tok
                        if tok.startswith("/"):
                            used.append((tok, "linked (build.ninja)"))
    for dep in glob.glob(os.path.join(build, "**", "*.d"), recursive=True):
        try:
            with open(dep, encoding="utf-8", errors="replace") as f:
                for path in parse_depfile(f.read()):
                    used.append((path, "headers (" + os.path.relpath(dep, build) + ")"))
        except OSError:
            pass
    for link in glob.glob(os.path.join(build, "**", "link.txt"), recursive=True):
        with open(link, encoding="utf-8", errors="replace") as f:
            for tok in shlex.split(f.read()):
                if tok.startswith("/") and re.search(r"\.(so|a)(\.[0-9.]+)?$", tok):
                    used.append((tok, "linked (link.txt)"))
    cc = os.path.join(build, "compile_commands.json")
    if os.path.exists(cc):
        with open(cc, encoding="utf-8") as f:
            for entry in json.load(f):
                args = entry.get("arguments") or shlex.split(entry.get("command", ""))
                for tok in args[:2]:  # a launcher (ccache) may come first
                    if os.path.basename(tok) == "ccache":
                        continue
                    path = tok if os.path.isabs(tok) else shutil_which(tok)
                    if path:
                        used.append((path, "compiler (compile_commands.json)"))
                    break
    cache = os.path.join(build, "CMakeCache.txt")
    if os.path.exists(cache):
        with open(cache, encoding="utf-8", errors="replace") as f:
            for line in f:
                m = re.match(r"^([A-Za-z0-9_.+-]+):(FILEPATH|PATH|STRING|INTERNAL)=(/.+)$", line.strip())
                if not m or m.group(1).startswith(("CMAKE_INSTALL", "CMAKE_CACHEFILE", "CMAKE_HOME")):
                    continue
                for value in m.group(3).split(";"):
                    if os.path.isfile(value):
                        used.append((value, "found by CMake (" + m.group(1) + ")"))
                    elif os.path.isdir(value) and m.group(1).endswith("_DIR"):
                        for cfg in glob.glob(os.path.join(value, "*.cmake")):
                            used.append((cfg, "found by CMake (" + m.group(1) + ")"))
    return [(p if os.path.isabs(p) else os.path.normpath(os.path.join(build, p)), how) for p, how in used]


def shutil_which(name):
    for d in os.environ.get("PATH", "").split(os.pathsep):
        p = os.path.join(d, name)
        if os.path.isfile(p) and os.access(p, os.X_OK):
            return p
    return None


def candidates(path):
    """The names dpkg may list a file under: as given, resolved, and on both sides of /usr-merge."""
    out = []
    for p in (path, os.path.realpath(path)):
        out.append(p)
        for d in ("/usr/lib", "/usr/bin", "/usr/sbin"):
            if p.startswith(d + "/"):
                out.append(p[4:])
        for d in ("/lib", "/bin", "/sbin"):
            if p.startswith(d + "/"):
                out.append("/usr" + p)
    return out


def main():
    args = sys.argv[1:]
    without = set()
    while len(args) >= 2 and args[0] == "--without":
        without.add(args[1])
        args = args[2:]
    builds = [b for b in args if os.path.isdir(b)]
    if not builds:
        print("check-build-packages: no build directory given (or none exists)", file=sys.stderr)
        return 2
    start = time.time()
    wanted = [p for p in install_deps_list() if p not in without]
    pkgs = installed_packages()
    allowed, _ = allowed_packages(wanted, pkgs)
    missing_listed = [p for p in wanted if p not in pkgs]
    owners = dpkg_owners()
    free_roots = [ROOT + "/"] + [os.path.realpath(b) + "/" for b in builds] + ["/tmp/"]
    free_roots += [os.path.realpath(p) + "/" for p in glob.glob("/usr/local/cuda*")] + ["/usr/local/cuda"]
    bad = {}      # package -> (file, build, how)
    unowned = {}  # file -> (build, how)
    files = 0
    for build in builds:
        seen = set()
        for path, how in used_files(build):
            if path in seen:
                continue
            seen.add(path)
            files += 1
            real = os.path.realpath(path)
            if any(path.startswith(r) or real.startswith(r) for r in free_roots):
                continue
            owner = next((owners[c] for c in candidates(path) if c in owners), None)
            if owner is None:
                if os.path.exists(path):
                    unowned.setdefault(real, (build, how))
                continue
            if owner not in allowed:
                bad.setdefault(owner, (path, build, how))
    took = time.time() - start
    ok = not bad and not unowned and not missing_listed
    for p in missing_listed:
        print(f"check-build-packages: install-deps lists {p}, which is not installed here "
              "(run tools/setup/install-deps.sh)")
    for pkg, (path, build, how) in sorted(bad.items()):
        print(f"check-build-packages: {build} used {path} ({how}) from the Debian package {pkg}, "
              "which tools/setup/install-deps.sh does not install: add it to its list")
    for path, (build, how) in sorted(unowned.items()):
        print(f"check-build-packages: {build} used {path} ({how}), which no Debian package "
              "installed: a hand-made install a fresh machine does not have")
    print(f"check-build-packages: {files} files used by {len(builds)} build(s), "
          f"{len(wanted)} packages listed, {len(allowed)} allowed with their dependencies; "
          f"{'ok' if ok else 'FAILED'} in {took:.1f} s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
