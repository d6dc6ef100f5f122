"""Unit tests of the frame codec (docs/architecture.md §6: decoders never trust a peer's sizes):
header validation and the control-message decoders, with a hypothesis fuzz, through
``byteps._core_testing``.
"""

from __future__ import annotations

import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from testing_hooks import core_testing

T = core_testing()


DTYPE_CODES = {
    "float32": 0,
    "float64": 1,
    "float16": 2,
    "uint8": 3,
    "int32": 4,
    "int8": 5,
    "int64": 6,
    "bfloat16": 7,
}

FAST = settings(max_examples=150, deadline=None,
                suppress_health_check=[HealthCheck.too_slow])
FUZZ = settings(max_examples=400, deadline=None,
                suppress_health_check=[HealthCheck.too_slow])


# =============================================================================================
# frame codec (docs/architecture.md §6: decoders never trust a peer's sizes)
# =============================================================================================

@pytest.mark.parametrize("wait_us, sum_us, want", [
    (0, 0, (0, 0)), (0, 7, (0, 7)), (5, 0, (5, 0)), (123456, 789, (123456, 789)),
    (1 << 40, 1 << 40, (0x7FFFFFFF, 0xFFFFFFFF)),  # saturated, never wrapped
])
def test_server_times_survive_the_aux_field(wait_us, sum_us, want):
    """A traced round's times come back as packed, and a round of 0 us each is still told
    apart from an untraced response (aux 0): the timeline shows it."""
    aux, got_wait, got_sum = T.pack_server_times(wait_us, sum_us)
    assert aux != 0 and (got_wait, got_sum) == want


CONTROL_TYPES = list(range(1, 12))  # ... NODE_FAILED, WORKER_LEFT, RETIRE_KEYS
DATA_TYPES = list(range(20, 35))  # ... PUSH_ACK, KEY_CONFIG, PEER_HELLO .. PEER_ABORT, PULL_WINDOW
KNOWN_TYPES = CONTROL_TYPES + DATA_TYPES
MAGIC = 0x31535042
MAX_CONTROL = 4 << 20
MAX_DATA = 1 << 33


MAX_WINDOW = 64 << 10  # a PUSH_ACK's window (ps/protocol.h: kMaxWindowBlob)


def header_is_valid(magic, type_, dtype, payload_len, written=0):
    """Reference model of ValidateFrame (comm/frame.cc) and ValidatePsHeader (ps/protocol.cc)."""
    if magic != MAGIC or type_ not in KNOWN_TYPES or dtype >= 8:
        return False
    limit = MAX_CONTROL if (type_ in CONTROL_TYPES or type_ in (20, 24, 27, 29, 33)) else MAX_DATA
    if payload_len > limit:
        return False
    if type_ in (28, 34) and payload_len > MAX_WINDOW:
        return False
    # only a PUSH or PULL_RESPONSE announces bytes written one-way, and then carries none
    if written and (type_ not in (21, 23) or payload_len != 0 or written > MAX_DATA):
        return False
    return not (type_ in (11, 22, 25, 26, 30, 32) and payload_len != 0)


class TestFrame:
    def test_header_size(self):
        assert T.header_size() == 48
        assert len(T.encode_header(21)) == 48

    def test_header_layout_little_endian(self):
        h = T.encode_header(21, dtype=7, sender=3, round=9, key=(5 << 16) | 2, payload_len=1024,
                            aux=77)
        magic, typ, dtype, flags, sender, rnd, key, plen, aux, res = struct.unpack(
            "<IHBBIIQQQQ", h)
        assert (magic, typ, dtype, flags, sender, rnd, key, plen, aux, res) == (
            MAGIC, 21, 7, 0, 3, 9, (5 << 16) | 2, 1024, 77, 0)
        assert h[:4] == b"BPS1"

    def test_round_trip(self):
        h = T.encode_header(23, dtype=1, sender=12, round=1 << 31, key=(1 << 48) - 1,
                            payload_len=4096000, aux=123456789)
        d = T.decode_header(h)
        assert d == {"type": 23, "type_name": "PULL_RESPONSE", "dtype": 1, "sender": 12,
                     "round": 1 << 31, "key": (1 << 48) - 1, "payload_len": 4096000,
                     "aux": 123456789, "written": 0}

    def test_one_way_headers(self):
        """A PUSH or PULL_RESPONSE written one-way into the receiver's window announces its
        bytes and carries no payload; nothing else may announce any; a PUSH_ACK or PULL_WINDOW
        carries at most a window."""
        for written_type in (21, 23):
            h = T.decode_header(T.encode_header(written_type, written=1 << 20))
            assert h["written"] == 1 << 20
            with pytest.raises(ValueError, match="written one-way"):
                T.decode_header(T.encode_header(written_type, payload_len=4, written=1 << 20))
            with pytest.raises(ValueError, match="written one-way"):
                T.decode_header(T.encode_header(written_type, written=MAX_DATA + 1))
        for other in (22, 28, 31, 34):
            with pytest.raises(ValueError, match="written one-way"):
                T.decode_header(T.encode_header(other, written=8))
        for window_type in (28, 34):
            T.decode_header(T.encode_header(window_type, payload_len=MAX_WINDOW))
            with pytest.raises(ValueError, match="window"):
                T.decode_header(T.encode_header(window_type, payload_len=MAX_WINDOW + 1))

    @pytest.mark.parametrize("type_,name", [(1, "REGISTER"), (2, "ADDRESS_BOOK"), (3, "DECLARE"),
                                            (4, "DECLARE_REPLY"), (5, "HEARTBEAT"),
                                            (6, "FINALIZE"), (7, "FINALIZE_DONE"),
                                            (8, "SHUTDOWN"), (9, "NODE_FAILED"),
                                            (10, "WORKER_LEFT"), (11, "RETIRE_KEYS"), (20, "HELLO"),
                                            (21, "PUSH"), (22, "PULL"), (23, "PULL_RESPONSE"),
                                            (24, "DATA_ERROR"), (25, "GOODBYE"),
                                            (26, "STALL_QUERY"), (27, "STALL_REPORT"),
                                            (30, "PEER_HELLO"), (31, "COLLECTIVE"),
                                            (32, "PEER_GOODBYE"), (33, "PEER_ABORT"),
                                            (34, "PULL_WINDOW")])
    def test_every_type_decodes(self, type_, name):
        assert T.decode_header(T.encode_header(type_))["type_name"] == name

    @pytest.mark.parametrize("magic", [0, 0x31535043, 0x42505331, 0xFFFFFFFF])
    def test_bad_magic(self, magic):
        with pytest.raises(ValueError, match="magic"):
            T.decode_header(T.encode_header(21, magic=magic))

    @pytest.mark.parametrize("type_", [0, 12, 13, 19, 37, 100, 0xFFFF])  # 35, 36: JOIN, JOIN_DONE
    def test_unknown_type(self, type_):
        with pytest.raises(ValueError, match="type"):
            T.decode_header(T.encode_header(type_))

    @pytest.mark.parametrize("dtype", [8, 9, 100, 255])
    def test_bad_dtype(self, dtype):
        with pytest.raises(ValueError, match="dtype"):
            T.decode_header(T.encode_header(21, dtype=dtype))

    def test_every_valid_dtype(self):
        for code in DTYPE_CODES.values():
            assert T.decode_header(T.encode_header(21, dtype=code))["dtype"] == code

    def test_payload_limits(self):
        T.decode_header(T.encode_header(21, payload_len=MAX_DATA))
        with pytest.raises(ValueError, match="exceeds"):
            T.decode_header(T.encode_header(21, payload_len=MAX_DATA + 1))
        with pytest.raises(ValueError, match="exceeds"):
            T.decode_header(T.encode_header(23, payload_len=(1 << 64) - 1))
        T.decode_header(T.encode_header(3, payload_len=MAX_CONTROL))
        for control in (1, 3, 9, 20, 24, 27):
            with pytest.raises(ValueError, match="exceeds"):
                T.decode_header(T.encode_header(control, payload_len=MAX_CONTROL + 1))

    @pytest.mark.parametrize("type_", [22, 25, 26, 30, 32])
    def test_pull_and_goodbye_without_payload(self, type_):
        T.decode_header(T.encode_header(type_, payload_len=0))
        with pytest.raises(ValueError, match="payload"):
            T.decode_header(T.encode_header(type_, payload_len=1))

    @pytest.mark.parametrize("n", [0, 1, 47, 49, 96])
    def test_header_wrong_length(self, n):
        with pytest.raises(ValueError):
            T.decode_header(b"\0" * n)

    @FUZZ
    @given(st.binary(min_size=48, max_size=48))
    def test_fuzz_decode_header_random_bytes(self, data):
        magic, typ, dtype, _, _, _, _, plen, _, written = struct.unpack("<IHBBIIQQQQ", data)
        try:
            d = T.decode_header(data)
        except ValueError:
            assert not header_is_valid(magic, typ, dtype, plen, written)
        else:
            assert header_is_valid(magic, typ, dtype, plen, written)
            assert (d["type"], d["dtype"], d["payload_len"]) == (typ, dtype, plen)

    @FUZZ
    @given(st.sampled_from([MAGIC, MAGIC, MAGIC, 0, MAGIC ^ 1]),
           st.one_of(st.sampled_from(KNOWN_TYPES), st.integers(0, 0xFFFF)),
           st.integers(0, 255),
           st.one_of(st.integers(0, 16), st.sampled_from([MAX_CONTROL, MAX_CONTROL + 1, MAX_DATA,
                                                          MAX_DATA + 1]),
                     st.integers(0, (1 << 64) - 1)),
           st.integers(0, (1 << 64) - 1))
    def test_fuzz_header_fields_match_reference(self, magic, typ, dtype, plen, key):
        h = T.encode_header(typ, dtype=dtype, key=key, payload_len=plen, magic=magic)
        try:
            d = T.decode_header(h)
        except ValueError:
            assert not header_is_valid(magic, typ, dtype, plen)
        else:
            assert header_is_valid(magic, typ, dtype, plen)
            assert d["key"] == key

    # --- control payloads ---

    def test_declare_round_trip(self):
        msg = T.encode_declare(7, "layer1.conv.weight", 0, [64, 3, 7, 7], 64 * 3 * 49 * 4)
        assert T.decode_declare(msg) == (7, "layer1.conv.weight", 0, [64, 3, 7, 7],
                                         64 * 3 * 49 * 4)
        assert T.decode_declare(T.encode_declare(0, "", 7, [], 0)) == (0, "", 7, [], 0)

    @FAST
    @given(st.integers(0, (1 << 32) - 1), st.text(max_size=200), st.integers(0, 7),
           st.lists(st.integers(-(1 << 63), (1 << 63) - 1), max_size=64),
           st.integers(0, (1 << 64) - 1))
    def test_declare_round_trip_property(self, key, name, dtype, shape, nbytes):
        msg = T.encode_declare(key, name, dtype, shape, nbytes)
        assert T.decode_declare(msg) == (key, name, dtype, shape, nbytes)

    def test_declare_limits(self):
        with pytest.raises(ValueError):
            T.decode_declare(T.encode_declare(1, "x", 8, [1], 4))  # bad dtype
        with pytest.raises(ValueError):
            T.decode_declare(T.encode_declare(1, "x", 0, [1] * 65, 4))  # too many dims
        with pytest.raises(ValueError):
            T.decode_declare(T.encode_declare(1, "x" * ((1 << 16) + 1), 0, [1], 4))  # long name
        T.decode_declare(T.encode_declare(1, "x" * (1 << 16), 0, [1] * 64, 4))  # at the limits

    def test_declare_lying_lengths(self):
        good = T.encode_declare(1, "abc", 0, [2, 2], 16)
        # name length says 2^31 bytes
        bad = good[:4] + struct.pack("<I", 1 << 31) + good[8:]
        with pytest.raises(ValueError):
            T.decode_declare(bad)
        # shape count says 2^32-1 dims
        off = 4 + 4 + 3 + 1
        bad = good[:off] + struct.pack("<I", 0xFFFFFFFF) + good[off + 4:]
        with pytest.raises(ValueError):
            T.decode_declare(bad)

    def test_register_round_trip(self):
        msg = T.encode_register(0, 3, "10.0.0.7", 9000, 8, 4, 2, 4096000)
        assert T.decode_register(msg) == (0, 3, "10.0.0.7", 9000, 8, 4, 2, 4096000)
        msg = T.encode_register(1, -1, "", 0, 1, 1, 1, 0)
        assert T.decode_register(msg) == (1, -1, "", 0, 1, 1, 1, 0)

    @FAST
    @given(st.tuples(st.integers(0, 1), st.integers(-(1 << 31), (1 << 31) - 1),
                     st.text(max_size=60).filter(lambda s: len(s.encode()) <= 256),
                     st.integers(0, (1 << 32) - 1), st.integers(0, (1 << 32) - 1),
                     st.integers(0, (1 << 32) - 1), st.integers(0, (1 << 32) - 1),
                     st.integers(0, (1 << 64) - 1)))
    def test_register_round_trip_property(self, fields):
        assert T.decode_register(T.encode_register(*fields)) == fields

    def test_register_limits(self):
        with pytest.raises(ValueError):
            T.decode_register(T.encode_register(2, 0, "h", 1, 1, 1, 1, 1))  # a scheduler can't
        with pytest.raises(ValueError):
            T.decode_register(T.encode_register(0, 0, "h" * 257, 1, 1, 1, 1, 1))  # long host
        T.decode_register(T.encode_register(0, 0, "h" * 256, 1, 1, 1, 1, 1))

    @pytest.mark.parametrize("which", ["declare", "register"])
    def test_truncated_or_extended_payload(self, which):
        if which == "declare":
            good, decode = T.encode_declare(9, "w", 2, [3, 4], 24), T.decode_declare
        else:
            good, decode = T.encode_register(0, 1, "host", 5, 1, 2, 1, 4096), T.decode_register
        decode(good)
        for n in range(len(good)):
            with pytest.raises(ValueError):
                decode(good[:n])
        for extra in (b"\0", b"\xff" * 7, b"\0" * 100):
            with pytest.raises(ValueError):
                decode(good + extra)

    @FUZZ
    @given(st.binary(max_size=300))
    def test_fuzz_decoders_random_bytes(self, data):
        for decode in (T.decode_declare, T.decode_register):
            try:
                decode(data)
            except ValueError:
                pass
        if len(data) != 48:
            with pytest.raises(ValueError):
                T.decode_header(data)

    @FUZZ
    @given(st.data())
    def test_fuzz_decoders_mutated_messages(self, data):
        """Flip, cut and splice bytes of valid messages: only ValueError, never a crash."""
        good = data.draw(st.sampled_from([
            T.encode_declare(3, "layer.weight", 0, [16, 16, 3, 3], 9216),
            T.encode_register(0, 2, "192.168.1.20", 1234, 4, 8, 2, 4096000),
        ]))
        buf = bytearray(good)
        for _ in range(data.draw(st.integers(1, 6))):
            op = data.draw(st.sampled_from(["flip", "cut", "insert"]))
            if op == "flip" and buf:
                i = data.draw(st.integers(0, len(buf) - 1))
                buf[i] = data.draw(st.integers(0, 255))
            elif op == "cut" and buf:
                i = data.draw(st.integers(0, len(buf) - 1))
                del buf[i:i + data.draw(st.integers(1, 8))]
            else:
                i = data.draw(st.integers(0, len(buf)))
                buf[i:i] = data.draw(st.binary(min_size=1, max_size=8))
        for decode in (T.decode_declare, T.decode_register):
            try:
                decode(bytes(buf))
            except ValueError:
                pass
