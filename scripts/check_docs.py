#!/usr/bin/env python3
"""Every document a clone has must be reachable from it: each relative link of every Markdown file
resolves to a file of the repository, every `docs/<name>.md` named in text or code exists, and
nothing cites the team's working notes (../shared, FORMATS.md, DESIGN.md, NOTES.md,
CONVENTIONS.md), which a clone does not have. Prints what is wrong, file:line; exits 1 if anything
is."""
import os
import re
import sys

SKIP_DIRS = {".git", "build", "runs", "node_modules"}
TEXT_EXT = (".md", ".cc", ".h", ".cu", ".sh", ".py", ".json", ".yml", ".txt", ".in", ".html")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
DOC_NAME = re.compile(r"(?<![\w/.])docs/([\w-]+\.md)")
NOTES = re.compile(r"\.\./shared|(?<![\w/.-])(FORMATS|DESIGN|NOTES|CONVENTIONS)\.md")


def main(root):
    problems = []
    self_path = os.path.abspath(__file__)
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
    print("check_docs: every link and document reference resolves inside the repository")
    return 0


if __name__ == "__main__":
    sys.exit(main(os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else ".")))
