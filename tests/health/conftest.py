"""Fixtures of the health tests."""

from __future__ import annotations

from pathlib import Path

import pytest
from simnode import Node


@pytest.fixture
def node(tmp_path: Path) -> Node:
    return Node(tmp_path)
