"""tests/review-codes.md: every review code (F27, U11, D3, C1, B2, ...) that the repository's
code carries is explained there, and the codes stay in the tests, out of cloudtrain/'s source."""

from __future__ import annotations

import re
from pathlib import Path


REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "tests" / "review-codes.md"

# A review's code: its family's letter(s), then 1..99. Not C0 (a set of control characters),
# and not flake8's codes (F401, E402) nor a GPU's name (A100, T4, L4), which have other letters or
# three digits.
CODE = r"(?:[FUDCB]|R[A-H])[1-9][0-9]?"
# In a test's name the code sits between underscores (test_F6_...); in the source an identifier
# such as C1_STRINGS is code, and "C1 controls" the Unicode set, not a finding.
IN_TESTS = re.compile(rf"(?<![A-Za-z0-9]){CODE}(?![0-9A-Za-z])")
IN_SOURCE = re.compile(rf"(?<![A-Za-z0-9_]){CODE}(?![0-9A-Za-z_])(?! controls| are Cc)")


def _codes(folder: str, pattern: re.Pattern) -> dict[str, str]:
    """Each code found under `folder`, with the first file:line that has it."""
    found: dict[str, str] = {}
    for path in sorted((REPO / folder).rglob("*.py")):
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            for code in pattern.findall(line):
                found.setdefault(code, f"{path.relative_to(REPO)}:{number}")
    return found


def _explained() -> set[str]:
    return set(re.findall(rf"^\| ({CODE}) \| \S", PAGE.read_text(), re.M))


def test_every_code_in_the_repository_is_explained_on_the_page():
    explained = _explained()
    assert len(explained) > 100
    used = _codes("cloudtrain", IN_SOURCE)
    for folder in ("tests", "benchmarks", "recipes"):
        used |= _codes(folder, IN_TESTS)
    missing = {code: where for code, where in used.items() if code not in explained}
    assert not missing, f"codes that tests/review-codes.md does not explain: {missing}"


def test_the_page_explains_each_code_once():
    rows = re.findall(rf"^\| ({CODE}) \|", PAGE.read_text(), re.M)
    assert len(rows) == len(set(rows)), sorted(c for c in rows if rows.count(c) > 1)


def test_tests_readme_points_at_the_page():
    assert "review-codes.md" in (REPO / "tests" / "README.md").read_text()


def test_no_review_code_in_the_source():
    """Codes belong in the tests' names and docstrings; cloudtrain/ says what it does and why."""
    found = _codes("cloudtrain", IN_SOURCE)
    assert not found, f"{len(found)} review codes in cloudtrain/, e.g. {sorted(found.items())[:5]}"
