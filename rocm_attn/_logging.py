"""Logging of rocm_attn: which backend serves a call, and why.

Everything goes through the standard ``logging`` module under the ``rocm_attn`` logger (and
children such as ``rocm_attn.cp``). The package adds no handler of its own unless asked, so
by default only Python's defaults apply (warnings and errors reach stderr). Two ways to see
more:

* env ``ROCM_ATTN_LOG_LEVEL=INFO`` (or ``DEBUG``) at import, or ``rocm-attn --log-level``;
* standard configuration in the application, e.g.
  ``logging.basicConfig(); logging.getLogger("rocm_attn").setLevel(logging.INFO)``.

Levels: INFO says once per distinct (op, choice, reason) which backend was picked; DEBUG
repeats it on every call. Nothing is logged while torch.compile traces (a log call there is a
graph break).
"""

from __future__ import annotations

import logging
import os
import sys
import warnings
from typing import Hashable, Optional, Set, Union

import torch

LOGGER_NAME = "rocm_attn"
ENV_VAR = "ROCM_ATTN_LOG_LEVEL"
LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")

_seen: Set[Hashable] = set()
_handler: Optional[logging.Handler] = None


def set_level(level: Union[str, int]) -> None:
    """Show rocm_attn's messages at ``level`` and above on stderr (one handler, added once)."""
    global _handler
    if isinstance(level, str):
        name = level.strip().upper()
        if name not in LEVELS:
            raise ValueError(f"log level must be one of {LEVELS}, got {level!r}")
        level = getattr(logging, name)
    logger = logging.getLogger(LOGGER_NAME)
    if _handler is None:
        _handler = logging.StreamHandler(sys.stderr)
        _handler.setFormatter(logging.Formatter("[%(name)s %(levelname)s] %(message)s"))
        logger.addHandler(_handler)
        logger.propagate = False  # our handler prints it; avoid a second copy via the root
    logger.setLevel(level)


def configure_from_env() -> None:
    """Apply ``ROCM_ATTN_LOG_LEVEL`` when it is set; a bad value warns and is ignored."""
    value = os.environ.get(ENV_VAR, "").strip()
    if not value:
        return
    try:
        set_level(value)
    except ValueError:
        warnings.warn(f"{ENV_VAR}={value!r} ignored: use one of {', '.join(LEVELS)}", stacklevel=2)


def log_choice(logger: logging.Logger, key: Hashable, msg: str, *args) -> None:
    """Log a backend choice: INFO the first time ``key`` is seen, DEBUG after that.

    ``key`` should identify the choice and its reason (not the call), so a steady workload
    logs each distinct decision once at INFO. Silent while torch.compile traces.
    """
    if torch.compiler.is_compiling():
        return
    if key in _seen:
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug(msg, *args)
        return
    _seen.add(key)
    logger.info(msg, *args)
