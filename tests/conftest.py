"""Fixtures shared by the test files: an agent's Home, and the fake bridges."""

import pytest

from tests.bridges import Layout
from tests.helpers import Home


@pytest.fixture
def home(tmp_path):
    return Home(tmp_path)


@pytest.fixture
def bridges(request, tmp_path):
    """The fake files and storage bridges (tests/bridges.py), laid out as the test
    module's ``BRIDGES`` says (empty, with agent a1 bound, where it says nothing)."""
    with getattr(request.module, "BRIDGES", Layout()).started(tmp_path) as b:
        yield b
