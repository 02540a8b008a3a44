"""Domain errors and the state-machine mixin shared by every app.

This module imports no app (Django itself only): every layer may use it.
"""

import functools
import json
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, ParamSpec, TypeVar

from django.db import connection, models, transaction
from django.db.models import Q

P = ParamSpec("P")
R = TypeVar("R")


class DomainError(Exception):
    """A refusal the interfaces render as ``{"code", "message", "details"}`` with ``status``."""

    code: ClassVar[str] = "domain_error"
    status: ClassVar[int] = 400

    def __init__(self, message: str = "", *, code: str | None = None,
                 details: Mapping[str, Any] | None = None) -> None:
        super().__init__(message or self.__class__.__doc__ or self.code)
        self.message = message or (self.__class__.__doc__ or self.code).strip()
        if code is not None:
            self.code = code  # type: ignore[misc]
        self.details: dict[str, Any] = dict(details or {})


class InvalidArguments(DomainError):
    """The input is invalid."""

    code = "invalid_arguments"
    status = 422


class NotFound(DomainError):
    """No such object."""

    code = "not_found"
    status = 404


class Conflict(DomainError):
    """The request conflicts with the current state."""

    code = "conflict"
    status = 409


class InvalidTransition(Conflict):
    """This status change is not allowed."""

    code = "invalid_transition"


class PermissionDenied(DomainError):
    """You are not allowed to do this."""

    code = "permission_denied"
    status = 403


class Throttled(DomainError):
    """Too many requests of this kind; wait and try again."""

    code = "throttled"
    status = 429


class StateMachine:
    """Mixin for models with a ``status`` field and a ``TRANSITIONS`` table.

    ``TRANSITIONS`` maps a status to the set of statuses it may move to. Moving to the
    current status is always allowed (callers treat it as a no-op).
    """

    TRANSITIONS: ClassVar[Mapping[str, frozenset[str]]] = {}
    status: Any

    def can_move_to(self, target: str) -> bool:
        return target == self.status or target in self.TRANSITIONS.get(str(self.status), frozenset())

    def ensure_can_move_to(self, target: str) -> None:
        if not self.can_move_to(target):
            raise InvalidTransition(
                f"{type(self).__name__} cannot move from {self.status!r} to {target!r}",
                details={"from": str(self.status), "to": str(target),
                         "allowed": sorted(self.TRANSITIONS.get(str(self.status), frozenset()))},
            )


def status_constraint(model_name: str, status: Any, *, field: str = "status") -> Any:
    """The CheckConstraint of a status field, built from its TextChoices (never a typed list)."""
    return models.CheckConstraint(condition=Q(**{f"{field}__in": list(status.values)}),
                                  name=f"{model_name}_{field}_valid")


def canonical_json(value: Any) -> str:
    """One spelling of a JSON value: sorted keys, no spaces. What a hash of arguments is taken over."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def joins_transaction(func: Callable[P, R]) -> Callable[P, R]:
    """Run in the caller's transaction, or in a new one when there is none.

    Unlike a nested ``atomic()`` it costs no savepoint round trips (several per engine step), and
    unlike ``atomic(savepoint=False)`` a domain error raised before any write leaves the
    caller's transaction usable.
    """
    @functools.wraps(func)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        if connection.in_atomic_block:
            return func(*args, **kwargs)
        with transaction.atomic():
            return func(*args, **kwargs)

    return wrapper
