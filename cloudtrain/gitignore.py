"""Which files of a work directory a job gets: everything git would not ignore.

`.gitignore` files are honoured at every level with git's rules, their patterns read by
pathspec: comments, `!` negation, a trailing `/` for directories only, patterns with a slash
anchored to their `.gitignore`'s directory, `*`, `?`, `[...]`, `**` and escapes; a deeper
`.gitignore` overrides the ones above it. An ignored directory is not entered (git cannot
re-include a file inside one either). `.git` itself is never synced.

Credentials are never synced either, whatever .gitignore says (`--workdir ~` sent
the AWS keys, SSH keys and cloudtrain's own state to the instance): CREDENTIAL_PATTERNS and
$CLOUDTRAIN_HOME when it lies inside the work directory, unless an `include` pattern (same
syntax) names the path. Only the `--include` flag gives such patterns, and the launch asks
before it sends what they name (a job file from someone else's repository could
otherwise send the keys to an instance its own code runs on). survey() says what was held
back and what an include sent anyway, for the launch's warnings and the dry run.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

ALWAYS_IGNORED = {".git"}

# Well-known places for secrets, in .gitignore syntax (unanchored: at any depth). The README
# quotes this list. The keys first listed were not all: cloud CLIs, package registries,
# model hubs and shell histories keep tokens in a home directory too.
CREDENTIAL_PATTERNS = (
    # SSH, GPG, git and the generic ones
    ".ssh/",
    ".gnupg/",
    "id_rsa*",
    "id_dsa*",
    "id_ecdsa*",
    "id_ed25519*",
    ".netrc",  # also where wandb keeps its API key
    "_netrc",  # its name on Windows
    ".git-credentials",
    "**/.config/git/credentials",  # git's credential store under XDG_CONFIG_HOME
    ".password-store/",  # pass
    "**/.local/share/keyrings/",  # GNOME Keyring
    ".env",
    ".env.*",
    ".envrc",
    ".vault-token",
    "*.pem",
    "*.key",
    "*.p12",
    "*.pfx",
    # clouds
    ".aws/",
    ".azure/",
    ".boto",
    ".s3cfg",
    "**/.config/gcloud/",
    "application_default_credentials.json",
    "*service-account*.json",
    "*service_account*.json",
    "**/.config/rclone/rclone.conf",
    "**/.terraform.d/credentials.tfrc.json",
    "**/.docker/config.json",
    ".dockercfg",
    "**/.config/containers/auth.json",  # podman, buildah, skopeo
    "**/.kube/config",
    "**/.kube/config[-_.]*",  # one per cluster: config-prod, config.staging
    "**/.kube/*kubeconfig*",
    ".databrickscfg",
    ".oci/",  # Oracle Cloud
    "**/.config/doctl/config.yaml",  # DigitalOcean
    "**/.config/hcloud/cli.toml",  # Hetzner Cloud
    ".terraformrc",
    # registries, hubs and tools
    ".pypirc",
    ".npmrc",
    ".yarnrc.yml",
    "**/.gem/credentials",
    "**/.cargo/credentials",
    "**/.cargo/credentials.toml",
    "**/.composer/auth.json",
    "**/.config/composer/auth.json",
    "**/.m2/settings.xml",  # Maven's server passwords
    "**/.m2/settings-security.xml",
    "**/.gradle/gradle.properties",
    "**/.ivy2/.credentials",
    "**/.sbt/.credentials",
    "**/.config/gh/hosts.yml",
    "**/.config/hub",  # the older GitHub CLI's token
    "**/.config/ngrok/ngrok.yml",
    "**/.ngrok2/ngrok.yml",
    "**/.huggingface/token",
    "**/.cache/huggingface/token",
    "**/.cache/huggingface/stored_tokens",
    "kaggle.json",
    "**/.config/wandb/settings",
    # databases' passwords
    ".pgpass",
    ".my.cnf",
    # browsers' saved passwords and cookies (Firefox's profiles wherever they are)
    "logins.json",
    "key3.db",
    "key4.db",
    "cookies.sqlite",
    "**/.mozilla/",
    "**/.config/google-chrome/",
    "**/.config/chromium/",
    "**/.config/BraveSoftware/",
    "**/Library/Application Support/Google/Chrome/",  # macOS
    # shell and REPL histories: commands typed with tokens in them
    ".*_history",
    ".history",
    "fish_history",
)


# pathspec's GitIgnoreSpec answers for a file's whole path and differs from git for
# directories (`a`, `!*`, `a` leaves `a/` in; pathspec issues 129 and 137), so the walk asks
# git's question of each entry instead: the last pattern that names this file or directory
# decides. A pattern names the entry when its regex matches the entry's path without going
# through a parent directory (no directory mark), or, for a directory, with the mark on the
# entry's own trailing `/` (`build/`). The walk has already let every parent through.
@dataclass(frozen=True)
class Patterns:
    """One .gitignore's patterns (pathspec's GitIgnoreSpecPattern) and the name of their
    directory-mark group; `any`: one regex that matches where any of them does, so that the
    many entries no pattern names cost one search."""
    patterns: tuple
    mark: str
    any: re.Pattern


Rules = list  # of (the .gitignore's directory relative to the root, "" for the root; Patterns)


def _compile(lines) -> Patterns:
    """A line git cannot use (a lone trailing backslash) matches nothing, as in git."""
    import warnings

    from pathspec.patterns.gitignore.spec import _DIR_MARK, GitIgnoreSpecPattern

    patterns = []
    with warnings.catch_warnings():  # `[[:alpha:]]` makes `re` warn of a nested set
        warnings.simplefilter("ignore", FutureWarning)
        for line in lines:
            try:
                pattern = GitIgnoreSpecPattern(line)
            except ValueError:
                continue
            if pattern.include is not None:  # a comment or a blank line
                patterns.append(pattern)
        group = f"(?P<{_DIR_MARK}>"
        either = "|".join(f"(?:{p.regex.pattern.replace(group, '(?:')})" for p in patterns
                          if p.regex is not None)  # every pattern kept has one (include set)
        try:
            any_ = re.compile(either or "(?!)")
        except re.error:  # then every entry is checked pattern by pattern
            any_ = re.compile("")
    return Patterns(tuple(patterns), _DIR_MARK, any_)


def _names(pattern, mark: str, path: str, is_dir: bool) -> bool:
    if any(found.groupdict().get(mark) is None for found in pattern.regex.finditer(path)):
        return True
    return is_dir and any(found.groupdict().get(mark) and found.end(mark) == len(path) + 1
                          for found in pattern.regex.finditer(path + "/"))


def _ignored(rules: Rules, rel: str, is_dir: bool) -> bool | None:
    """True when the last pattern naming `rel` ignores it, False when it re-includes it, None
    when none names it. A deeper .gitignore overrides the ones above it, as in git."""
    for base, found in reversed(rules):
        if base and not rel.startswith(base + "/"):
            continue
        path = rel[len(base) + 1:] if base else rel
        if found.any.search(path) is None and not (is_dir and found.any.search(path + "/")):
            continue
        for pattern in reversed(found.patterns):
            if _names(pattern, found.mark, path, is_dir):
                return pattern.include
    return None


@lru_cache(maxsize=1)
def _credential_rules() -> Rules:
    return [("", _compile(CREDENTIAL_PATTERNS))]


def _state_dir_in(root: Path) -> str | None:
    """$CLOUDTRAIN_HOME relative to `root` ('/'-separated), when it lies inside it."""
    from .config import home
    from .errors import CloudtrainError

    try:
        rel = home().resolve().relative_to(root.resolve())
    except (ValueError, OSError, RuntimeError, CloudtrainError):
        return None
    return rel.as_posix() if rel.parts else "."


@dataclass
class Survey:
    """What a sync of a work directory sends, and what the credential guard kept out of it."""
    files: list[str] = field(default_factory=list)  # sent: relative paths with '/'
    held_back: list[str] = field(default_factory=list)  # credential-looking files left out
    included: list[str] = field(default_factory=list)  # credential-looking, sent by `include`
    state_dir: str | None = None  # $CLOUDTRAIN_HOME below the root ("." for the root)


def survey(root: Path, include: tuple[str, ...] | list[str] = ()) -> Survey:
    """The files under `root` that git would not ignore, less credentials
    (CREDENTIAL_PATTERNS, $CLOUDTRAIN_HOME) unless an `include` pattern (gitignore syntax)
    matches the file or a directory above it; with the credential-looking files held back
    (counted inside held-back directories too) and those an include sent anyway."""
    root = Path(root)
    out = Survey(state_dir=_state_dir_in(root))
    wanted = [("", _compile(include))] if include else []
    if out.state_dir == "." and not wanted:
        return out  # the work directory is the state directory itself

    def walk(directory: Path, rel_dir: str, rules: Rules, mode: str, named: bool) -> None:
        """`mode`: "open", "secret" (inside a credential directory: files held back unless
        named) or "state" (inside $CLOUDTRAIN_HOME: entered only for include patterns);
        `named`: an include pattern names a directory above."""
        ignore_file = directory / ".gitignore"
        if ignore_file.is_file():
            rules = rules + [(rel_dir, _compile(ignore_file.read_text(errors="replace").splitlines()))]
        with os.scandir(directory) as entries:
            for entry in sorted(entries, key=lambda e: e.name):
                if entry.name in ALWAYS_IGNORED:
                    continue
                rel = f"{rel_dir}/{entry.name}" if rel_dir else entry.name
                is_dir = entry.is_dir(follow_symlinks=False)
                if _ignored(rules, rel, is_dir):
                    continue
                here = named or bool(wanted and _ignored(wanted, rel, is_dir))
                kind = mode
                if rel == out.state_dir:
                    kind = "state"
                elif mode == "open" and _ignored(_credential_rules(), rel, is_dir):
                    kind = "secret"
                if is_dir:
                    if kind != "state" or here or wanted:
                        walk(Path(entry.path), rel, rules, kind, here)
                # a link is sent as a link, never followed here (a loop of them: ELOOP)
                elif not (entry.is_symlink() or entry.is_file()):
                    continue
                elif kind == "open" or here:
                    out.files.append(rel)
                    if kind != "open":
                        out.included.append(rel)
                elif kind == "secret":
                    out.held_back.append(rel)

    walk(root, "", [], "state" if out.state_dir == "." else "open", False)
    return out


def list_files(root: Path, include: tuple[str, ...] | list[str] = ()) -> list[str]:
    """What a sync of `root` sends (survey().files)."""
    return survey(root, include).files
