"""API errors as the server reports them: a ``Status`` body with code, reason and details."""

from __future__ import annotations

REASONS = {
    400: "BadRequest",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    409: "Conflict",
    410: "Expired",
    415: "UnsupportedMediaType",
    422: "Invalid",
    500: "InternalError",
    503: "ServiceUnavailable",
}


class ApiError(Exception):
    def __init__(
        self, code: int, message: str, reason: str | None = None, details: dict | None = None
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.reason = reason or REASONS.get(code, "Unknown")
        self.details = details or {}

    def status(self) -> dict:
        body = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if self.details:
            body["details"] = self.details
        return body


def not_found(kind_plural: str, name: str, group: str = "") -> ApiError:
    what = f"{kind_plural}.{group}" if group else kind_plural
    return ApiError(
        404,
        f'{what} "{name}" not found',
        details={"name": name, "group": group, "kind": kind_plural},
    )


def conflict(kind_plural: str, name: str, group: str = "") -> ApiError:
    what = f"{kind_plural}.{group}" if group else kind_plural
    return ApiError(
        409,
        f'Operation cannot be fulfilled on {what} "{name}": the object has been '
        "modified; please apply your changes to the latest version and try again",
        details={"name": name, "group": group, "kind": kind_plural},
    )


def invalid(kind: str, name: str, causes: list[str], group: str = "") -> ApiError:
    what = f"{kind}.{group}" if group else kind
    text = ", ".join(causes)
    return ApiError(
        422,
        f'{what} "{name}" is invalid: {text}',
        details={
            "name": name,
            "group": group,
            "kind": kind,
            "causes": [{"message": c} for c in causes],
        },
    )
