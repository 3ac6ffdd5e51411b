from sluice_sdk.testing import Harness

from {{lib}} import Filter


def test_keeps_what_matches():
    h = Harness(Filter, config={"contains": "na"})
    for value in [b"banana", b"apple"]:
        h.process(None, value)
    assert h.take_values() == [b"banana"]
