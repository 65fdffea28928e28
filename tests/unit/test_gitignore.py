from __future__ import annotations

import pytest

from cloudtrain.gitignore import list_files, parse


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


def test_character_classes_and_question_mark():
    rules = parse("file[0-9].txt\nx?.c\n")
    assert rules[0].matches("file3.txt", False) and not rules[0].matches("fileA.txt", False)
    assert rules[1].matches("dir/xa.c", False) and not rules[1].matches("xab.c", False)
