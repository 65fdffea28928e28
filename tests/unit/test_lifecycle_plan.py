"""lifecycle/plan.py: the launch's warnings about what a workdir sends (audit F6, F27)."""

from __future__ import annotations

from cloudtrain.lifecycle.plan import workdir_warning


def _tree(root, files):
    for rel in files:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(rel)


def test_F27_the_workdir_warning_fires_for_the_home_its_ancestors_and_the_state(
        tmp_path, monkeypatch, ct_home):
    """Audit F27: the warning said nothing for `workdir: ..` above the home directory, and
    said credential files were excepted when --include had sent them: it fires for the home
    directory, a directory holding it and one holding $CLOUDTRAIN_HOME, and says what goes."""
    home = tmp_path / "users" / "me"
    _tree(home, [".aws/credentials", ".netrc", "code/train.py", "notes.txt"])
    monkeypatch.setenv("HOME", str(home))
    line = workdir_warning(home)
    assert line.startswith(f"WARNING: the workdir {home} is your home directory: 2 files "), line
    assert "2 credential-looking files held back (.aws/credentials, .netrc)" in line
    line = workdir_warning(tmp_path / "users")
    assert line.startswith(f"WARNING: the workdir {tmp_path / 'users'} holds your home "
                           f"directory {home}: 2 files"), line
    line = workdir_warning(home, (".netrc",))
    assert "1 credential-looking file held back (.aws/credentials)" in line
    assert line.endswith("; sent anyway by --include: .netrc"), line
    assert workdir_warning(home / "code") is None  # a project: nothing to say
    project = tmp_path / "project"
    project.mkdir()
    monkeypatch.setenv("CLOUDTRAIN_HOME", str(project / "state"))
    assert "holds cloudtrain's state" in workdir_warning(project)
