"""Reef error codes on the Python side.

The registry lives in `actors/runtime/errors.ts`; Python raises the same code strings and copies
their retryable flag so an error reply reads the same whichever language produced it.
"""

from __future__ import annotations

from typing import Any

# code -> retryable, mirrored from actors/runtime/errors.ts for the codes the shim can raise.
RETRYABLE: dict[str, bool] = {
    "REEF_ERR_CONFIG_INVALID": False,
    "REEF_ERR_BAD_MESSAGE": False,
    "REEF_ERR_UNKNOWN_MESSAGE": False,
    "REEF_ERR_TIMEOUT": True,
    "REEF_ERR_HANDLER": False,
    "REEF_ERR_SHIM": False,
    "REEF_ERR_PLACEMENT": False,
    "REEF_ERR_RAY": True,
    "REEF_ERR_ENGINE_START": True,
    "REEF_ERR_ENGINE_DOWN": True,
    "REEF_ERR_NOT_FOUND": False,
    "REEF_ERR_INVALID_ARGUMENT": False,
    "REEF_ERR_CONFLICT": False,
    "REEF_ERR_TRAINER": False,
    "REEF_ERR_TRAINER_RANK": True,
    "REEF_ERR_WEIGHT_SYNC": True,
}


class ShimError(Exception):
    """An error with a stable registry code; the server turns it into an error reply."""

    def __init__(self, code: str, message: str, retryable: bool | None = None) -> None:
        if code not in RETRYABLE:
            raise ValueError(f"unknown Reef error code {code!r}")
        super().__init__(message)
        self.code = code
        self.message = message
        self.retryable = RETRYABLE[code] if retryable is None else retryable

    def to_reply(self, request_id: str | None) -> dict[str, Any]:
        return {
            "type": "error",
            "requestId": request_id,
            "code": self.code,
            "message": self.message,
            "retryable": self.retryable,
        }

    def __repr__(self) -> str:
        return f"ShimError({self.code}, {self.message!r})"
