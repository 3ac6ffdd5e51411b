from sluice_sdk.testing import Harness

from {{lib}} import Upper


def test_uppercases_values():
    h = Harness(Upper)
    h.process(b"k", "straße".encode())
    assert h.take_values() == ["STRASSE".encode()]
