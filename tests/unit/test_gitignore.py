from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cloudtrain.gitignore import list_files


@pytest.fixture
def root(tmp_path):
    (tmp_path / "w").mkdir()
    return tmp_path / "w"


def _tree(root, files):
    for rel in files:
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(rel)


def test_common_patterns(root):
    _tree(root, ["a.py", "b.log", "logs/x.txt", "src/c.py", "src/d.pyc", "src/build/e.o",
                     "build/f", "keep.log", "deep/a/b/target.bin", "docs/notes.md",
                     ".git/config", "src/.gitignore"])
    (root / ".gitignore").write_text(
        "# comment\n*.log\n!keep.log\nlogs/\n/build\n*.pyc\n**/target.bin\ndocs/*.md\n")
    (root / "src" / ".gitignore").write_text("build/\n")
    assert list_files(root) == [".gitignore", "a.py", "keep.log", "src/.gitignore", "src/c.py"]


def test_anchored_vs_unanchored(root):
    _tree(root, ["build", "sub/build", "x/tmp/y"])
    (root / ".gitignore").write_text("/build\ntmp/\n")
    assert list_files(root) == [".gitignore", "sub/build"]


def test_dir_only_pattern_keeps_files_of_that_name(root):
    _tree(root, ["out", "d/out/z"])
    (root / ".gitignore").write_text("out/\n")
    assert list_files(root) == [".gitignore", "out"]


def test_character_classes_and_question_mark(root):
    _tree(root, ["file3.txt", "fileA.txt", "dir/xa.c", "xab.c"])
    (root / ".gitignore").write_text("file[0-9].txt\nx?.c\n")
    assert list_files(root) == [".gitignore", "fileA.txt", "xab.c"]


# What `git ls-files --others --exclude-standard` answered for each (git 2.39), which the
# hand-written matcher got wrong: `**` not between slashes is a `*` and stays inside a folder; a
# `]` first in a class is a member of it (the matcher crashed: "unterminated character set"); an
# escaped trailing space is part of the name; a class left open and a lone trailing backslash
# match nothing.
GIT_ANSWERS = [
    ("a**b\n", ["axb", "ab", "a/x/b"], [".gitignore", "a/x/b"]),
    ("?**/b\n", ["ab", "x/b"], [".gitignore", "ab"]),
    ("[]a]\n", ["]", "a", "b"], [".gitignore", "b"]),
    ("foo\\ \n", ["foo ", "foo"], [".gitignore", "foo"]),
    ("[a\n", ["[a", "a"], [".gitignore", "[a", "a"]),
    ("a\\\n*.log\n", ["a", "b.log"], [".gitignore", "a"]),
    # and what pathspec's GitIgnoreSpec alone gets wrong for a directory
    ("a\n!*\na\n", ["a/b", "c"], [".gitignore", "c"]),
    ("a/**\n!a/keep\n", ["a/keep", "a/x"], [".gitignore", "a/keep"]),
    ("*\n!*/\n!*.py\n", ["a.py", "b.bin", "src/c.py", "src/d.bin"], ["a.py", "src/c.py"]),
    ("*[!a]\n", ["b/a", "a"], ["a"]),  # pathspec's `[^a]` would take the `/` of `b/`
    ("*\n!a/\n!c\n", ["a/b/c", "a/c"], ["a/c"]),  # `!a/` names a, not a/b
]


@pytest.mark.parametrize("ignore, files, sent", GIT_ANSWERS)
def test_gitignore_semantics_as_git_has_them(root, ignore, files, sent):
    _tree(root, files)
    (root / ".gitignore").write_text(ignore)
    assert list_files(root) == sent


# Trees and .gitignore files (in any folder) drawn at random, checked against git itself. The
# names and pattern pieces cover negation, anchoring by a leading or middle slash, `**` as a
# whole segment (`**/`, `/**`, `/**/`) and beside other characters (a `*` then), directory-only
# patterns, classes, and escaped `#`, `!` and spaces. Left out: `**` beside other characters and
# a slash (git 2.39 lets `a**/*b` match `ab`, against its documentation, which pathspec
# follows), and a pattern ending in `/**/`, which pathspec takes for the directory itself.
NAMES = st.sampled_from(["a", "b", "ab", "ba", "a.b", "#a", "!a", "a b"])
PIECES = ["a**b", "**b", "a", "b", "*", "?", "[ab]", "[!a]", "a*", "*b", "\\#a", "\\!a", ".b",
          "a\\ b"]
SEGMENT = st.just("**") | st.lists(st.sampled_from(PIECES), min_size=1, max_size=2).map("".join)
PATTERN = st.tuples(st.sampled_from(["", "!"]), st.sampled_from(["", "/"]),
                    st.lists(SEGMENT, min_size=1, max_size=3).map("/".join),
                    st.sampled_from(["", "/"])).map("".join).filter(
    lambda p: not p.endswith("/**/") and "***" not in p and "//" not in p
    and not re.search(r"[^/]\*\*/|/\*\*[^/]", p))
GIT = ["git", "-c", "core.excludesFile=/dev/null"]


@st.composite
def trees(draw):
    """Files (no path both a file and a folder) and the text of a .gitignore per folder."""
    files: list[str] = []
    for rel in sorted(draw(st.lists(st.lists(NAMES, min_size=1, max_size=4).map("/".join),
                                    min_size=1, max_size=12, unique=True)), key=len):
        if not any(rel.startswith(f + "/") for f in files):
            files.append(rel)
    folders = sorted({str(Path(f).parent) for f in files} - {"."} | {""})
    ignores = draw(st.dictionaries(st.sampled_from(folders),
                                   st.lists(PATTERN, max_size=5).map("\n".join), max_size=3))
    return files, ignores


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tree=trees())
def test_the_files_sent_are_the_files_git_does_not_ignore(tree):
    files, ignores = tree
    env = dict(os.environ, GIT_CONFIG_GLOBAL="/dev/null", GIT_CONFIG_NOSYSTEM="1")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        subprocess.run(["git", "init", "-q", tmp], env=env, check=True)
        _tree(root, files)
        for folder, text in ignores.items():
            (root / folder / ".gitignore").write_text(text + "\n")
        listed = subprocess.run(GIT + ["ls-files", "-z", "--others", "--exclude-standard"],
                                cwd=tmp, env=env, capture_output=True, check=True).stdout
        assert sorted(list_files(root)) == sorted(n.decode() for n in listed.split(b"\0") if n)


def test_F6_credentials_are_never_synced(root):
    """Audit F6: a `--workdir ~` as in the audit: keys and tokens stay home, code goes."""
    secrets = [".aws/credentials", ".ssh/id_ed25519", ".ssh/config", ".netrc", ".env",
               "project/.env", "project/.env.local", "tls/server.pem", ".git-credentials",
               ".docker/config.json", "sub/.kube/config", ".pypirc", "keys/id_rsa",
               "keys/id_ed25519.pub", ".gnupg/private-keys-v1.d/k.key"]
    code = ["project/train.py", "project/environment.yml", ".docker/daemon.json", ".kube/cache",
            "id_card.txt", "docs/.envelope"]
    _tree(root, secrets + code)
    assert list_files(root) == sorted(code)


def test_F6_include_patterns_bring_back_what_they_name(root):
    _tree(root, [".aws/credentials", ".aws/config", ".env", "deploy/.env.prod", "train.py"])
    assert list_files(root, include=[".aws/config", "deploy/.env.prod"]) == \
        [".aws/config", "deploy/.env.prod", "train.py"]
    assert list_files(root, include=[".aws/"]) == [".aws/config", ".aws/credentials", "train.py"]
    (root / ".gitignore").write_text(".env\n")  # include never overrides .gitignore itself
    assert list_files(root, include=[".env"]) == [".gitignore", "train.py"]


def test_F6_the_state_directory_inside_the_workdir_is_left_out(root, monkeypatch):
    _tree(root, ["train.py", "state/state.db", "state/keys/us-east-1/cloudtrain_ed25519"])
    monkeypatch.setenv("CLOUDTRAIN_HOME", str(root / "state"))
    assert list_files(root) == ["train.py"]
    assert list_files(root, include=["state/state.db"]) == ["state/state.db", "train.py"]
    monkeypatch.setenv("CLOUDTRAIN_HOME", str(root))  # the workdir is the state directory
    assert list_files(root) == []


def test_F6_the_list_is_exported_for_the_readme():
    from cloudtrain.gitignore import CREDENTIAL_PATTERNS

    assert ".aws/" in CREDENTIAL_PATTERNS and "*.pem" in CREDENTIAL_PATTERNS


# Audit F27: the tokens a home directory holds besides the keys F6 named. Each one, synced,
# is readable by the job's own code on an instance that has network access.
F27_TOKENS = [
    ".config/gcloud/application_default_credentials.json", ".config/gcloud/credentials.db",
    ".config/gcloud/access_tokens.db", ".config/gcloud/configurations/config_default",
    "project/application_default_credentials.json",
    ".huggingface/token", ".cache/huggingface/token", ".cache/huggingface/stored_tokens",
    ".kaggle/kaggle.json", ".config/wandb/settings", ".netrc",
    ".config/gh/hosts.yml", ".npmrc", "web/.npmrc", ".pypirc",
    ".azure/accessTokens.json", ".azure/msal_token_cache.json",
    ".terraform.d/credentials.tfrc.json", ".envrc", "project/.envrc",
    ".boto", ".s3cfg", ".config/rclone/rclone.conf", ".vault-token",
    "tls/server.key", "certs/client.p12", "certs/client.pfx",
    "service-account.json", "deploy/service-account-prod.json", "gcp/my-service-account.json",
    ".bash_history", ".zsh_history", ".python_history", ".psql_history", ".mysql_history",
    ".sqlite_history", ".node_repl_history", ".local/share/fish/fish_history",
    ".docker/config.json", ".kube/config", ".git-credentials", ".gnupg/pubring.kbx",
    ".aws/credentials", ".ssh/id_ed25519",
]
# Look-alikes that are code or data, not tokens: they still go.
F27_CODE = ["train.py", "keys.py", "keyboard.json", "tokenizer/token_map.json",
            "history/run1.csv", "docs/.envelope", "config/settings.yaml", "data/keys.txt",
            "service.json", ".config/other-tool/settings"]


def test_F27_every_common_token_is_held_back(root):
    """Audit F27: every listed token stays home; the code beside them goes."""
    _tree(root, F27_TOKENS + F27_CODE)
    assert list_files(root) == sorted(F27_CODE)


# Audit F47: what `--workdir ~` still sent (the first five), and the other well-known
# credential files of a home directory: git's XDG store, Maven, Databricks, hub, browsers'
# saved passwords and cookies, PostgreSQL and MySQL passwords, netrc's Windows name,
# package managers' tokens (yarn, gem, cargo, composer, Gradle, sbt/ivy), Oracle Cloud,
# DigitalOcean, Hetzner, ngrok, pass and GNOME's keyrings.
F47_TOKENS = [
    ".config/git/credentials", ".m2/settings.xml", ".m2/settings-security.xml",
    ".databrickscfg", ".config/hub",
    ".mozilla/firefox/abcd1234.default-release/logins.json",
    ".mozilla/firefox/abcd1234.default-release/key4.db",
    "Library/Application Support/Firefox/Profiles/x.default/logins.json",
    ".config/google-chrome/Default/Login Data", ".config/chromium/Default/Cookies",
    "Library/Application Support/Google/Chrome/Default/Login Data",
    ".pgpass", ".my.cnf", "_netrc", ".yarnrc.yml", ".gem/credentials",
    ".cargo/credentials", ".cargo/credentials.toml", ".composer/auth.json",
    ".config/composer/auth.json", ".gradle/gradle.properties", ".ivy2/.credentials",
    ".sbt/.credentials", ".oci/config", ".oci/oci_api_key.pem", ".config/doctl/config.yaml",
    ".config/hcloud/cli.toml", ".config/ngrok/ngrok.yml", ".ngrok2/ngrok.yml",
    ".password-store/email.gpg", ".local/share/keyrings/login.keyring", ".terraformrc",
    ".dockercfg", ".config/containers/auth.json", ".kube/config-prod",
    ".kube/staging.kubeconfig",
]
F47_CODE = ["settings.xml", "pom.xml", "gradle.properties.example", "cargo/credentials.md",
            "docs/logins.md", "config/hub.py", "my.cnf.example"]


def test_F47_the_other_well_known_credential_files_are_held_back(root):
    """Audit F47: with `--workdir ~`, 5 of 24 credential-like files were still sent
    (.config/git/credentials, .m2/settings.xml, .databrickscfg, .config/hub, Firefox's
    logins.json); they and the other well-known ones stay home, code of like names goes."""
    _tree(root, F47_TOKENS + F47_CODE)
    assert list_files(root) == sorted(F47_CODE)


def test_F27_the_survey_counts_and_names_what_it_holds_back(root):
    """Audit F27: a sync's survey says what is sent, what credential-looking files it held
    back (inside held-back directories too) and which of those an include sent anyway."""
    from cloudtrain.gitignore import survey

    _tree(root, [".aws/credentials", ".aws/config", ".ssh/id_ed25519", ".npmrc", "train.py",
                 "logs/.gitignore"])
    (root / ".gitignore").write_text(".ssh/\n")  # ignored by git: not held back, just ignored
    found = survey(root)
    assert found.files == [".gitignore", "logs/.gitignore", "train.py"]
    assert found.held_back == [".aws/config", ".aws/credentials", ".npmrc"]
    assert found.included == []
    found = survey(root, include=[".aws/credentials"])
    assert found.files == [".aws/credentials", ".gitignore", "logs/.gitignore", "train.py"]
    assert found.held_back == [".aws/config", ".npmrc"] and found.included == [".aws/credentials"]
    found = survey(root, include=["*"])  # a pattern naming everything names the tokens too
    assert found.included == [".aws/config", ".aws/credentials", ".npmrc"]
    assert found.held_back == []


def test_B1_a_link_loop_in_the_workdir_is_a_link_not_a_crash(root):
    """Found by benchmarks/audit_figures.py (job files): a repository holding a link that
    points at itself (`loop -> loop`) made `launch --dry-run` end in "internal error:
    OSError: Too many levels of symbolic links". A link is listed as a link, as any other,
    whatever it points at."""
    _tree(root, ["train.py"])
    (root / "loop").symlink_to("loop")
    (root / "sub").mkdir()
    (root / "sub" / "a").symlink_to("b")
    (root / "sub" / "b").symlink_to("a")
    assert list_files(root) == ["loop", "sub/a", "sub/b", "train.py"]
