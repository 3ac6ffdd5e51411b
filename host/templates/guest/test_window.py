from sluice_sdk.testing import Harness

from {{lib}} import Tumbling


def test_sums_per_window_when_the_watermark_passes():
    h = Harness(Tumbling, keyed=True, config={"size-ms": "10"})
    for ts, v in [(1, 2), (5, 3), (12, 4)]:
        h.process(b"k", b"%d,k,%d" % (ts, v), ts)
    h.process_watermark(10)
    assert h.take_values() == [b"0,10,5"]
