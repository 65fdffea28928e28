"""Imports only go down (issue 26): every module of cloudtrain/ sits on one layer, and imports
only from layers below its own, or from its own layer without a cycle. Imports made inside
functions count as much as those at the top: they once closed a circle through 30 files.

The layers, top to bottom, are LAYERS below (ARCHITECTURE.md draws them). A module not named
there fails the test: a new module says where it belongs. The last tests plant an upward
import, a cycle and an unplaced module in a copy of the package, so that this check is known
to fail when it should.
"""

from __future__ import annotations

import ast
import functools
import re
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Top to bottom. A name ending in "." is a package: every module under it (and its
# __init__), unless a longer name places one of them elsewhere.
LAYERS: list[tuple[str, ...]] = [
    ("cloudtrain.__main__", "cloudtrain.cli."),
    ("cloudtrain.dashboard",),
    ("cloudtrain.launch_check_recovery", "cloudtrain.launch_check_nodes"),
    ("cloudtrain.launch_check", "cloudtrain.check", "cloudtrain.job_template"),
    ("cloudtrain.launch_check_teardown",),
    ("cloudtrain.launch_check_steps",),
    # the lifecycle, one stage a layer (lifecycle/__init__.py lists the same order)
    ("cloudtrain.lifecycle.recovery",),
    ("cloudtrain.lifecycle.inspect",),
    ("cloudtrain.lifecycle.stop",),
    ("cloudtrain.lifecycle.launch",),
    ("cloudtrain.lifecycle.plan",),
    ("cloudtrain.lifecycle.sources",),
    ("cloudtrain.lifecycle.abort",),
    ("cloudtrain.lifecycle.watch",),
    ("cloudtrain.lifecycle.kept",),
    ("cloudtrain.lifecycle.autoscaled",),
    ("cloudtrain.lifecycle.collect",),
    ("cloudtrain.lifecycle.scripts",),
    ("cloudtrain.lifecycle.group",),
    ("cloudtrain.lifecycle.supervisor",),
    ("cloudtrain.lifecycle.attempts",),
    ("cloudtrain.lifecycle.lease",),
    ("cloudtrain.lifecycle.secrets", "cloudtrain.lifecycle"),
    # what a launch is made of, and the commands that read the store
    ("cloudtrain.spec", "cloudtrain.jobfile", "cloudtrain.estimate", "cloudtrain.history",
     "cloudtrain.completion", "cloudtrain.dataprep", "cloudtrain.cmdline"),
    ("cloudtrain.launch_options", "cloudtrain.job_env"),
    # what the commands print; the recipes; the cost ledger
    ("cloudtrain.job_views", "cloudtrain.catalog_views", "cloudtrain.plots",
     "cloudtrain.curves", "cloudtrain.ledger"),
    ("cloudtrain.providers.",),
    # the AWS wing inside: the thin provider on top, the session and the job store's records
    # at the bottom (aws/__init__.py lists the same concerns)
    ("cloudtrain.providers.aws.provider", "cloudtrain.providers.aws"),
    ("cloudtrain.providers.aws.plan", "cloudtrain.providers.aws.cloud_account",
     "cloudtrain.providers.aws.budget_plan"),
    ("cloudtrain.providers.aws.cluster", "cloudtrain.providers.aws.acquire"),
    ("cloudtrain.providers.aws.group_launch", "cloudtrain.providers.aws.inventory"),
    ("cloudtrain.providers.aws.groups", "cloudtrain.providers.aws.datasets",
     "cloudtrain.providers.aws.results", "cloudtrain.providers.aws.boot",
     "cloudtrain.providers.aws.volumes", "cloudtrain.providers.aws.host_setup",
     "cloudtrain.providers.aws.instance_types"),
    ("cloudtrain.providers.aws.instances", "cloudtrain.providers.aws.bootstrap",
     "cloudtrain.providers.aws.placement"),
    ("cloudtrain.providers.aws.network", "cloudtrain.providers.aws.images",
     "cloudtrain.providers.aws.pricing", "cloudtrain.providers.aws.account",
     "cloudtrain.providers.aws.job_role", "cloudtrain.providers.aws.fis",
     "cloudtrain.providers.aws.spot_scores", "cloudtrain.providers.aws.reservations"),
    ("cloudtrain.providers.aws.session", "cloudtrain.providers.aws.jobbundle",
     "cloudtrain.providers.aws.jobstore_fetch", "cloudtrain.providers.aws.jobstore_attempts"),
    ("cloudtrain.providers.aws.jobstore", "cloudtrain.providers.aws.errors",
     "cloudtrain.providers.aws.cache", "cloudtrain.providers.aws.hostkeys",
     "cloudtrain.providers.aws.tags"),
    ("cloudtrain.providers.base",),
    ("cloudtrain.host_kinds",),
    ("cloudtrain.local_host", "cloudtrain.ssh_host", "cloudtrain.port_forward"),
    ("cloudtrain.hosts", "cloudtrain.ssh", "cloudtrain.nodes"),
    ("cloudtrain.datasets", "cloudtrain.preflight", "cloudtrain.progress",
     "cloudtrain.cells"),
    ("cloudtrain.state",),
    ("cloudtrain.job_spec",),
    ("cloudtrain.recipes",),
    ("cloudtrain.catalog", "cloudtrain.cost", "cloudtrain.gitignore", "cloudtrain.hostdata",
     "cloudtrain.deadline"),
    ("cloudtrain.state_schema", "cloudtrain.state_columns", "cloudtrain.state_check",
     "cloudtrain.state_query", "cloudtrain.state_runs"),
    ("cloudtrain.config",),
    ("cloudtrain.datasources",),
    ("cloudtrain.errors", "cloudtrain.market"),
    ("cloudtrain.host.",),
    ("cloudtrain",),
]


def modules(root: Path = ROOT) -> dict[str, Path]:
    """Every module of the package under `root`, by dotted name (a package by its own)."""
    out = {}
    for path in sorted((root / "cloudtrain").rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def layer_of(name: str) -> int | None:
    """The index in LAYERS of the longest entry that names the module, or None."""
    best, where = -1, None
    for i, group in enumerate(LAYERS):
        for entry in group:
            package = entry.endswith(".")
            hit = name == entry or (package and (name.startswith(entry) or name == entry[:-1]))
            if hit and len(entry) > best:
                best, where = len(entry), i
    return where


def imports_of(name: str, path: Path, known: set[str]) -> list[tuple[str, int]]:
    """(module imported, line) for every import of a cloudtrain module in `path`, wherever it
    is made (at the top, in a function, under `if TYPE_CHECKING`); `from . import x` and
    `from .pkg import x` where x is a module count as that module, `import a.b` as a.b."""
    return _imports(name, path.name == "__init__.py", path.read_text(), frozenset(known))


@functools.cache  # the copies the last tests plant in differ from the package in one file
def _imports(name: str, is_package: bool, text: str, known: frozenset[str]):
    tree = ast.parse(text)
    package = name if is_package else name.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                found.append((sub if sub in known else target, node.lineno))
    return [(m, line) for m, line in found if m in known and m != name]


def graph(root: Path = ROOT) -> dict[str, list[tuple[str, int]]]:
    """Each module's imports of the package's modules."""
    mods = modules(root)
    return {name: imports_of(name, path, set(mods)) for name, path in mods.items()}


def unplaced(root: Path = ROOT) -> list[str]:
    return [m for m in modules(root) if layer_of(m) is None]


def upward(edges: dict[str, list[tuple[str, int]]]) -> list[str]:
    """Each import of a higher layer, as "module:line imports target"."""
    ups = []
    for name, targets in edges.items():
        mine = layer_of(name)
        for target, line in targets:
            theirs = layer_of(target)
            if mine is not None and theirs is not None and theirs < mine:
                ups.append(f"{name}:{line} imports {target} (a higher layer)")
    return ups


def cycles(edges: dict[str, list[tuple[str, int]]]) -> list[str]:
    """Each cycle (a strongly connected component of more than one module), as the arrows
    inside it: "a:line -> b"."""
    out = {m: sorted({t for t, _ in ts}) for m, ts in edges.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v):  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in out[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in out:
        if v not in index:
            visit(v)
    return [" ; ".join(f"{a}:{line} -> {b}" for a in comp for b, line in edges[a] if b in comp)
            for comp in found]


@functools.cache
def real_graph():
    return graph()


def test_every_module_has_a_layer():
    missing = unplaced()
    assert not missing, f"modules on no layer (add them to LAYERS): {missing}"


def test_no_import_goes_up():
    ups = upward(real_graph())
    assert not ups, "\n".join(ups)


def test_no_cycle():
    found = cycles(real_graph())
    assert not found, "cycles:\n" + "\n".join(found)


def test_every_layer_entry_names_a_module():
    """A stale entry (a module since renamed) would place nothing and hide the new name."""
    names = set(modules())
    stale = [e for group in LAYERS for e in group
             if not (e in names or (e.endswith(".") and any(n.startswith(e) for n in names)))]
    assert not stale, f"LAYERS entries that name no module: {stale}"


def _drawn_as(entry: str) -> str:
    """How ARCHITECTURE.md names a LAYERS entry: a module by its last name, a package with /."""
    special = {"cloudtrain": "cloudtrain/__init__", "cloudtrain.lifecycle": "lifecycle/__init__",
               "cloudtrain.providers.aws": "aws/__init__",
               "cloudtrain.providers.base": "providers/base"}
    if entry in special:
        return special[entry]
    if entry.startswith("cloudtrain.providers.aws."):
        return "aws/" + entry.rpartition(".")[2]
    name = entry.removeprefix("cloudtrain.").removeprefix("lifecycle.")
    return name[:-1] + "/" if name.endswith(".") else name


def test_architecture_md_draws_these_layers():
    """ARCHITECTURE.md draws LAYERS top to bottom: every entry, each below the layers above."""
    text = (ROOT / "ARCHITECTURE.md").read_text()
    block = text[text.index("## The layers"):text.index("## The host side")]
    drawn = re.sub(r"`[^`]*`", "", "\n".join(line for line in block.splitlines()
                                             if line.startswith("    ")))
    where = {}
    for group in LAYERS:
        for entry in group:
            found = re.search(rf"(?<![\w./]){re.escape(_drawn_as(entry))}(?!\w)", drawn)
            assert found, f"ARCHITECTURE.md does not draw {entry} as {_drawn_as(entry)}"
            where[entry] = found.start()
    above = -1
    for group in LAYERS:
        assert min(where[e] for e in group) > above, f"ARCHITECTURE.md draws {group} too high"
        above = max(where[e] for e in group)


# -- the check can fail ---------------------------------------------------------------------

@pytest.fixture
def copy(tmp_path):
    """A copy of the package's sources, to plant imports in."""
    shutil.copytree(ROOT / "cloudtrain", tmp_path / "cloudtrain",
                    ignore=lambda d, names: [n for n in names
                                             if not (n.endswith(".py") or (Path(d) / n).is_dir())])
    return tmp_path


def plant(root: Path, module: str, line: str) -> None:
    """Add `line` inside a new function at the end of `module` (a file under root)."""
    path = root / module
    path.write_text(path.read_text() + "\n\ndef _planted():\n    " + line + "\n")


@pytest.mark.parametrize("module, line, expected", [
    ("cloudtrain/config.py", "from .lifecycle import launch",
     "cloudtrain.config:{n} imports cloudtrain.lifecycle.launch"),
    ("cloudtrain/host/agent.py", "from .. import state",
     "cloudtrain.host.agent:{n} imports cloudtrain.state"),
    ("cloudtrain/errors.py", "import cloudtrain.cli",
     "cloudtrain.errors:{n} imports cloudtrain.cli"),
    ("cloudtrain/providers/aws/tags.py", "from ...lifecycle.watch import refresh",
     "cloudtrain.providers.aws.tags:{n} imports cloudtrain.lifecycle.watch"),
    ("cloudtrain/lifecycle/group.py", "from . import launch",
     "cloudtrain.lifecycle.group:{n} imports cloudtrain.lifecycle.launch"),
    # inside the AWS wing: the session asking a concern module, a concern asking the provider
    ("cloudtrain/providers/aws/session.py", "from . import inventory",
     "cloudtrain.providers.aws.session:{n} imports cloudtrain.providers.aws.inventory"),
    ("cloudtrain/providers/aws/network.py", "from .provider import AWSProvider",
     "cloudtrain.providers.aws.network:{n} imports cloudtrain.providers.aws.provider"),
    ("cloudtrain/providers/aws/instances.py", "from .groups import group_members",
     "cloudtrain.providers.aws.instances:{n} imports cloudtrain.providers.aws.groups"),
])
def test_the_check_finds_an_upward_import(copy, module, line, expected):
    plant(copy, module, line)
    n = len((copy / module).read_text().splitlines())
    assert upward(graph(copy)) == [expected.format(n=n) + " (a higher layer)"]


def test_the_check_finds_a_cycle_within_a_layer(copy):
    """spec imports jobfile; jobfile importing spec back is on the same layer, no upward
    import, but a cycle, named by its arrows."""
    plant(copy, "cloudtrain/jobfile.py", "from . import spec")
    edges = graph(copy)
    assert upward(edges) == []
    found = cycles(edges)
    assert len(found) == 1
    assert "cloudtrain.jobfile:" in found[0] and "-> cloudtrain.spec" in found[0]
    assert "cloudtrain.spec:" in found[0] and "-> cloudtrain.jobfile" in found[0]


def test_the_check_finds_a_module_on_no_layer(copy):
    (copy / "cloudtrain" / "newthing.py").write_text("")
    (copy / "cloudtrain" / "lifecycle" / "newstage.py").write_text("")
    new = set(unplaced(copy)) - set(unplaced())
    assert new == {"cloudtrain.lifecycle.newstage", "cloudtrain.newthing"}
