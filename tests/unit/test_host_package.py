"""cloudtrain/host/ as a whole: what is shipped to an instance runs there with nothing but the
instance's python3 (3.8+, standard library only) and the folder's own modules (issue 26: the
host side in its own folder, importing nothing outside itself), shipped as a package of its
own with a launcher per command (issue 35: its imports the same there as here)."""

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
# what `from . import NAME` may name besides a module: what __init__.py defines (SHIPPED_AS)
PACKAGE_NAMES = {t.id for node in ast.parse((FOLDER / "__init__.py").read_text()).body
                 if isinstance(node, ast.Assign) for t in node.targets}
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
            if any(n.split(".")[0] not in NEIGHBOURS | PACKAGE_NAMES for n in names):
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
    shipped = hosts.host_files()
    package = [(n, d) for n, d in shipped if n.startswith(hosts.HOST_PACKAGE + "/")]
    assert package == [(f"{hosts.HOST_PACKAGE}/{p.name}", p.read_bytes())
                       for p in [FOLDER / "__init__.py", *MODULES]]
    launchers = [n for n, _ in shipped[len(package):]]  # after what they run
    assert launchers == [f"{name}.py" for name in hosts.HOST_COMMANDS]
    assert hosts.HOST_PACKAGE == host.SHIPPED_AS


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


def import_fallbacks(path: Path) -> list[str]:
    """`file:line` of each handler of ImportError (or ModuleNotFoundError) in the module: the
    `try: from . import x / except ImportError: import x` a module needs when it is imported
    both as part of a package and as a plain file beside the others."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ExceptHandler) and node.type is not None:
            caught = node.type.elts if isinstance(node.type, ast.Tuple) else [node.type]
            if any(getattr(c, "id", "") in ("ImportError", "ModuleNotFoundError")
                   for c in caught):
                found.append(f"{path.name}:{node.lineno}")
    return found


def test_no_module_imports_its_neighbours_two_ways():
    """Issue 35: the host is one package on the host as here, so no module needs a fallback
    import (22 blocks of up to 26 lines before)."""
    assert [f for p in [FOLDER / "__init__.py", *MODULES] for f in import_fallbacks(p)] == []


def test_the_fallback_check_can_fail(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text("try:\n    from . import safefile\nexcept ImportError:\n"
                       "    import safefile\ntry:\n    import x\n"
                       "except (OSError, ModuleNotFoundError):\n    pass\n"
                       "try:\n    pass\nexcept ValueError:\n    pass\n")
    assert import_fallbacks(planted) == ["planted.py:3", "planted.py:7"]


def _shipped(tmp_path) -> Path:
    """What a host gets (hosts.write_host_files), alone in a folder of its own."""
    folder = tmp_path / "agent-0123456789ab"
    hosts.write_host_files(folder)
    return folder


def test_every_module_imports_as_a_plain_file_beside_the_others(tmp_path):
    """As on an instance: the shipped files alone (the package's modules beside each other in
    its folder), a python without site-packages (-S) or the environment (-I), so neither
    cloudtrain nor any third-party package can be found: every module imports as a module of
    the package cloudtrain_host."""
    folder = _shipped(tmp_path)
    names = sorted(NEIGHBOURS)
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import importlib\n"
            "for name in sys.argv[3:]:\n"
            "    importlib.import_module(sys.argv[2] + '.' + name)\n"
            "assert 'cloudtrain' not in sys.modules\n"
            "print(' '.join(sorted(m.split('.')[1] for m in sys.modules\n"
            "                      if m.startswith(sys.argv[2] + '.'))))\n")
    done = subprocess.run([sys.executable, "-I", "-S", "-c", code, str(folder),
                           hosts.HOST_PACKAGE, *names],
                          cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == names


@pytest.mark.parametrize("command", hosts.HOST_COMMANDS)
def test_each_command_runs_from_its_launcher_with_nothing_else(tmp_path, command):
    """`python3 <folder>/<command>.py` with too few arguments, from another folder, -I -S:
    the module runs as its main module (its own usage line, exit code 1 or 2), never an
    ImportError."""
    folder = _shipped(tmp_path)
    done = subprocess.run([sys.executable, "-I", "-S", str(folder / f"{command}.py")],
                          cwd="/", capture_output=True, text=True, timeout=60)
    said = done.stdout + done.stderr
    assert done.returncode in (1, 2) and "usage" in said.lower(), said
    assert "Traceback" not in said and f"{command}.py" in said
