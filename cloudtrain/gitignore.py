"""Which files of a work directory a job gets: everything git would not ignore.

`.gitignore` files are honoured at every level with git's rules for the common cases:
comments, `!` negation, a trailing `/` for directories only, patterns with a slash anchored
to their `.gitignore`'s directory, `*`, `?`, `[...]` and `**`. An ignored directory is not
entered (git cannot re-include a file inside one either). `.git` itself is never synced.

Credentials are never synced either, whatever .gitignore says (audit F6: `--workdir ~` sent
the AWS keys, SSH keys and cloudtrain's own state to the instance): CREDENTIAL_PATTERNS and
$CLOUDTRAIN_HOME when it lies inside the work directory, unless an `include` pattern (same
syntax) names the path.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

ALWAYS_IGNORED = {".git"}

# Well-known places for secrets, in .gitignore syntax (unanchored: at any depth). The README
# quotes this list.
CREDENTIAL_PATTERNS = (
    ".aws/",
    ".ssh/",
    ".gnupg/",
    ".netrc",
    ".env",
    ".env.*",
    "*.pem",
    ".git-credentials",
    "**/.docker/config.json",
    "**/.kube/config",
    ".pypirc",
    "id_rsa*",
    "id_dsa*",
    "id_ecdsa*",
    "id_ed25519*",
)


@dataclass
class Rule:
    base: str  # the directory of the .gitignore, relative to the root ("" for the root)
    regex: re.Pattern
    negate: bool
    dir_only: bool

    def matches(self, rel: str, is_dir: bool) -> bool:
        if self.dir_only and not is_dir:
            return False
        if self.base:
            if not rel.startswith(self.base + "/"):
                return False
            rel = rel[len(self.base) + 1:]
        return self.regex.fullmatch(rel) is not None


def _glob_to_regex(pattern: str) -> str:
    out, i, n = [], 0, len(pattern)
    while i < n:
        c = pattern[i]
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("/**", i) and i + 3 == n:
            out.append("/.*")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif c == "*":
            out.append("[^/]*")
            i += 1
        elif c == "?":
            out.append("[^/]")
            i += 1
        elif c == "[":
            end = pattern.find("]", i + 1)
            if end == -1:
                out.append(re.escape(c))
                i += 1
            else:
                body = pattern[i + 1:end].replace("\\", "\\\\")
                if body.startswith("!"):
                    body = "^" + body[1:]
                out.append(f"[{body}]")
                i = end + 1
        elif c == "\\" and i + 1 < n:
            out.append(re.escape(pattern[i + 1]))
            i += 2
        else:
            out.append(re.escape(c))
            i += 1
    return "".join(out)


def parse(text: str, base: str = "") -> list[Rule]:
    rules = []
    for line in text.splitlines():
        line = line.rstrip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        if negate:
            line = line[1:]
        elif line.startswith("\\"):
            line = line[1:]
        dir_only = line.endswith("/")
        line = line.rstrip("/")
        if not line:
            continue
        anchored = "/" in line
        line = line.lstrip("/")
        regex = _glob_to_regex(line)
        if not anchored:
            regex = "(?:.*/)?" + regex
        rules.append(Rule(base, re.compile(regex), negate, dir_only))
    return rules


def _ignored(rules: list[Rule], rel: str, is_dir: bool) -> bool:
    ignored = False
    for rule in rules:  # the last matching rule decides, as in git
        if rule.matches(rel, is_dir):
            ignored = not rule.negate
    return ignored


CREDENTIAL_RULES = parse("\n".join(CREDENTIAL_PATTERNS))


def _state_dir_in(root: Path) -> str | None:
    """$CLOUDTRAIN_HOME relative to `root` ('/'-separated), when it lies inside it."""
    from .config import home
    from .errors import CloudtrainError

    try:
        rel = home().resolve().relative_to(root.resolve())
    except (ValueError, OSError, RuntimeError, CloudtrainError):
        return None
    return rel.as_posix() if rel.parts else "."


def list_files(root: Path, include: tuple[str, ...] | list[str] = ()) -> list[str]:
    """Relative paths (with '/') of the files under `root` that git would not ignore, less
    credentials (CREDENTIAL_PATTERNS, $CLOUDTRAIN_HOME) unless an `include` pattern (gitignore
    syntax) matches the file or a directory above it."""
    root = Path(root)
    files: list[str] = []
    wanted = parse("\n".join(include))
    state_dir = _state_dir_in(root)
    if state_dir == "." and not wanted:
        return []  # the work directory is the state directory itself

    def secret(rel: str, is_dir: bool) -> bool:
        return _ignored(CREDENTIAL_RULES, rel, is_dir) or rel == state_dir

    def walk(directory: Path, rel_dir: str, rules: list[Rule], hidden: bool) -> None:
        """`hidden`: inside a credential directory entered only for `include` patterns."""
        ignore_file = directory / ".gitignore"
        if ignore_file.is_file():
            rules = rules + parse(ignore_file.read_text(errors="replace"), rel_dir)
        with os.scandir(directory) as entries:
            for entry in sorted(entries, key=lambda e: e.name):
                if entry.name in ALWAYS_IGNORED:
                    continue
                rel = f"{rel_dir}/{entry.name}" if rel_dir else entry.name
                is_dir = entry.is_dir(follow_symlinks=False)
                if _ignored(rules, rel, is_dir):
                    continue
                included = bool(wanted) and _ignored(wanted, rel, is_dir)
                inside = hidden and not included
                if secret(rel, is_dir) and not included:
                    if not (is_dir and wanted):
                        continue
                    inside = True  # look inside only for what `include` names
                if is_dir:
                    walk(Path(entry.path), rel, rules, inside)
                elif (entry.is_file() or entry.is_symlink()) and not inside:
                    files.append(rel)

    walk(root, "", [], state_dir == ".")
    return files
