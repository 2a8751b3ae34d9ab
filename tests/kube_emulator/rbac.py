"""Identities and RBAC authorization, as the API server's RBAC authorizer decides them.

Requests carry an identity through their bearer token: the emulator's own token
(``emulator-token``, and requests with no token, as ``system:anonymous``) is a cluster admin,
like ``system:masters``;
a token issued by :meth:`Authorizer.issue` for a ServiceAccount is that account
(``system:serviceaccount:<ns>:<name>``, groups ``system:serviceaccounts`` and
``system:serviceaccounts:<ns>``, ``system:authenticated``), and every one of its requests is
checked against the Roles, ClusterRoles and their bindings in the store: ``apiGroups``,
``resources`` (``plural`` or ``plural/subresource``), ``verbs`` and ``resourceNames``, with ``*``.
Creating or changing a Role or ClusterRole also passes the escalation check: a requester may only
grant what it holds itself. Discovery paths (``/api``, ``/apis``, ``/version``) are open to every
authenticated identity, as ``system:discovery`` allows; an anonymous request gets only what
``system:public-info-viewer`` grants (``/version``, ``/healthz``, ``/livez``, ``/readyz``), and
discovery is 403 to it, as a default kube-apiserver answers. An unknown token is 401.

Not modelled: aggregated ClusterRoles, non-resource URL rules, ``escalate``/``bind`` verbs,
impersonation.
"""

from __future__ import annotations

import itertools
import secrets
from dataclasses import dataclass

from .errors import ApiError
from .resources import ResourceType

ADMIN_TOKEN = "emulator-token"
RBAC_GROUP = "rbac.authorization.k8s.io"


@dataclass(frozen=True)
class Identity:
    user: str
    groups: tuple[str, ...] = ()
    admin: bool = False


ADMIN = Identity("emulator-admin", ("system:masters", "system:authenticated"), admin=True)
# Requests without a token are anonymous, as on a real cluster: they hold only what a binding to
# system:anonymous or system:unauthenticated grants (none by default), so a client that forgot its
# credentials fails as it would against a real server instead of acting as an admin.
ANONYMOUS = Identity("system:anonymous", ("system:unauthenticated",))
# system:public-info-viewer's paths: what a default server answers without credentials
PUBLIC_PATHS = frozenset({"/version", "/healthz", "/livez", "/readyz"})
ADMIN_HEADERS = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


@dataclass(frozen=True)
class Attributes:
    """One request as the authorizer sees it."""

    verb: str
    group: str
    resource: str  # plural, or plural/subresource
    namespace: str | None
    name: str | None


def service_account(namespace: str, name: str) -> Identity:
    return Identity(
        f"system:serviceaccount:{namespace}:{name}",
        ("system:serviceaccounts", f"system:serviceaccounts:{namespace}", "system:authenticated"),
    )


def _matches(values: list[str], wanted: str) -> bool:
    return "*" in values or wanted in values


def _rule_allows(rule: dict, a: Attributes) -> bool:
    names = rule.get("resourceNames") or []
    return (
        _matches(rule.get("apiGroups") or [], a.group)
        and _matches(rule.get("resources") or [], a.resource)
        and _matches(rule.get("verbs") or [], a.verb)
        and (not names or (a.name is not None and a.name in names))
    )


def _subject_is(subject: dict, who: Identity, binding_ns: str | None) -> bool:
    kind = subject.get("kind")
    if kind == "ServiceAccount":
        ns = subject.get("namespace") or binding_ns
        return who.user == f"system:serviceaccount:{ns}:{subject.get('name')}"
    if kind == "User":
        return who.user == subject.get("name")
    return kind == "Group" and subject.get("name") in who.groups


class Authorizer:
    """Maps tokens to identities and decides requests from the RBAC objects in ``store``."""

    def __init__(self, store: object) -> None:
        self.store = store
        self.tokens: dict[str, Identity] = {ADMIN_TOKEN: ADMIN}

    def issue(self, namespace: str, name: str) -> str:
        """A bearer token for the ServiceAccount ``namespace/name`` (which need not exist yet)."""
        token = f"sa-{namespace}-{name}-{secrets.token_hex(8)}"
        self.tokens[token] = service_account(namespace, name)
        return token

    def identify(self, authorization: str | None) -> Identity:
        if not authorization:
            return ANONYMOUS
        token = authorization.removeprefix("Bearer ").strip()
        who = self.tokens.get(token)
        if who is None:
            raise ApiError(401, "Unauthorized", "Unauthorized")
        return who

    # ----- decisions --------------------------------------------------------------------------

    def _objects(self, plural: str, namespace: str | None) -> list[dict]:
        store = self.store
        rt = store.type_for(RBAC_GROUP, "v1", plural)  # type: ignore[attr-defined]
        return store.list(rt, namespace, lambda _o: True)[0]  # type: ignore[attr-defined]

    def _role_rules(self, ref: dict, namespace: str | None) -> list[dict]:
        plural = "clusterroles" if ref.get("kind") == "ClusterRole" else "roles"
        ns = None if plural == "clusterroles" else namespace
        for role in self._objects(plural, ns):
            if role["metadata"]["name"] == ref.get("name"):
                return role.get("rules") or []
        return []

    def rules_for(self, who: Identity, namespace: str | None) -> list[dict]:
        """Every rule ``who`` holds cluster-wide and (given a namespace) in ``namespace``."""
        rules: list[dict] = []
        for b in self._objects("clusterrolebindings", None):
            if any(_subject_is(s, who, None) for s in b.get("subjects") or []):
                rules += self._role_rules(b.get("roleRef") or {}, None)
        if namespace:
            for b in self._objects("rolebindings", namespace):
                if any(_subject_is(s, who, namespace) for s in b.get("subjects") or []):
                    rules += self._role_rules(b.get("roleRef") or {}, namespace)
        return rules

    def allowed(self, who: Identity, a: Attributes) -> bool:
        if who.admin:
            return True
        return any(_rule_allows(r, a) for r in self.rules_for(who, a.namespace))

    def check_path(self, who: Identity, path: str) -> None:
        """A non-resource URL: discovery needs an authenticated identity (``system:discovery``
        is bound to ``system:authenticated``); ``PUBLIC_PATHS`` are open to anyone."""
        if path in PUBLIC_PATHS or "system:authenticated" in who.groups:
            return
        raise ApiError(403, f'forbidden: User "{who.user}" cannot get path "{path}"', "Forbidden")

    def check(self, who: Identity, a: Attributes) -> None:
        """Raise 403 as the API server words it when ``who`` may not do ``a``."""
        if self.allowed(who, a):
            return
        group = a.group or '""'
        what = f"{a.resource}.{a.group}" if a.group else a.resource
        subject = f'{what} "{a.name}"' if a.name else what
        where = f' in the namespace "{a.namespace}"' if a.namespace else " at the cluster scope"
        plural, _, sub = a.resource.partition("/")
        resource = f'resource "{plural}"' + (f' subresource "{sub}"' if sub else "")
        raise ApiError(
            403,
            f'{subject} is forbidden: User "{who.user}" cannot {a.verb} {resource} '
            f"in API group {group}{where}",
            "Forbidden",
        )

    def check_escalation(self, who: Identity, rt: ResourceType, namespace: str | None,
                         body: dict) -> None:  # fmt: skip
        """A Role may only grant what its writer holds (the API server's escalation check)."""
        if who.admin or rt.group != RBAC_GROUP or rt.plural not in ("roles", "clusterroles"):
            return
        for rule in body.get("rules") or []:
            grants = itertools.product(
                rule.get("apiGroups") or [],
                rule.get("resources") or [],
                rule.get("verbs") or [],
                rule.get("resourceNames") or [None],
            )
            for group, resource, verb, res_name in grants:
                if not self.allowed(who, Attributes(verb, group, resource, namespace, res_name)):
                    raise ApiError(
                        403,
                        f'{rt.plural}.{RBAC_GROUP} "{body["metadata"]["name"]}" is forbidden: '
                        f'user "{who.user}" is attempting to grant RBAC permissions not '
                        f"currently held: {rule}",
                        "Forbidden",
                    )
