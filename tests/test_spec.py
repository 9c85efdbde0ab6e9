"""The spec (§2.1): its defaults and values, refusals that name the key, and sizes."""

import pytest

from lnkmem.core.errors import UsageError
from lnkmem.memory.spec import parse_size, parse_spec


def test_spec_defaults_and_values():
    assert parse_spec(None).tokens == 2000
    assert parse_spec("").notes == "4 KB"
    s = parse_spec('{"model": "mini", "tokens": 50, "notes": "2 KiB", "engine": "lnkmem"}')
    assert (s.model, s.tokens, s.notes) == ("mini", 50, "2 KiB")


@pytest.mark.parametrize("text, key", [
    ('{"tokens": 0}', "tokens"), ('{"tokens": 1000001}', "tokens"), ('{"tokens": "5"}', "tokens"),
    ('{"tokens": true}', "tokens"), ('{"tokens": 5.5}', "tokens"),
    ('{"notes": "4 GB"}', "notes"), ('{"notes": 4000}', "notes"),
    ('{"model": ""}', "model"), ('{"model": "a\\nb"}', "model"), ('{"model": "' + "m" * 201 + '"}', "model"),
    ('{"colour": 1}', "colour"), ("[1]", "object"), ("nope", "JSON"),
])
def test_spec_refusals_name_the_key(text, key):
    with pytest.raises(UsageError) as e:
        parse_spec(text)
    assert key in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("text, n", [("4 KB", 4000), ("4kb", 4000), ("2 KiB", 2048), ("1MB", 10**6),
                                     ("1 mib", 2**20), ("100", 100), ("100 B", 100), ("1.5 KB", 1500)])
def test_sizes(text, n):
    assert parse_size(text) == n


@pytest.mark.parametrize("text", ["", "KB", "4 GB", "-1 KB", "4 K B"])
def test_bad_sizes(text):
    with pytest.raises(ValueError):
        parse_size(text)
