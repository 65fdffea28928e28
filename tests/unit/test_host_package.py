"""cloudtrain/host/ as a whole: what is shipped to an instance runs there with nothing but the
instance's python3 (3.8+, standard library only) and the folder's own modules beside each
other (issue 26: the host side in its own folder, importing nothing outside itself)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from cloudtrain import host, hosts

FOLDER = Path(host.__file__).parent
MODULES = sorted(p for p in FOLDER.glob("*.py") if p.name != "__init__.py")
NEIGHBOURS = {p.stem for p in MODULES}
STDLIB = set(sys.stdlib_module_names)
DYNAMIC = ("import_module", "__import__", "shipped")  # calls that import a module by its name


def _called(node: ast.Call) -> str:
    func = node.func
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")


def outside_imports(path: Path) -> list[str]:
    """`file:line: the import` for each import in the module (at any depth: inside functions,
    try/except, classes) of something that is neither the standard library nor a module of
    this folder, and for each relative import that leaves the folder."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names = [node.module]
        elif isinstance(node, ast.ImportFrom) and node.level == 1:  # ours, by definition
            names = [node.module] if node.module else [a.name for a in node.names]
            if any(n.split(".")[0] not in NEIGHBOURS for n in names):  # no module of ours
                found.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
            continue
        elif isinstance(node, ast.ImportFrom):  # `from .. import x`: out of the folder
            found.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
            continue
        elif (isinstance(node, ast.Call) and _called(node) in DYNAMIC and node.args
              and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            names = [node.args[0].value]
        else:
            continue
        for name in names:
            top = name.split(".")[0]
            if top not in STDLIB and top not in NEIGHBOURS:
                found.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_the_folder_is_what_a_host_gets():
    assert {p.name for p in MODULES} >= {"agent.py", "agent_upload.py", "checkpoint_stream.py",
                                         "stager.py", "shards.py", "safefile.py"}
    assert sorted(hosts.agent_files()) == MODULES
    assert hosts.agent_files()[0].name == "agent.py"


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.name)
def test_imports_nothing_outside_itself_and_the_standard_library(path):
    ast.parse(path.read_text(), feature_version=(3, 8))  # whatever python3 the instance has
    assert outside_imports(path) == []


def test_the_check_sees_imports_inside_functions_and_out_of_the_folder(tmp_path):
    """The check above can fail: a module with each kind of import it must refuse."""
    planted = tmp_path / "planted.py"
    planted.write_text(
        "import json\n"
        "from . import safefile, config\n"
        "from .. import errors\n"
        "from ..hosts import Host\n"
        "def f():\n"
        "    import yaml\n"
        "    from botocore import session\n"
        "    return shipped('agent_upload'), importlib.import_module('paramiko')\n")
    assert outside_imports(planted) == [
        "planted.py:2: from . import safefile, config",
        "planted.py:3: from .. import errors",
        "planted.py:4: from ..hosts import Host",
        "planted.py:6: import yaml",
        "planted.py:7: from botocore import session",
        "planted.py:8: importlib.import_module('paramiko')",
    ]


def test_every_module_imports_as_a_plain_file_beside_the_others(tmp_path):
    """As on an instance: the files alone in the agent's directory, a python without
    site-packages (-S) or the environment (-I), so neither cloudtrain nor any third-party
    package can be found."""
    for path in hosts.agent_files():
        (tmp_path / path.name).write_bytes(path.read_bytes())
    names = sorted(NEIGHBOURS)
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import importlib\n"
            "for name in sys.argv[2:]:\n"
            "    importlib.import_module(name)\n"
            "assert 'cloudtrain' not in sys.modules\n"
            "print(' '.join(sorted(m for m in sys.modules if m in sys.argv[2:])))\n")
    done = subprocess.run([sys.executable, "-I", "-S", "-c", code, str(tmp_path), *names],
                          cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == names
