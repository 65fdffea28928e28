"""Which files of a work directory a job gets: everything git would not ignore.

`.gitignore` files are honoured at every level with git's rules for the common cases:
comments, `!` negation, a trailing `/` for directories only, patterns with a slash anchored
to their `.gitignore`'s directory, `*`, `?`, `[...]` and `**`. An ignored directory is not
entered (git cannot re-include a file inside one either). `.git` itself is never synced.

Credentials are never synced either, whatever .gitignore says (audit F6: `--workdir ~` sent
the AWS keys, SSH keys and cloudtrain's own state to the instance): CREDENTIAL_PATTERNS and
$CLOUDTRAIN_HOME when it lies inside the work directory, unless an `include` pattern (same
syntax) names the path. Only the `--include` flag gives such patterns, and the launch asks
before it sends what they name (audit F27: a job file from someone else's repository could
otherwise send the keys to an instance its own code runs on). survey() says what was held
back and what an include sent anyway, for the launch's warnings and the dry run.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

ALWAYS_IGNORED = {".git"}

# Well-known places for secrets, in .gitignore syntax (unanchored: at any depth). The README
# quotes this list. Audit F27: the keys F6 named were not all: cloud CLIs, package registries,
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
    wanted = parse("\n".join(include))
    if out.state_dir == "." and not wanted:
        return out  # the work directory is the state directory itself

    def walk(directory: Path, rel_dir: str, rules: list[Rule], mode: str, named: bool) -> None:
        """`mode`: "open", "secret" (inside a credential directory: files held back unless
        named) or "state" (inside $CLOUDTRAIN_HOME: entered only for include patterns);
        `named`: an include pattern names a directory above."""
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
                here = named or (bool(wanted) and _ignored(wanted, rel, is_dir))
                kind = mode
                if rel == out.state_dir:
                    kind = "state"
                elif mode == "open" and _ignored(CREDENTIAL_RULES, rel, is_dir):
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
