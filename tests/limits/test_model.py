"""limits.model: what a sandbox may use, and sizes for humans."""

from __future__ import annotations

import pytest

from cgroup_fakes import (
    MiB,
)
from sono.limits import Limits, format_size


def test_limits_any_and_validation() -> None:
    assert not Limits().any()
    assert Limits(wall=1).any()
    assert Limits(pids=16).any()
    with pytest.raises(ValueError, match="memory"):
        Limits(memory=0)
    with pytest.raises(ValueError, match="cpus"):
        Limits(cpus=-1.0)


def test_format_size() -> None:
    assert format_size(900) == "900 B"
    assert format_size(64 * MiB) == "64.0 MiB"
    assert format_size(3 * 1024 * 1024 * MiB) == "3.0 TiB"
