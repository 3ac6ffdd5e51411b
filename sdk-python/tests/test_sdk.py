"""The SDK's encodings and call rules, natively (no Wasm)."""

import pytest

from sluice_sdk import (
    EVENT_TIME,
    InvalidConfig,
    Operator,
    Record,
    codec,
    postcard,
)
from sluice_sdk.testing import Harness, HarnessError


def test_records_round_trip_with_every_field():
    records = [
        Record(b"v", b"k", 42, ((b"h", b"1"),), 3, 2),
        Record(b"", None, None),
        Record("é".encode(), b"", -(1 << 63)),
    ]
    out = bytearray()
    for r in records:
        codec.encode_record(out, r)
    assert list(codec.decode_records(bytes(out))) == records
    # The layout of the WIT: flags, timestamp, key, value.
    one = bytearray()
    codec.encode_record(one, Record(b"v", b"k", 1))
    assert bytes(one) == b"\x03" + (1).to_bytes(8, "little") + b"\x01\x00\x00\x00k\x01\x00\x00\x00v"


def test_malformed_records_are_an_error_naming_where():
    with pytest.raises(codec.CodecError, match="truncated"):
        list(codec.decode_records(b"\x02\x05\x00\x00\x00ab"))


def test_postcard_matches_the_rust_encodings():
    # Bytes the Rust SDK writes (serde + postcard): u64 300, i64 -1, f64 1.5, a string,
    # a tuple (i64, u64), an option, a vec.
    assert postcard.U64.encode(300) == b"\xac\x02"
    assert postcard.I64.encode(-1) == b"\x01"
    assert postcard.I64.encode(-65) == b"\x81\x01"
    assert postcard.F64.encode(1.5) == b"\x00\x00\x00\x00\x00\x00\xf8\x3f"
    assert postcard.STR.encode("ab") == b"\x02ab"
    assert postcard.Tuple(postcard.I64, postcard.U64).encode((1, 2)) == b"\x02\x02"
    assert postcard.Option(postcard.U8).encode(None) == b"\x00"
    assert postcard.Seq(postcard.U8).encode([1, 2]) == b"\x02\x01\x02"
    # u8 and i8 are one raw byte, not varints.
    assert postcard.U8.encode(200) == b"\xc8"
    assert postcard.I8.encode(-1) == b"\xff"
    assert postcard.Seq(postcard.U8).encode([200]) == b"\x01\xc8"
    assert postcard.I8.decode(b"\x80") == -128
    for codec_, value in [
        (postcard.I64, -(1 << 63)),
        (postcard.I64, (1 << 63) - 1),
        (postcard.U64, (1 << 64) - 1),
        (postcard.F64, -0.25),
        (postcard.Seq(postcard.Tuple(postcard.STR, postcard.BYTES)), [("a", b"\x00")]),
    ]:
        assert codec_.decode(codec_.encode(value)) == value
    with pytest.raises(ValueError):
        postcard.U64.encode(-1)
    with pytest.raises(ValueError):
        postcard.U64.decode(b"\x80")


class Keyed(Operator):
    """Counts per key, remembers the last value per key in a map, and fires a timer."""

    @classmethod
    def open(cls, ctx):
        op = cls()
        op.n = ctx.value_state("n", postcard.U64)
        op.seen = ctx.map_state("seen", postcard.STR, postcard.U64)
        op.log = ctx.list_state("log", postcard.BYTES)
        return op

    def process(self, record, ctx):
        n = self.n.update(ctx, record.key, lambda n: (n or 0) + 1)
        # Reads see this call's writes.
        assert self.n.get(ctx, record.key) == n
        self.seen.put(ctx, record.key, record.value.decode(), n)
        self.log.add(ctx, record.key, record.value)
        ctx.register_event_timer(record.key, record.timestamp + 10)

    def on_timer(self, timer, ctx):
        entries = self.seen.entries(ctx, timer.key)
        ctx.emit(timer.key, repr((entries, self.log.get(ctx, timer.key))).encode())


def test_keyed_state_and_timers_survive_a_snapshot():
    h = Harness(Keyed, keyed=True)
    h.process(b"k", b"a", 100)
    h.process(b"k", b"b", 105)
    assert h.timers() == [(110, b"k"), (115, b"k")]
    snapshot = h.snapshot()
    h2 = Harness(Keyed, keyed=True, restore=snapshot)
    h2.process_watermark(112)
    assert h2.take_values() == [repr(([("a", 1), ("b", 2)], [b"a", b"b"])).encode()]
    assert h2.timers() == [(115, b"k")]
    assert postcard.U64.decode(h2.state_value("n", b"k")) == 2


def test_keyed_state_needs_keyed_input_and_says_so():
    with pytest.raises(HarnessError) as e:
        Harness(Keyed, keyed=False)
    assert e.value.invalid_config and "keyed" in e.value.message


class Raises(Operator):
    def process(self, record, ctx):
        {}["missing"]


def test_an_exception_fails_the_call_with_its_traceback():
    h = Harness(Raises)
    with pytest.raises(HarnessError) as e:
        h.process(None, b"x")
    assert not e.value.invalid_config
    assert "`process` raised KeyError: 'missing'" in e.value.message
    assert "Traceback" in e.value.message and "test_sdk.py" in e.value.message


class EmitsInClose(Operator):
    def close(self, ctx):
        ctx.emit(None, b"late")


def test_emitting_in_close_fails_the_call_as_on_the_host():
    h = Harness(EmitsInClose)
    h.finish()
    with pytest.raises(HarnessError) as e:
        h.close()
    assert "from `close`, which may not emit" in e.value.message


class BadConfig(Operator):
    @classmethod
    def open(cls, ctx):
        ctx.config.check_known(["size"])
        ctx.config.parse("size", int)
        return cls()


def test_config_errors_are_invalid_config():
    with pytest.raises(HarnessError, match="unknown config key `sise`") as e:
        Harness(BadConfig, config={"sise": "1"})
    assert e.value.invalid_config
    with pytest.raises(HarnessError, match="`size` = 'x' is not a int"):
        Harness(BadConfig, config={"size": "x"})


class Timed(Operator):
    """Registers a timer at each record's time + 1 and emits what it sees."""

    @classmethod
    def open(cls, ctx):
        return cls()

    def process(self, record, ctx):
        ctx.register_event_timer(record.key, record.timestamp + 1)
        ctx.emit(record.key, b"r" + record.value)

    def on_timer(self, timer, ctx):
        ctx.emit(timer.key, b"t%d" % timer.timestamp)


def test_a_batch_with_watermarks_inside_fires_timers_where_they_are_due():
    h = Harness(Timed)
    records = [Record(b"%d" % i, b"k", i * 10) for i in range(4)]
    # The watermark 15 arrives before record 2: the timers of records 0 and 1 (1, 11)
    # fire there; the one of record 2 (21) at 25, before record 3.
    h.process_batch(records, [(2, 15), (3, 25)])
    assert h.take_values() == [b"r0", b"r1", b"t1", b"t11", b"r2", b"t21", b"r3"]
    assert h.watermark == 25


class TwoInputs(Operator):
    def process(self, record, ctx):
        ctx.emit(None, b"%d:" % ctx.input_index() + record.value)


def test_records_say_which_input_they_came_from():
    h = Harness(TwoInputs, inputs=[("left", False), ("right", True)])
    h.process(None, b"a", input=1)
    h.process(None, b"b")
    assert h.take_values() == [b"1:a", b"0:b"]
    with pytest.raises(ValueError):
        h.process(None, b"c", input=2)


class Discount(Operator):
    def process(self, record, ctx):
        order = record.json()
        ctx.emit_json(record.key, {"user": order["user"], "total": order["amount"] * 0.9})


def test_json_values_are_read_and_written_as_dicts():
    h = Harness(Discount)
    h.process(b"k", b'{"user": "zo\\u00eb", "amount": 10.0, "tags": []}')
    assert h.take_values() == ['{"user":"zo\u00eb","total":9.0}'.encode()]
    with pytest.raises(HarnessError):
        h.process(b"k", b"not json")


def test_the_example_plugins():
    import count
    import filter as filter_
    import tumbling
    import upper

    h = Harness(upper.Upper)
    h.process(b"k", "straße".encode())
    assert h.take_values() == ["STRASSE".encode()]

    h = Harness(filter_.Filter, config={"prefix": "a", "min-length": "2"})
    for v in [b"ab", b"a", b"ba"]:
        h.process(None, v)
    assert h.take_values() == [b"ab"]

    h = Harness(count.Count, keyed=True)
    for k in [b"x", b"y", b"x"]:
        h.process(k, b"")
    assert h.take_values() == [b"1", b"1", b"2"]
    h = Harness(count.Count, keyed=True, config={"emit": "final"})
    for k in [b"x", b"y", b"x"]:
        h.process(k, b"")
    h.finish()
    assert sorted(h.take_values()) == [b"1", b"2"]

    h = Harness(tumbling.Tumbling, keyed=True, config={"size-ms": "10"})
    for ts, v in [(1, 2), (5, 3), (12, 4)]:
        h.process(b"k", b"%d,k,%d" % (ts, v), ts)
    h.process_watermark(10)
    assert h.take_values() == [b"0,10,5"]
    h.process(b"k", b"3,k,1", 3)
    assert h.counter("late-records-dropped") == 1
    assert [r.value for r in h.take_side_output("late")] == [b"3,k,1"]
    h.finish()
    assert h.take_values() == [b"10,20,4"]


class Cached(Operator):
    """Value `v` set, read or cleared per record: `set:N`, `get`, `clear`."""

    @classmethod
    def open(cls, ctx):
        op = cls()
        op.v = ctx.value_state("v", postcard.U64)
        op.m = ctx.map_state("m", postcard.STR, postcard.U64)
        return op

    def process(self, record, ctx):
        op, _, arg = record.value.decode().partition(":")
        if op == "set":
            self.v.put(ctx, record.key, int(arg))
            self.m.put(ctx, record.key, "x", int(arg))
        elif op == "clear":
            self.v.clear(ctx, record.key)
            self.m.clear(ctx, record.key)
        else:
            ctx.emit(record.key, repr((self.v.get(ctx, record.key), self.m.get(ctx, record.key, "x"))).encode())


def test_values_read_in_earlier_calls_follow_later_writes_and_clears():
    h = Harness(Cached, keyed=True)
    for value in [b"get", b"set:1", b"get", b"set:2", b"get", b"clear", b"get", b"set:3"]:
        h.process(b"k", value)
    h.process(b"k", b"get")
    assert h.take_values() == [b"(None, None)", b"(1, 1)", b"(2, 2)", b"(None, None)", b"(3, 3)"]
    # What the host holds agrees.
    assert postcard.U64.decode(h.state_value("v", b"k")) == 3


class Juggler(Operator):
    """At each timer, does what its record's value said: `delete:T` deletes the timer of
    the same key at T, `again:T` registers it (again)."""

    @classmethod
    def open(cls, ctx):
        op = cls()
        op.plans = ctx.map_state("plans", postcard.I64, postcard.STR)
        return op

    def process(self, record, ctx):
        self.plans.put(ctx, record.key, record.timestamp, record.value.decode())
        ctx.register_event_timer(record.key, record.timestamp)

    def on_timer(self, timer, ctx):
        ctx.emit(timer.key, b"t%d" % timer.timestamp)
        plan = self.plans.get(ctx, timer.key, timer.timestamp) or ""
        action, _, at = plan.partition(":")
        if action == "delete":
            ctx.delete_event_timer(timer.key, int(at))
        elif action == "again":
            ctx.register_event_timer(timer.key, int(at))


def test_a_timer_deleted_by_an_earlier_one_of_the_list_does_not_fire():
    h = Harness(Juggler, keyed=True)
    h.process(b"k", b"delete:20", 10)
    h.process(b"k", b"", 20)
    h.process_watermark(30)
    assert h.take_values() == [b"t10"]
    assert h.timers() == []


def test_a_timer_registered_again_while_due_fires_once_and_may_register_itself():
    h = Harness(Juggler, keyed=True)
    h.process(b"k", b"again:20", 10)
    h.process(b"k", b"", 20)
    h.process_watermark(30)
    # 10 registers 20 again while 20 waits in the same list: it fires once.
    assert h.take_values() == [b"t10", b"t20"]
    assert h.timers() == []
    # The cancelling delete comes before the timer runs, so one that registers itself
    # again is kept (as the Rust SDK does): register, delete, register.
    h = Harness(Juggler, keyed=True)
    h.process(b"k", b"again:20", 10)
    h.process(b"k", b"again:20", 20)
    instance, host = h.instance, h.host
    timers = codec.encode_timers([(EVENT_TIME, 10, b"k"), (EVENT_TIME, 20, b"k")])
    call = instance.on_timers(host, timers)
    kinds = [e[0] for e in codec.decode_effects(bytes(call.effects.out))]
    assert kinds == [codec.REGISTER_TIMER, codec.DELETE_TIMER, codec.REGISTER_TIMER]


def test_records_emitted_keep_the_headers_and_partition_of_the_record_processed():
    import upper

    h = Harness(upper.Upper)
    h.process_batch([Record(b"a", None, None, ((b"h", b"1"),), 3)])
    (out,) = h.take_output()
    assert (out.value, out.headers, out.partition) == (b"A", ((b"h", b"1"),), 3)
    h.process(None, b"\xffabc")
    assert h.take_values() == [b"\xffABC"]


class Remembers(Operator):
    """Emits what it remembered of the key (kept for 100 ms of processing time), then
    remembers the record's value."""

    @classmethod
    def open(cls, ctx):
        op = cls()
        op.last = ctx.value_state("last", postcard.BYTES, ttl_ms=100)
        op.seen = ctx.list_state("seen", postcard.BYTES, ttl_ms=100)
        return op

    def process(self, record, ctx):
        ctx.emit(record.key, repr((self.last.get(ctx, record.key), len(self.seen.get(ctx, record.key)))).encode())
        self.last.put(ctx, record.key, record.value)
        self.seen.add(ctx, record.key, record.value)


def test_state_with_a_time_to_live_reads_as_absent_once_it_expired():
    h = Harness(Remembers, keyed=True, processing_time=1000)
    h.process(b"k", b"a")
    h.set_processing_time(1099)
    h.process(b"k", b"b")
    h.set_processing_time(1150)  # "a" expired at 1100, "b" (written at 1099) lives
    h.process(b"k", b"c")
    h.set_processing_time(1300)
    h.process(b"k", b"d")
    assert h.take_values() == [b"(None, 0)", b"(b'a', 1)", b"(b'b', 1)", b"(None, 0)"]


class Floods(Operator):
    """Emits as many bytes as the record's value says, and keeps that many in its own state."""

    @classmethod
    def open(cls, ctx):
        op = cls()
        op.size = 0
        return op

    def process(self, record, ctx):
        self.size = int(record.value)
        ctx.emit(None, b"x" * self.size)

    def snapshot(self, checkpoint_id):
        return b"s" * self.size


def test_a_call_returning_more_than_the_output_limit_fails_as_on_the_host():
    h = Harness(Floods, max_output_bytes=1000)
    h.process(None, b"500")
    assert len(h.take_values()) == 1
    h.snapshot()
    with pytest.raises(HarnessError) as e:
        h.process(None, b"2000")
    assert not e.value.invalid_config
    assert "bytes of records and effects from one call; the limit is 1000" in e.value.message
    # Nothing of the failed call counts.
    assert h.take_values() == []
    with pytest.raises(HarnessError) as e:
        h.snapshot()
    assert "the limit is 1000" in e.value.message


def test_the_batch_api_gives_what_the_per_record_one_does():
    import count
    import count_batch
    import filter_batch

    keys = [b"k%d" % (i * 7 % 5) for i in range(40)]
    one, batched = Harness(count.Count, keyed=True), Harness(count_batch.CountBatch, keyed=True)
    for h in (one, batched):
        # Batches split by watermarks, and a later batch reading what the earlier wrote.
        h.process_batch([Record(b"", k, i) for i, k in enumerate(keys[:25])], [(10, 5), (20, 9)])
        h.process_batch([Record(b"", k, i) for i, k in enumerate(keys[25:])])
    assert batched.take_output() == one.take_output()
    assert batched.state_value("count", b"k0") == (8).to_bytes(8, "little")

    h = Harness(filter_batch.FilterBatch, config={"contains": "7"})
    records = [
        Record(b"a7", b"k", 1, ((b"h", b"1"),), 0),
        Record(b"b", None, None, ((b"h", b"2"),), 1),
        Record(b"77", None, 3, ((b"h", b"3"),), 2),
    ]
    h.process_batch(records)
    # Kept as they are: keys, timestamps, headers (renumbered) and partitions.
    assert h.take_output() == [records[0], records[2]]


class Batched(Operator):
    """Per batch: reads `v` of the batch's keys, writes `value + 1` for each, reads again."""

    @classmethod
    def open(cls, ctx):
        op = cls()
        op.v = ctx.value_state("v", postcard.U64)
        return op

    def process_batch(self, batch, ctx):
        before = self.v.get_many(ctx, batch.keys)
        self.v.put_many(ctx, batch.keys, [int(v) for v in batch.values])
        after = self.v.get_many(ctx, batch.keys)
        ctx.emit_batch([repr((b, a)).encode() for b, a in zip(before, after)], batch.keys)


def test_get_many_sees_the_calls_own_writes_and_what_earlier_calls_wrote():
    h = Harness(Batched, keyed=True)
    h.process_batch([Record(b"1", b"a"), Record(b"2", b"b")])
    h.process_batch([Record(b"3", b"a"), Record(b"4", b"c")])
    assert h.take_values() == [b"(None, 1)", b"(None, 2)", b"(1, 3)", b"(None, 4)"]
    assert postcard.U64.decode(h.state_value("v", b"b")) == 2


def test_a_batch_emitted_with_lists_of_other_lengths_is_refused():
    class Bad(Operator):
        def process_batch(self, batch, ctx):
            ctx.emit_batch(batch.values, batch.keys[:1])

    h = Harness(Bad)
    with pytest.raises(HarnessError, match="a batch of 2 values with 1 keys"):
        h.process_batch([Record(b"1", b"a"), Record(b"2", b"b")])


def test_state_values_match_the_golden_vectors_every_sdk_reads():
    import json
    import os

    from sluice_sdk import plain

    path = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "fixtures", "state-values.json")
    with open(path, encoding="utf-8") as f:
        vectors = json.load(f)["values"]
    codecs = {
        "u64": (postcard.U64, int),
        "i64": (postcard.I64, int),
        "f64": (postcard.F64, float),
        "str": (postcard.STR, str),
        "bytes": (postcard.BYTES, bytes),
        "option<u64>": (postcard.Option(postcard.U64), lambda v: None if v is None else int(v)),
        "seq<u8>": (postcard.Seq(postcard.U8), list),
        "tuple<i64,u64>": (postcard.Tuple(postcard.I64, postcard.U64), lambda v: tuple(map(int, v))),
        "plain-i64": (plain.I64, int),
        "plain-u64": (plain.U64, int),
        "plain-f64": (plain.F64, float),
    }
    assert {v["type"] for v in vectors} == set(codecs)
    for v in vectors:
        codec_, convert = codecs[v["type"]]
        value, encoded = convert(v["value"]), bytes.fromhex(v["hex"])
        assert codec_.encode(value) == encoded, v
        assert codec_.decode(encoded) == value, v
