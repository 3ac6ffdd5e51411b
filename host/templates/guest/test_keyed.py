from sluice_sdk.testing import Harness

from {{lib}} import Count


def test_counts_per_key_and_restores():
    h = Harness(Count, keyed=True)
    for key in [b"x", b"y", b"x"]:
        h.process(key, b"")
    assert h.take_values() == [b"1", b"1", b"2"]
    h = Harness(Count, keyed=True, restore=h.snapshot())
    h.process(b"x", b"")
    assert h.take_values() == [b"3"]
