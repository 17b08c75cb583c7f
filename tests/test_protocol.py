"""The host side of the link (ember.protocol) against a pure-Python twin of the link bridge."""

import random
import struct

import pytest

from ember import protocol, spec
from ember.protocol import (END, ESC, ESC_END, ESC_ESC, FrameError, Link, LinkError, LinkState,
                            SlipDecoder, crc16, decode_response, encode_request,
                            execute_request, seal, slip_encode)

MAX = spec.LINK_MAX_WORDS
STATUS = spec.LINK_STATUS


class FakeDevice:
    """The frame semantics of docs/protocol.md over a dict memory (the LinkBridge's twin).

    Words at or above `limit` are out_of_range, words in `busy` are busy. `writes` counts
    executed WRITE frames, so tests can tell a duplicate from a re-execution.
    """

    def __init__(self, limit=0x10000, busy=(), last_write_seq=None):
        self.limit, self.busy = limit, set(busy)
        self.memory = {}
        self.last_write_seq = last_write_seq
        self.writes = 0

    def handle(self, payload):
        """Response payload (CRC included) for one request payload."""
        seq = payload[1] if len(payload) >= 2 else 0
        if not protocol.REQUEST_HEADER_BYTES + 2 <= len(payload) <= protocol.MAX_REQUEST_BYTES:
            return self._error("bad_length", seq)
        cmd, seq, a0, a1, a2, count = struct.unpack("<BBBBBH", payload[:7])
        addr = a0 | a1 << 8 | a2 << 16
        data = payload[7:-2]
        if cmd in spec.LINK_COMMANDS.values():
            expected = 4 * count if cmd == spec.LINK_COMMANDS["write"] else 0
            if not 1 <= count <= MAX or len(data) != expected:
                return self._error("bad_length", seq)
        if crc16(payload[:-2]) != int.from_bytes(payload[-2:], "little"):
            return self._error("bad_crc", seq)
        if cmd not in spec.LINK_COMMANDS.values():
            return self._error("unknown_command", seq)
        if cmd == spec.LINK_COMMANDS["read"]:
            self.last_write_seq = None
            words = []
            for a in range(addr, addr + count):
                if a >= self.limit or a in self.busy:
                    return self._error("busy" if a in self.busy else "out_of_range", seq, a)
                words.append(self.memory.get(a, 0))
            return seal(bytes([STATUS["ok"], seq]) + b"".join(w.to_bytes(4, "little")
                                                              for w in words))
        if seq == self.last_write_seq:
            return seal(bytes([STATUS["duplicate"], seq]))
        self.writes += 1
        for i, a in enumerate(range(addr, addr + count)):
            if a >= self.limit or a in self.busy:
                self.last_write_seq = None
                return self._error("busy" if a in self.busy else "out_of_range", seq, a)
            self.memory[a] = int.from_bytes(data[4 * i:4 * i + 4], "little")
        self.last_write_seq = seq
        return seal(bytes([STATUS["ok"], seq]))

    @staticmethod
    def _error(status, seq, addr=0):
        return seal(bytes([STATUS[status], seq]) + addr.to_bytes(3, "little"))


class FakePort:
    """A pyserial-like port in front of a FakeDevice, with scripted faults.

    faults: {request index: fault}; the index counts request frames the port has seen.
      "drop"            the response is lost
      "corrupt"         one byte of the response frame is flipped
      "corrupt_request" one byte of the request is flipped before the device sees it
      "late"            the response arrives only after the next request is written
      "trailing"        the response arrives right after the next request's, in one read
      "noise"           line noise (then the real response) arrives
    ``read`` returns at once with what is buffered (nothing = a timeout); ``polls`` counts
    the calls, the clock make_link's Link measures its timeouts on.
    """

    def __init__(self, device, faults=None, seed=0):
        self.device = device
        self.faults = dict(faults or {})
        self.rng = random.Random(seed)
        self.requests = 0
        self.written = 0
        self.read_out = 0
        self.polls = 0
        self._decoder = SlipDecoder()
        self._inbox = bytearray()
        self._late = b""
        self._trailing = b""

    def write(self, data):
        self.written += len(data)
        self._inbox += self._late
        self._late = b""
        trailing, self._trailing = self._trailing, b""
        for payload in self._decoder.feed(data):
            fault = self.faults.get(self.requests)
            self.requests += 1
            if fault == "corrupt_request":
                payload = self._flip(payload)
            response = slip_encode(self.device.handle(payload))
            if fault == "drop":
                continue
            if fault == "corrupt":
                response = self._flip(response, skip_ends=True)
            if fault == "late":
                self._late = response
                continue
            if fault == "trailing":
                self._trailing = response
                continue
            if fault == "noise":
                response = bytes([0x13, 0x37, ESC, 0x00]) + response
            self._inbox += response
        self._inbox += trailing

    def _flip(self, data, skip_ends=False):
        data = bytearray(data)
        i = self.rng.randrange(1, len(data) - 1) if skip_ends else self.rng.randrange(len(data))
        data[i] ^= 1 << self.rng.randrange(8)
        if skip_ends and data[i] == END:     # keep the frame one frame
            data[i] ^= 0x01
        return bytes(data)

    def read(self, n):
        self.polls += 1
        out = bytes(self._inbox[:n])
        del self._inbox[:n]
        self.read_out += len(out)
        return out

    @property
    def in_waiting(self):
        return len(self._inbox)

    def reset_input_buffer(self):
        self._inbox.clear()


def make_link(device=None, faults=None, retries=5):
    device = device or FakeDevice()
    port = FakePort(device, faults)
    # the timeout counts the port's reads, not wall seconds: an answer the port holds is
    # read at the first poll however loaded the machine is (a 0.1 s wall-clock timeout once
    # made a loaded machine resend a frame here), and a lost one gives up after 8 empty polls
    return Link(port, retries=retries, timeout=8, clock=lambda: port.polls), port, device


# --- CRC and SLIP --------------------------------------------------------------------------------
def test_crc16_check_value():
    assert crc16(b"123456789") == 0x29B1
    assert crc16(b"") == 0xFFFF
    assert crc16(b"56789", crc16(b"1234")) == 0x29B1       # it continues


def test_slip_round_trip_random_payloads():
    rng = random.Random(0)
    payloads = [bytes(rng.choice([END, ESC, ESC_END, ESC_ESC, rng.getrandbits(8)])
                      for _ in range(rng.randrange(1, 60))) for _ in range(200)]
    stream = b"".join(slip_encode(p) for p in payloads)
    for frame, payload in zip(map(slip_encode, payloads), payloads):
        assert frame[0] == END and frame[-1] == END and END not in frame[1:-1]
        assert len(frame) == len(payload) + 2 + payload.count(END) + payload.count(ESC)
    decoder, got, pos = SlipDecoder(), [], 0
    while pos < len(stream):        # fed in random pieces
        step = rng.randrange(1, 20)
        got += decoder.feed(stream[pos:pos + step])
        pos += step
    assert got == payloads


def test_slip_escapes_exactly():
    assert slip_encode(bytes([1, END, 2, ESC, 3])) == \
        bytes([END, 1, ESC, ESC_END, 2, ESC, ESC_ESC, 3, END])


def test_decoder_resyncs_after_garbage():
    frame = slip_encode(b"\x01\xc0\x02")
    decoder = SlipDecoder()
    assert decoder.feed(b"\x55\xaa\xdb") == []              # noise, no END yet
    payloads = decoder.feed(frame + frame[:3])              # the leading END ends the noise
    assert payloads == [b"\x55\xaa", b"\x01\xc0\x02"]    # a dangling ESC adds nothing
    with pytest.raises(FrameError):
        decode_response(payloads[0])                        # the noise is rejected
    assert decoder.feed(frame) == [b"\x01", b"\x01\xc0\x02"]    # the cut frame, then whole
    assert decoder.feed(bytes([END, END, END])) == []       # empty frames are skipped


def test_decoder_drops_overlong_frames():
    decoder = SlipDecoder(max_payload=8)
    assert decoder.feed(bytes(20) + slip_encode(b"ok")) == [b"ok"]
    assert decoder.overlong == 1


# --- Requests and responses ----------------------------------------------------------------------
def test_request_layout():
    frame = encode_request("write", 0x12, 0x123456, 2, [0xC0DB0102, 0x0A0B0C0D])
    body = bytes([0x02, 0x12, 0x56, 0x34, 0x12, 0x02, 0x00,
                  0x02, 0x01, 0xDB, 0xC0, 0x0D, 0x0C, 0x0B, 0x0A])
    assert SlipDecoder().feed(frame) == [body + crc16(body).to_bytes(2, "little")]
    read = SlipDecoder().feed(encode_request("read", 7, 0x10, 3))[0]
    assert read[:7] == bytes([0x01, 7, 0x10, 0, 0, 3, 0]) and len(read) == 9


@pytest.mark.parametrize("args, message", [
    (("read", 1, 0, 0), "1..256 words; got count 0"),
    (("read", 1, 0, MAX + 1), f"got count {MAX + 1}"),
    (("read", 1, 0xFFFFFF, 2), "outside the 24-bit bus address space"),
    (("read", 256, 0, 1), "seq 256 is outside 0..255"),
    (("write", 1, 0, 2, [1]), "needs 2 words; got 1"),
    (("write", 1, 0, 1, [1 << 32]), "word 0 is 4294967296"),
    (("erase", 1, 0, 1), "unknown link command 'erase'"),
])
def test_request_checks_name_value_and_limit(args, message):
    with pytest.raises(ValueError, match=message):
        encode_request(*args)


def test_decode_response_forms():
    ok = decode_response(seal(bytes([0, 5]) + (0xDEADBEEF).to_bytes(4, "little")))
    assert (ok.status, ok.seq, ok.words, ok.addr) == ("ok", 5, [0xDEADBEEF], None)
    err = decode_response(seal(bytes([STATUS["busy"], 6, 0x02, 0x10, 0x00])))
    assert (err.status, err.seq, err.addr) == ("busy", 6, 0x1002)
    assert decode_response(seal(bytes([0x7E, 6, 0, 0, 0]))).status == "error_0x7e"
    with pytest.raises(FrameError, match="CRC"):
        decode_response(bytes([0, 5, 0, 0]))
    with pytest.raises(FrameError, match="not whole words"):
        decode_response(seal(bytes([0, 5, 1, 2])))
    with pytest.raises(FrameError, match="expected the 3-byte address"):
        decode_response(seal(bytes([STATUS["out_of_range"], 5])))
    with pytest.raises(FrameError, match="shortest is 4"):
        decode_response(b"\x00")


# --- The Link client -----------------------------------------------------------------------------
def test_link_round_trip_across_frames():
    rng = random.Random(1)
    link, port, device = make_link()
    words = [rng.getrandbits(32) for _ in range(2 * MAX + 17)]
    link.write_words(0x1000, words)
    assert [device.memory[0x1000 + i] for i in range(len(words))] == words
    assert link.read_words(0x1000, len(words)) == words
    assert link.read_words(0x1000 + MAX - 1, 2) == words[MAX - 1:MAX + 1]
    # 1 sync read + 3 write frames + 3 + 1 read frames, no retries.
    assert port.requests == 8 and device.writes == 3 and link.retransmissions == 0
    assert (link.tx_bytes, link.rx_bytes) == (port.written, port.read_out)
    assert link.seq == 8


@pytest.mark.parametrize("fault", ["drop", "corrupt", "corrupt_request", "late", "noise"])
def test_link_recovers_from_faults(fault):
    rng = random.Random(2)
    words = [rng.getrandbits(32) for _ in range(40)]
    faults = {1: fault, 2: fault, 4: fault}     # request 0 is the sync read
    link, port, device = make_link(faults=faults)
    link.write_words(0x200, words[:20])
    link.write_words(0x214, words[20:])
    assert link.read_words(0x200, 40) == words
    assert device.writes == 2                   # every write executed exactly once
    if fault != "noise":
        assert link.retransmissions >= 2


def test_link_counts_resent_frames_and_their_bytes():
    """A write whose answer comes late is sent again: the Link counts the frame and its bytes,
    and the duplicate answer to the second transmission as bytes beyond one answer per frame,
    so the counts of a clean session follow by subtraction."""
    clean, clean_port, _ = make_link()
    link, port, device = make_link(faults={1: "late"})   # request 0 is the sync read
    for each in (clean, link):
        each.write_words(0x10, [1, 2, 3])
        assert each.read_words(0x10, 3) == [1, 2, 3]
    assert device.writes == 1
    assert (clean.resent_frames, link.resent_frames, link.retransmissions) == (0, 1, 1)
    assert link.resent_bytes == len(encode_request("write", 1, 0x10, 3, [1, 2, 3]))
    duplicate = slip_encode(seal(bytes([STATUS["duplicate"], 1])))
    assert link.resent_answer_bytes == len(duplicate) and clean.resent_answer_bytes == 0
    assert (link.tx_bytes, link.rx_bytes) == (port.written, port.read_out)
    assert port.written - link.resent_bytes == clean_port.written
    assert port.read_out - link.resent_answer_bytes == clean_port.read_out
    assert link.resend_counts() == {"link_resent_frames": 1,
                                    "link_resent_bytes": link.resent_bytes,
                                    "link_resent_answer_bytes": len(duplicate)}


def test_link_timeout_runs_on_its_clock():
    """A Link given a clock that does not advance waits for the answer instead of sending
    the frame again (the simulated board's clock stands still while the simulator is slow)."""
    class SlowPort(FakePort):
        polls = 0

        def read(self, n):
            self.polls += 1
            return super().read(n) if self.polls > 50 else b""
    ticks = iter(range(10 ** 6))
    device = FakeDevice()
    port = SlowPort(device)
    stalled = Link(port, timeout=1.0, clock=lambda: 0.0)
    assert stalled.read_words(0x10, 1) == [0] and stalled.resent_frames == 0
    port.polls = 0
    hurried = Link(port, timeout=5, clock=lambda: float(next(ticks)), retries=20)
    assert hurried.read_words(0x10, 1) == [0] and hurried.resent_frames > 0


def test_lost_write_response_is_answered_duplicate():
    link, port, device = make_link(faults={1: "drop"})
    link.write_words(0x10, [1, 2, 3])
    assert device.writes == 1 and port.requests == 3 and link.retransmissions == 1
    assert [device.memory[a] for a in (0x10, 0x11, 0x12)] == [1, 2, 3]


def test_fresh_link_is_not_fooled_by_an_earlier_sessions_seq():
    # The device's last write had seq 1: the seq this link's first write gets after its
    # sync read (seq 0). Without that read the write would be taken for a duplicate.
    device = FakeDevice(last_write_seq=1)
    link, port, _ = make_link(device)
    link.write_words(0x10, [42])
    assert device.memory == {0x10: 42} and device.writes == 1


def test_duplicate_on_first_transmission_is_an_error():
    class Confused(FakeDevice):
        def handle(self, payload):
            if payload[0] == spec.LINK_COMMANDS["write"]:
                return seal(bytes([STATUS["duplicate"], payload[1]]))
            return super().handle(payload)
    link, _, _ = make_link(Confused())
    with pytest.raises(LinkError, match="first transmission of seq 1 a duplicate"):
        link.write_words(0, [1])


def test_retries_exhausted_raise():
    link, port, device = make_link(faults={i: "drop" for i in range(1, 10)}, retries=3)
    link.read_words(0, 1)
    with pytest.raises(LinkError) as info:
        link.read_words(0x20, 2)
    assert port.requests == 5
    assert info.value.status == "no_response" and info.value.seq == 1
    assert "read of 2 words at 0x000020 failed: no valid response to seq 1 after 4 attempts" \
        in str(info.value)


def test_bus_errors_name_status_and_address():
    device = FakeDevice(limit=0x1002, busy={0x800})
    link, port, _ = make_link(device)
    with pytest.raises(LinkError) as info:
        link.write_words(0x1000, [1, 2, 3, 4])
    assert str(info.value).startswith("write of 4 words at 0x001000 failed: out_of_range at "
                                      "0x001002")
    assert (info.value.status, info.value.addr) == ("out_of_range", 0x1002)
    assert device.memory == {0x1000: 1, 0x1001: 2}  # the words before the failing one
    requests = port.requests
    with pytest.raises(LinkError, match=r"read of 3 words at 0x0007ff failed: busy at 0x000800"):
        link.read_words(0x7FF, 3)
    assert port.requests == requests + 1            # not retried


def test_unknown_command_is_not_retried():
    class Old(FakeDevice):
        def handle(self, payload):
            return self._error("unknown_command", payload[1])
    link, port, _ = make_link(Old())
    with pytest.raises(LinkError, match=r"read of 1 words at 0x000000 failed: unknown_command "
                                        r"\(seq 0\)$") as info:
        link.read_words(0, 1)
    assert port.requests == 1 and info.value.addr is None


def test_link_checks_arguments():
    link, port, _ = make_link()
    with pytest.raises(ValueError, match="word 1 is -1"):
        link.write_words(0, [0, -1])
    with pytest.raises(ValueError, match="24-bit"):
        link.read_words((1 << 24) - 1, 2)
    assert port.requests == 0


# --- The bridge's twin ---------------------------------------------------------------------------
class _BusError(Exception):
    def __init__(self, status):
        super().__init__(status)
        self.status = status


class DictBus:
    """The FakeDevice's memory map behind the bus interface execute_request expects."""

    def __init__(self, limit, busy=()):
        self.limit, self.busy, self.memory = limit, set(busy), {}

    def _check(self, addr):
        if addr >= self.limit or addr in self.busy:
            raise _BusError("busy" if addr in self.busy else "out_of_range")

    def read(self, addr):
        self._check(addr)
        return self.memory.get(addr, 0)

    def write(self, addr, value):
        self._check(addr)
        self.memory[addr] = value


def test_execute_request_matches_the_fake_device():
    """Random good, damaged and malformed requests: execute_request answers each like the test
    file's independent FakeDevice and leaves the same memory."""
    rng = random.Random(7)
    device, bus, state = FakeDevice(limit=0x40, busy={0x30}), DictBus(0x40, {0x30}), LinkState()
    for _ in range(600):
        count = rng.choice([1, 2, 5, rng.randrange(0, MAX + 2)])
        cmd = rng.choice([1, 2, 2, 0, 3])
        words = [rng.getrandbits(32) for _ in range(rng.choice([count, count, count + 1, 0]))]
        body = struct.pack("<BB", cmd, rng.randrange(4)) + \
            rng.randrange(0x48).to_bytes(3, "little") + struct.pack("<H", count) + \
            b"".join(w.to_bytes(4, "little") for w in words)
        payload = bytearray(seal(body))
        damage = rng.random()
        if damage < 0.1:
            payload[rng.randrange(len(payload))] ^= 1 << rng.randrange(8)
        elif damage < 0.15:
            payload = payload[:rng.randrange(len(payload))]
        expected = device.handle(bytes(payload))
        assert execute_request(payload, bus, state) == expected, payload.hex()
    assert bus.memory == device.memory and len(device.memory) > 20
    with pytest.raises(TypeError, match="LinkState"):
        execute_request(payload, bus, None)


def test_register_map_export_is_current():
    """docs/register_map.json is what `python -m ember.regmap` prints (regenerate it when
    spec.py changes)."""
    import json
    from pathlib import Path
    from ember import regmap
    committed = json.loads((Path(__file__).parent.parent / "docs/register_map.json").read_text())
    assert committed == json.loads(json.dumps(regmap.register_map()))


# --- Posted writes (a command's answer owed while other frames go) ----------------------------
@pytest.mark.parametrize("fault", [None, "late", "trailing"])
def test_a_posted_write_answer_is_kept_among_other_frames(fault):
    """The answer to a posted write that arrives while the Link waits for another frame's
    (in the input it drops before sending, or among the answers it reads, before or after
    the one it waits for) is kept for await_write: nothing is sent again and no byte counts
    as a resent answer."""
    link, port, device = make_link(faults={1: fault})   # request 0 is the sync read
    posted = link.post_write(0x10, 5)
    link.write_words(0x20, [1, 2])
    sent = port.requests
    assert link.await_write(posted).status == "ok"
    assert port.requests == sent
    assert device.writes == 2 and device.memory[0x10] == 5 and device.memory[0x21] == 2
    assert (link.resent_frames, link.resent_answer_bytes) == (0, 0)
    assert (link.tx_bytes, link.rx_bytes) == (port.written, port.read_out)
    assert link.kept_answer_bytes == len(slip_encode(seal(bytes([STATUS["ok"], posted.seq]))))
    with pytest.raises(RuntimeError):
        link.post_write(0x11, 1)
        link.post_write(0x12, 1)


def test_a_posted_write_whose_answer_is_lost_is_not_sent_again():
    """A lost answer to a posted write raises LinkError (no_response) without sending the
    frame again (the device would run it again); one the device got garbled (bad_crc) is
    sent again, as it did not run."""
    link, port, device = make_link(faults={1: "drop"})
    posted = link.post_write(0x10, 5)
    link.write_words(0x20, [1])
    with pytest.raises(LinkError) as error:
        link.await_write(posted)
    assert error.value.status == "no_response" and "may have run" in str(error.value)
    assert device.writes == 2 and link.resent_frames == 0
    link, port, device = make_link(faults={1: "corrupt_request"})
    posted = link.post_write(0x10, 5)
    assert link.await_write(posted).status == "ok"
    assert device.writes == 1 and device.memory[0x10] == 5 and link.resent_frames == 1
