"""Dynamo compatibility (docs/dynamo-compat.md): Dynamo's constructor forms
of DistributedRuntime, and the environment ``dynamo_worker`` reads (the
decorator itself is runtime.py's: it makes a DistributedRuntime, and
runtime.py imports this module)."""

from __future__ import annotations

import logging
import os
from typing import Any, Dict, Optional, Set, Tuple

logger = logging.getLogger("dynamo_ctx")

__all__ = ["DISCOVERY_BACKENDS", "REQUEST_PLANES"]


#: Dynamo 1.x values of DistributedRuntime's discovery_backend and
#: request_plane. dynamo_ctx has one of each (NATS), which every value selects.
DISCOVERY_BACKENDS = ("etcd", "file", "mem", "kubernetes")
REQUEST_PLANES = ("nats", "tcp", "http")

_logged_values: Set[Tuple[str, Any]] = set()


def _log_ignored(name: str, value: Any) -> None:
    if (name, value) not in _logged_values:
        _logged_values.add((name, value))
        logger.debug("DistributedRuntime: %s=%r has no meaning here: the NATS request plane serves", name, value)


def _check_dynamo_args(
    args: Tuple[Any, ...],
    is_static: Optional[bool],
    discovery_backend: Optional[str],
    request_plane: Optional[str],
    enable_nats: Optional[bool],
) -> None:
    """Validate Dynamo's positional constructor forms (after the loop):
    ``(is_static)`` or ``(discovery_backend, request_plane[, enable_nats])``."""
    if len(args) == 1 and not isinstance(args[0], str):
        (pos_static,) = args
        if is_static is not None:
            raise TypeError("DistributedRuntime() got is_static both by position and by keyword")
        is_static = pos_static
    elif args:
        if len(args) > 3:
            raise TypeError(f"DistributedRuntime() takes at most 4 positional arguments ({len(args) + 1} given)")
        names = ("discovery_backend", "request_plane", "enable_nats")
        given: Dict[str, Any] = {"discovery_backend": discovery_backend, "request_plane": request_plane, "enable_nats": enable_nats}
        for name, value in zip(names, args):
            if given[name] is not None:
                raise TypeError(f"DistributedRuntime() got {name} both by position and by keyword")
            given[name] = value
        discovery_backend, request_plane, enable_nats = given["discovery_backend"], given["request_plane"], given["enable_nats"]
    if is_static is not None:
        if not isinstance(is_static, bool):
            raise TypeError(f"is_static must be a bool, got {is_static!r}")
        _log_ignored("is_static", is_static)
    if discovery_backend is not None:
        if discovery_backend not in DISCOVERY_BACKENDS:
            raise ValueError(f"unknown discovery_backend {discovery_backend!r}: one of {', '.join(DISCOVERY_BACKENDS)}")
        _log_ignored("discovery_backend", discovery_backend)
    if request_plane is not None:
        if request_plane not in REQUEST_PLANES:
            raise ValueError(f"unknown request_plane {request_plane!r}: one of {', '.join(REQUEST_PLANES)}")
        _log_ignored("request_plane", request_plane)
    if enable_nats is not None:
        if not isinstance(enable_nats, bool):
            raise TypeError(f"enable_nats must be a bool, got {enable_nats!r}")
        _log_ignored("enable_nats", enable_nats)


def _worker_forms() -> Tuple[str, str]:
    """``dynamo_worker``'s discovery_backend and request_plane: Dynamo's
    ``DYN_DISCOVERY_BACKEND`` and ``DYN_REQUEST_PLANE`` (checked as the
    constructor's, by ``_check_dynamo_args``)."""
    return os.environ.get("DYN_DISCOVERY_BACKEND", "etcd"), os.environ.get("DYN_REQUEST_PLANE", "tcp")
