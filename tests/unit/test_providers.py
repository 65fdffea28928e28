"""The provider contract (cloudtrain/providers/base.py, issue 26): LocalProvider is a Provider
and AWSProvider a CloudProvider, verb by verb, with the same parameters and compatible types;
every verb called on a provider anywhere in cloudtrain/ is in the contract, and the contract
lists nothing that nobody calls."""

from __future__ import annotations

import ast
import inspect
import types
import typing
from pathlib import Path

import pytest

import cloudtrain
from cloudtrain import config
from cloudtrain.providers import base
from cloudtrain.providers.aws import AWSProvider
from cloudtrain.providers.local import LocalProvider

PACKAGE = Path(cloudtrain.__file__).resolve().parent


def members(protocol) -> dict[str, object]:
    """The contract's verbs and attributes: {name: the Protocol's function, or its type}."""
    found: dict[str, object] = {}
    for klass in reversed(protocol.__mro__):
        if klass.__module__ != base.__name__:
            continue
        hints = typing.get_type_hints(klass)
        found.update({n: hints[n] for n in vars(klass).get("__annotations__", {})})
        found.update({n: f for n, f in vars(klass).items()
                      if inspect.isfunction(f) and not n.startswith("_")})
    return found


def _union(hint) -> tuple:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return typing.get_args(hint)
    return (hint,)


def compatible(want, got, returned: bool) -> bool:
    """Whether an implementation's type `got` fits the contract's `want`: a return type may
    narrow (SSHHost for Host), and so may a parameter (a provider is handed back the hosts
    it made); anything else must be the same kind of thing."""
    if want is got or object in (want, got) or typing.Any in (want, got):
        return want is not object or returned or got is object
    wants, gots = _union(want), _union(got)
    if len(wants) > 1 or len(gots) > 1:
        return all(any(compatible(w, g, returned) for w in wants) for g in gots) if returned \
            else all(any(compatible(w, g, returned) for g in gots) for w in wants)
    w_origin, g_origin = typing.get_origin(want), typing.get_origin(got)
    if w_origin or g_origin:
        if (w_origin or want) is not (g_origin or got):
            return False
        w_args, g_args = typing.get_args(want), typing.get_args(got)
        return not w_args or not g_args or (len(w_args) == len(g_args) and all(
            compatible(w, g, returned) for w, g in zip(w_args, g_args)))
    if isinstance(want, type) and isinstance(got, type):
        return issubclass(got, want) or (not returned and issubclass(want, got))
    return False


def test_compatible_refuses_what_does_not_fit():
    """The check below can fail: a wider return, another container, another class."""
    from cloudtrain.hosts import Host
    from cloudtrain.ssh_host import SSHHost

    assert compatible(Host, SSHHost, returned=True)
    assert not compatible(SSHHost, Host, returned=True)
    assert not compatible(list[str], dict[str, str], returned=True)
    assert not compatible(str | None, int, returned=True)
    assert not compatible(int, str, returned=False)
    assert compatible(dict | None, dict | None, returned=False)


@pytest.mark.parametrize("provider, protocol", [
    (LocalProvider(config.Settings()), base.Provider),
    (AWSProvider(config.Settings()), base.Provider),
    (AWSProvider(config.Settings()), base.CloudProvider),
], ids=["local", "aws", "aws-cloud"])
def test_each_provider_has_every_verb_of_its_contract_with_compatible_signatures(provider,
                                                                                 protocol):
    problems = []
    for name, want in members(protocol).items():
        if not hasattr(provider, name):
            problems.append(f"{name}: missing")
            continue
        got = getattr(provider, name)
        if not inspect.isfunction(want):  # an attribute: a value of its type
            if not isinstance(got, want):
                problems.append(f"{name}: {got!r} is not a {want.__name__}")
            continue
        expected = [(p.name, p.kind, p.default) for p in
                    list(inspect.signature(want).parameters.values())[1:]]
        found = [(p.name, p.kind, p.default) for p in inspect.signature(got).parameters.values()]
        if found != expected:
            problems.append(f"{name}: parameters {found} where the contract has {expected}")
            continue
        wanted, given = typing.get_type_hints(want), typing.get_type_hints(got)
        for key, hint in wanted.items():
            if key in given and not compatible(hint, given[key], key == "return"):
                problems.append(f"{name}: {key} is {given[key]}, the contract's {hint}")
    assert not problems, "\n".join(problems)


def _is_provider(node: ast.AST) -> bool:
    """A value that is a provider, by how cloudtrain names one: `provider`, `c.provider`,
    `aws_provider`, or `providers.get(...)` itself."""
    if isinstance(node, ast.Name):
        return "provider" in node.id.lower() and node.id != "providers"
    if isinstance(node, ast.Attribute):
        return "provider" in node.attr.lower() and node.attr != "providers"
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
        node.func.attr == "get" and isinstance(node.func.value, ast.Name) and \
        node.func.value.id == "providers"


def called_verbs() -> dict[str, list[str]]:
    """Every attribute used on a provider in cloudtrain/ outside providers/: {verb: [where]}."""
    found: dict[str, list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if "providers" in path.relative_to(PACKAGE).parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and _is_provider(node.value):
                where = f"{path.relative_to(PACKAGE.parent)}:{node.lineno}"
                found.setdefault(node.attr, []).append(where)
    return found


# Verbs declared ahead of their caller, each with the slice that calls it; a verb leaves this
# list when that slice lands (the test below then holds it to being called).
NOT_YET_CALLED: dict[str, str] = {}


def test_every_verb_called_on_a_provider_is_in_the_contract_and_no_other():
    called = called_verbs()
    assert {"acquire", "release", "read_dataset", "orphans"} <= set(called)  # the scan sees
    listed = members(base.CloudProvider)
    unknown = {verb: where for verb, where in called.items() if verb not in listed}
    assert not unknown, f"called on a provider, not in providers/base.py: {unknown}"
    unused = sorted(set(listed) - set(called) - set(NOT_YET_CALLED))
    assert not unused, f"in providers/base.py, used nowhere: {unused}"
