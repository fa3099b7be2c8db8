"""Policy digestion: what the LauncherConfigs and LauncherPopulationPolicies ask of each (Node, LC) key.

One worker feeds every LauncherConfig, policy and Node change through a `Digest`, so it has a single
writer; key workers only read it. A key's desired count is the largest `launcherCount` among the
policies that select its Node and name its LauncherConfig (0 when none does), or hands-off (None) while
the LauncherConfig is missing or cannot make a launcher Pod: then no launcher is created or deleted.
"""

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import TypeAdapter, ValidationError

from api.crds import CountForLauncher, LauncherConfig
from api.selectors import EnhancedNodeSelector
from controller.conditions import Fault
from controller.launcher_template import Pod, TemplateError, node_independent_pod
from controller.populator.key import LauncherKey
from controller.populator.nodes import NodeFacts

_COUNTS = TypeAdapter(list[CountForLauncher])


@dataclass(frozen=True)
class ConfigDigest:
    """A LauncherConfig's node-independent launcher Pod and its template hash, or why there is none."""

    template: Pod | None = None
    template_hash: str = ""
    error: str | None = None


@dataclass(frozen=True)
class PolicyDigest:
    """A policy's parsed selector (None: it selects no Node) and counts, and its own problems."""

    selector: EnhancedNodeSelector | None
    counts: Mapping[str, int]
    errors: tuple[str, ...]


@dataclass(frozen=True)
class Target:
    """What one key should have: `count` launchers made from `template`; none made or removed while its Node is
    `cordoned` (NodeFacts)."""

    count: int
    template: Pod
    template_hash: str
    cordoned: bool = False


def describe(error: ValidationError) -> str:
    """A one-line account of a pydantic error, for a status: `where: what; ...`."""
    return "; ".join(f"{'.'.join(map(str, e['loc'])) or 'object'}: {e['msg']}" for e in error.errors())


def digest_config(
    config: Mapping[str, Any], token_secret: str | None, runtime_class: str | None = None
) -> ConfigDigest:
    name = config["metadata"]["name"]
    try:
        template, template_hash = node_independent_pod(LauncherConfig.from_k8s(config), token_secret, runtime_class)
    except ValidationError as error:
        return ConfigDigest(error=f"LauncherConfig {name}: {describe(error)}")
    except TemplateError as error:
        return ConfigDigest(error=str(error))
    return ConfigDigest(template, template_hash)


def digest_policy(policy: Mapping[str, Any]) -> PolicyDigest:
    """Selector and counts are parsed apart, so a bad selector still leaves the references checked."""
    spec = policy.get("spec") or {}
    errors: list[str] = []
    selector: EnhancedNodeSelector | None = None
    try:
        selector = EnhancedNodeSelector.model_validate(spec.get("enhancedNodeSelector") or {})
    except ValidationError as error:
        errors.append(f"invalid enhancedNodeSelector: {describe(error)}")
    counts: dict[str, int] = {}
    try:
        counts = {
            c.launcher_config_name: c.launcher_count
            for c in _COUNTS.validate_python(spec.get("countForLauncher") or [])
        }
    except ValidationError as error:
        errors.append(f"invalid countForLauncher: {describe(error)}")
    return PolicyDigest(selector, counts, tuple(errors))


def _identity(config: ConfigDigest | None) -> tuple[str | None, str] | None:
    """What keys and policies depend on: existence, validity and template hash."""
    return None if config is None else (config.error, config.template_hash)


class Digest:
    """The digested LauncherConfigs, policies and Nodes, and each Node's counts per LauncherConfig."""

    def __init__(self) -> None:
        self._configs: dict[str, ConfigDigest] = {}
        self._policies: dict[str, PolicyDigest] = {}
        self._nodes: dict[str, NodeFacts] = {}
        # node -> LauncherConfig -> largest count among the policies that select the node and name it.
        self._counts: dict[str, dict[str, int]] = {}

    # ----- reading (key workers)

    def target(self, key: LauncherKey) -> Target | None:
        """What the key should have; None for hands-off."""
        config = self._configs.get(key.config)
        if config is None or config.template is None:
            return None
        node = self._nodes.get(key.node)
        count = self._counts.get(key.node, {}).get(key.config, 0)
        return Target(count, config.template, config.template_hash, node is not None and node.cordoned)

    def config_error(self, name: str) -> str | None:
        config = self._configs.get(name)
        return config.error if config is not None else None

    def keys_for_config(self, config: str) -> set[LauncherKey]:
        return {LauncherKey(node, config) for node, counts in self._counts.items() if config in counts}

    def policies_naming(self, config: str) -> list[str]:
        return sorted(name for name, policy in self._policies.items() if config in policy.counts)

    def policy_problems(self, name: str) -> list[Fault]:
        """What the policy's status should report: its own problems, then its unusable references."""
        policy = self._policies[name]
        problems = [Fault("InvalidSpec", error) for error in policy.errors]
        for config in policy.counts:
            digest = self._configs.get(config)
            where = f'LauncherConfig "{config}" referenced in CountForLauncher'
            if digest is None:
                problems.append(Fault("LauncherConfigNotFound", f"{where} does not exist"))
            elif digest.error is not None:
                problems.append(Fault("LauncherConfigInvalid", f"{where} is malformed: {digest.error}"))
        return problems

    def policy_asks(self, name: str) -> dict[LauncherKey, int]:
        """The launchers the policy asks for: its count per (selected Node, LauncherConfig); a cordoned Node's
        launchers are not asked for (it is being drained, or waits for its maintenance to end)."""
        policy = self._policies[name]
        if policy.selector is None:
            return {}
        selector = policy.selector
        selected = [node for node, facts in self._nodes.items() if facts.selected_by(selector) and not facts.cordoned]
        return {LauncherKey(node, config): count for node in selected for config, count in policy.counts.items()}

    # ----- writing (the digest worker)

    def set_config(self, name: str, digest: ConfigDigest | None) -> bool:
        """Record a LauncherConfig (None: deleted); True when it appeared, disappeared, or changed validity
        or template hash, which is what its keys and the policies naming it depend on."""
        old = self._configs.pop(name, None)
        if digest is not None:
            self._configs[name] = digest
        return _identity(old) != _identity(digest)

    def set_policy(self, name: str, digest: PolicyDigest | None) -> set[LauncherKey]:
        """Record a policy (None: deleted); returns the keys whose policy count changed."""
        self._policies.pop(name, None)
        if digest is not None:
            self._policies[name] = digest
        return self._recount(list(self._nodes))

    def set_node(self, name: str, facts: NodeFacts | None) -> set[LauncherKey]:
        """Record a Node (None: deleted); returns the keys whose policy count changed, and all of the Node's keys
        when it was cordoned or uncordoned."""
        old = self._nodes.pop(name, None)
        if facts is not None:
            self._nodes[name] = facts
        changed = self._recount([name])
        if old is not None and facts is not None and old.cordoned != facts.cordoned:
            changed |= {LauncherKey(name, config) for config in self._counts.get(name, {})}
        return changed

    def _recount(self, nodes: Iterable[str]) -> set[LauncherKey]:
        changed: set[LauncherKey] = set()
        for node in nodes:
            old = self._counts.pop(node, {})
            facts = self._nodes.get(node)
            new = self._node_counts(facts) if facts is not None else {}
            if new:
                self._counts[node] = new
            changed |= {LauncherKey(node, c) for c in old.keys() | new.keys() if old.get(c) != new.get(c)}
        return changed

    def _node_counts(self, node: NodeFacts) -> dict[str, int]:
        counts: dict[str, int] = {}
        for policy in self._policies.values():
            if policy.selector is not None and node.selected_by(policy.selector):
                for config, count in policy.counts.items():
                    counts[config] = max(counts.get(config, 0), count)
        return counts
