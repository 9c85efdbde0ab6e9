import pytest

from tests.helpers import Home


@pytest.fixture
def home(tmp_path):
    return Home(tmp_path)
