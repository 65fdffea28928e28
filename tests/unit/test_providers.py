"""The provider contract (cloudtrain/providers/base.py, issues 26 and 35): LocalProvider is a
Provider, AWSProvider a Provider with every capability and its account a CloudAccount, verb by
verb, with the same parameters and compatible types; every verb called on a provider (or an
account) anywhere in cloudtrain/ is in the contract, and the contract lists nothing that nobody
calls. The contract stays small: a core of at most 15 verbs that name no AWS service or
concept, no class in cloudtrain/ with more than 40 methods, no mixins in providers/, and a
local backend that claims no capability it does not have."""

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
    *[(AWSProvider(config.Settings()), cap) for cap in base.CAPABILITIES],
    (AWSProvider(config.Settings()).account, base.CloudAccount),
], ids=["local", "aws", *[f"aws-{cap.__name__}" for cap in base.CAPABILITIES], "aws-account"])
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


def _is_account(node: ast.AST) -> bool:
    """A value that is a cloud provider's account: `account`, `cloud` (check.py), or
    `<anything>.account` itself."""
    if isinstance(node, ast.Name):
        return node.id in ("account", "cloud")
    return isinstance(node, ast.Attribute) and node.attr == "account"


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


def called_verbs(on=_is_provider) -> dict[str, list[str]]:
    """Every attribute used on a provider (`on`: or an account) in cloudtrain/ outside
    providers/: {verb: [where]}."""
    found: dict[str, list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if "providers" in path.relative_to(PACKAGE).parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and on(node.value):
                where = f"{path.relative_to(PACKAGE.parent)}:{node.lineno}"
                found.setdefault(node.attr, []).append(where)
    return found


# Verbs declared ahead of their caller, each with the slice that calls it; a verb leaves this
# list when that slice lands (the test below then holds it to being called).
NOT_YET_CALLED: dict[str, str] = {}


def provider_members() -> dict[str, object]:
    """The verbs and attributes of the core and of every capability."""
    found = members(base.Provider)
    for cap in base.CAPABILITIES:
        found.update(members(cap))
    return found


def test_every_verb_called_on_a_provider_is_in_the_contract_and_no_other():
    called = called_verbs()
    assert {"acquire", "release", "orphans", "shutdown", "account"} <= set(called)  # the scan
    listed = provider_members()
    unknown = {verb: where for verb, where in called.items() if verb not in listed}
    assert not unknown, f"called on a provider, not in providers/base.py: {unknown}"
    unused = sorted(set(listed) - set(called) - set(NOT_YET_CALLED) - {"name"})
    assert not unused, f"in providers/base.py, used nowhere: {unused}"


def test_every_verb_called_on_an_account_is_in_the_contract_and_no_other():
    called = called_verbs(_is_account)
    assert {"region", "owner", "ensure_key", "dataset_size"} <= set(called)  # the scan sees
    listed = members(base.CloudAccount)
    unknown = {verb: where for verb, where in called.items() if verb not in listed}
    assert not unknown, f"called on an account, not in providers/base.py: {unknown}"
    unused = sorted(set(listed) - set(called))
    assert not unused, f"CloudAccount in providers/base.py, used nowhere: {unused}"


# -- the contract's size and shape (issue 35) ------------------------------------------------

CORE_MAX = 15
METHODS_MAX = 40
# Names of AWS services and concepts, as words of a verb's name (split at "_").
AWS_WORDS = {"aws", "ec2", "s3", "efa", "iam", "ebs", "ami", "asg", "sts", "autoscaling",
             "auto", "scaling", "ssm", "vpc", "arn", "imds"}


def verbs(protocol) -> list[str]:
    """A Protocol's own verbs (its functions, not its attributes)."""
    return [n for n, f in members(protocol).items() if inspect.isfunction(f)]


def aws_words(name: str) -> list[str]:
    return [w for w in name.lower().split("_") if w in AWS_WORDS]


def test_the_core_provider_has_at_most_15_verbs():
    core = verbs(base.Provider)
    assert {"plan", "preflight", "acquire", "release", "cleanup"} <= set(core)
    assert len(core) <= CORE_MAX, f"Provider has {len(core)} verbs: {sorted(core)}"
    assert "acquire_nodes" not in core  # one verb acquires 1..N nodes


def test_no_verb_of_the_contract_names_an_aws_service_or_concept():
    assert aws_words("ec2_quota") == ["ec2"] and aws_words("efa_environment") == ["efa"]
    assert aws_words("delete_auto_scaling_group") and not aws_words("instance_states")
    named = {f"{proto.__name__}.{verb}": aws_words(verb)
             for proto in (base.Provider, *base.CAPABILITIES, base.CloudAccount)
             for verb in verbs(proto)}
    assert len(named) > 40  # the check saw every Protocol
    bad = {verb: words for verb, words in named.items() if words}
    assert not bad, f"verbs that name AWS: {bad}"


def test_capabilities_are_runtime_checkable_protocols_and_aws_has_each():
    aws = AWSProvider(config.Settings())
    for cap in base.CAPABILITIES:
        assert getattr(cap, "_is_runtime_protocol", False), cap
        assert not set(verbs(cap)) & set(verbs(base.Provider)), cap  # none repeats the core
        assert isinstance(aws, cap), cap.__name__
    assert isinstance(aws, base.Provider) and isinstance(aws.account, base.CloudAccount)


def test_the_local_provider_implements_the_core_and_no_capability():
    local = LocalProvider(config.Settings())
    assert isinstance(local, base.Provider)
    claimed = [cap.__name__ for cap in base.CAPABILITIES if isinstance(local, cap)]
    assert not claimed, f"LocalProvider claims {claimed}"
    public = {n for n, f in inspect.getmembers(LocalProvider, inspect.isfunction)
              if not n.startswith("_")}
    assert public <= set(verbs(base.Provider)), public - set(verbs(base.Provider))
    # No verb there only refuses: nothing says "not supported" or has no Auto Scaling group.
    source = inspect.getsource(LocalProvider)
    for refusal in ("not supported", "no Auto Scaling", "AWSProvider", "from .aws"):
        assert refusal not in source, refusal


def test_able_finds_the_backends_with_a_capability_and_names_none_itself():
    """What `down --all` sweeps, `status --refresh` asks and `down` deletes groups with is
    chosen by capability (providers.able), not by a backend's name in the lifecycle."""
    from cloudtrain import providers

    settings = config.Settings()
    assert [name for name, _ in providers.able(base.Provider, settings)] == list(config.BACKENDS)
    for cap in (base.Sweeps, base.CloudRecovery):
        found = providers.able(cap, settings)
        assert [name for name, _ in found] == ["aws"], cap.__name__
        assert all(isinstance(p, cap) for _, p in found)
    stop_source = (Path(cloudtrain.__file__).parent / "lifecycle" / "stop.py").read_text()
    assert '"aws"' not in stop_source


def class_methods(root: Path) -> dict[str, int]:
    """{path:class: its methods, its own and those of its bases defined in the package}, by
    the AST of every module under `root` (a base is found by its name)."""
    defined: dict[str, list[tuple[str, set[str], list[str]]]] = {}
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                own = {n.name for n in node.body
                       if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
                bases = [b.id if isinstance(b, ast.Name) else b.attr
                         if isinstance(b, ast.Attribute) else "" for b in node.bases]
                defined.setdefault(node.name, []).append((str(path), own, bases))

    def methods(name: str, seen: tuple = ()) -> set[str]:
        out: set[str] = set()
        for _, own, bases in defined.get(name, []):
            out |= own
            for b in bases:
                if b in defined and b not in seen:
                    out |= methods(b, seen + (name,))
        return out

    return {f"{path}:{name}": len(methods(name)) for name, found in defined.items()
            for path, _, _ in found}


def test_no_class_in_cloudtrain_has_more_than_40_methods(tmp_path):
    big = "class Big:\n" + "".join(f"    def m{i}(self): pass\n" for i in range(30))
    (tmp_path / "big.py").write_text(big + "class Bigger(Big):\n" + "".join(
        f"    def n{i}(self): pass\n" for i in range(11)))
    assert class_methods(tmp_path)[f"{tmp_path / 'big.py'}:Bigger"] == 41  # the check can fail
    counted = class_methods(PACKAGE)
    assert counted[f"{PACKAGE / 'providers/aws/provider.py'}:AWSProvider"] > 15  # it sees them
    over = {name: n for name, n in counted.items() if n > METHODS_MAX}
    assert not over, f"classes with more than {METHODS_MAX} methods: {over}"
    # By introspection too, with what the providers inherit.
    for cls in (AWSProvider, LocalProvider, type(AWSProvider(config.Settings()).account)):
        n = len([m for m in dir(cls) if inspect.isfunction(getattr(cls, m))
                 and getattr(cls, m).__module__.startswith("cloudtrain")])
        assert n <= METHODS_MAX, (cls.__name__, n)


def test_no_mixin_classes_in_providers():
    """A class in providers/ is a Protocol, an exception, or stands alone: none gets its
    verbs from another class (AWSProvider delegates to modules, not to bases)."""
    import importlib
    import pkgutil

    import cloudtrain.providers as providers_pkg

    checked, bad = 0, []
    for info in pkgutil.walk_packages(providers_pkg.__path__, "cloudtrain.providers."):
        module = importlib.import_module(info.name)
        for cls in vars(module).values():
            if not isinstance(cls, type) or cls.__module__ != module.__name__:
                continue
            checked += 1
            if "mixin" in cls.__name__.lower():
                bad.append(cls.__name__)
            elif getattr(cls, "_is_protocol", False) or issubclass(cls, BaseException):
                continue
            elif cls.__bases__ != (object,):
                bad.append(f"{cls.__name__}{cls.__bases__}")
    assert checked > 15
    assert not bad, f"mixins in providers/: {bad}"


def test_shared_gives_one_provider_per_backend_and_settings_and_only_within():
    """providers.shared(): `status` refreshes every job with the same provider (on AWS, one
    session: credentials resolved once); outside it each get() is a provider of its own, so
    nothing a command made lingers into the next (a test's moto, changed credentials)."""
    from cloudtrain import providers
    from cloudtrain.config import Settings

    assert providers.get("local") is not providers.get("local")
    mine, other = Settings(), Settings()
    with providers.shared():
        first = providers.get("local")
        assert providers.get("local") is first
        assert providers.get("local", mine) is providers.get("local", mine) is not first
        assert providers.get("local", other) is not providers.get("local", mine)
        with providers.shared():  # within another: the outer one's providers
            assert providers.get("local") is first
        assert providers.get("local") is first
    assert providers.get("local") is not first
