"""The label keys the platform stamps on every workload (seed 004: "Selector keys").

A module of its own so that the CLI's workload options name them without loading the config
front-end and YAML, which only the ``config`` commands need.
"""

from __future__ import annotations

from typing import Final

RESERVED_LABEL_KEYS: Final = (
    "instance-type",
    "accelerator-type",
    "market-type",
    "cloud-resource-id",
    "workload-type",
)
