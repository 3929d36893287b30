#!/usr/bin/env python3
"""Every document a clone has must be reachable from it: each relative link of every Markdown file
resolves to a file of the repository, every `docs/<name>.md` named in text or code exists, and
nothing cites the team's working notes (../shared, FORMATS.md, DESIGN.md, NOTES.md,
CONVENTIONS.md), which a clone does not have; and every README.md's `code` names what is there:
a file it names (`agent.h`, `src/drain.cc`, `launch/worker_fault.h`) exists under the README's
folder or the repository's root, and a type or function it names (`ReadAgentState`,
`Agent::Impl`) is spelled somewhere in the sources. Prints what is wrong, file:line; exits 1 if
anything is."""
import os
import re
import sys

SKIP_DIRS = {".git", "build", "runs", "node_modules"}
TEXT_EXT = (".md", ".cc", ".h", ".cu", ".sh", ".py", ".json", ".yml", ".txt", ".in", ".html")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
DOC_NAME = re.compile(r"(?<![\w/.])docs/([\w-]+\.md)")
NOTES = re.compile(r"\.\./shared|(?<![\w/.-])(FORMATS|DESIGN|NOTES|CONVENTIONS)\.md")
CODE = re.compile(r"`([^`\s]+)`")
FILE_EXT = (".h", ".cc", ".cu", ".sh", ".py", ".md", ".in", ".json", ".txt", ".cmake")
SOURCE_FILE = (".h", ".cc", ".cu", ".sh", ".in", ".cmake")
# CamelCase names (a type, a function): an upper-case letter, then a lower-case one, then at
# least one more upper-case letter somewhere, optionally Qualified::Names and a trailing ().
SYMBOL = re.compile(r"^(?:[A-Za-z_]\w*::)*([A-Z][a-z]\w*[A-Z]\w*)(?:\(\))?$")
SOURCE_EXT = (".h", ".cc", ".cu", ".py", ".sh", ".in", ".txt")


def source_index(root):
    """Every file's path under the repository, and every word of its sources."""
    paths, words = [], set()
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in SKIP_DIRS]
        for name in filenames:
            path = os.path.join(dirpath, name)
            paths.append(os.path.relpath(path, root))
            if name.endswith(SOURCE_EXT):
                try:
                    words.update(re.findall(r"\w+", open(path, encoding="utf-8").read()))
                except (UnicodeDecodeError, OSError):
                    pass
    return paths, words


def readme_problems(root, rel, lines, paths, words):
    """What a README names in `code` that is not there."""
    here = os.path.dirname(rel)
    under = [p for p in paths if not here or p.startswith(here + os.sep)]
    out = []
    for n, line in enumerate(lines, 1):
        for token in CODE.findall(line):
            token = token.rstrip(".,;:")
            if any(c in token for c in "*<>{}$=\"") or "..." in token or token.startswith("-"):
                continue
            # A source file by its name, anything else by a path (`bench/results/x.txt`); not a
            # run's files (`RUN_DIR/run.json`), nor another project's (`utils.py`).
            named_file = token.endswith(SOURCE_FILE) or ("/" in token and token.endswith(FILE_EXT))
            if named_file and re.match(r"^[\w./-]+$", token) and not re.match(r"^[A-Z_]+/", token):
                t = token.lstrip("./")
                found = (os.path.exists(os.path.join(root, here, t))
                         or os.path.exists(os.path.join(root, t))
                         or any(p == t or p.endswith(os.sep + t) for p in under)
                         or any(p.endswith(os.sep + t) for p in paths))
                if not found:
                    out.append(f"{rel}:{n}: names {token}, which is not there")
                continue
            m = SYMBOL.match(token)
            name = m.group(1) if m else None
            if "::" in token and re.match(r"^[\w:]+(\(\))?$", token):
                name = token.removesuffix("()").split("::")[-1]  # Agent::Impl::Serve
            if name and name not in words:
                out.append(f"{rel}:{n}: names {token}, which no source spells")
    return out


def main(root):
    problems = []
    self_path = os.path.abspath(__file__)
    paths, words = source_index(root)
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in SKIP_DIRS]
        for name in filenames:
            path = os.path.join(dirpath, name)
            if not name.endswith(TEXT_EXT) or os.path.abspath(path) == self_path:
                continue
            rel = os.path.relpath(path, root)
            try:
                lines = open(path, encoding="utf-8").read().splitlines()
            except (UnicodeDecodeError, OSError):
                continue
            if name == "README.md":
                problems += readme_problems(root, rel, lines, paths, words)
            for n, line in enumerate(lines, 1):
                if NOTES.search(line):
                    problems.append(f"{rel}:{n}: cites the working notes, which a clone lacks: "
                                    f"{line.strip()[:100]}")
                for doc in DOC_NAME.findall(line):
                    if not os.path.isfile(os.path.join(root, "docs", doc)):
                        problems.append(f"{rel}:{n}: docs/{doc} does not exist")
                if not name.endswith(".md"):
                    continue
                for target in LINK.findall(line):
                    if re.match(r"^[a-z]+:", target) or target.startswith("#"):
                        continue  # a URL or an anchor in the same page
                    target = target.split("#")[0]
                    resolved = os.path.normpath(os.path.join(dirpath, target))
                    if not os.path.exists(resolved):
                        problems.append(f"{rel}:{n}: link to {target} resolves to nothing")
                    elif not resolved.startswith(os.path.abspath(root)):
                        problems.append(f"{rel}:{n}: link to {target} leaves the repository")
    for p in problems:
        print(p)
    if problems:
        print(f"check_docs: {len(problems)} problem(s)")
        return 1
    print("check_docs: every link and document reference resolves inside the repository, and every "
          "file and name a README gives is there")
    return 0


if __name__ == "__main__":
    sys.exit(main(os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else ".")))
