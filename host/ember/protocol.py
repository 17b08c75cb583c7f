"""The host side of the link: frames, CRC, and a retrying word-access client.

The engine's link bridge (``hw/ember_hw/link.py``, ``LinkBridge``) and this module implement the
same frame format, written down in docs/protocol.md. In short: SLIP-framed payloads, each ending
in a CRC-16/CCITT-FALSE; a request reads or writes up to ``spec.LINK_MAX_WORDS`` bus words, and
every request frame is answered by exactly one response frame.

- ``crc16``, ``slip_encode``, ``SlipDecoder``: the framing layer.
- ``encode_request`` / ``decode_response``: the payload layer (host view).
- ``FrameReceiver``, ``execute_request`` / ``LinkState``: the bridge's side in Python, for
  model backends and as the gateware's reference.
- ``Link``: word reads and writes over any pyserial-like port, with sequence numbers, retries
  of lost or garbled frames and duplicate suppression for writes.

The gateware imports the framing constants below, so each byte value is defined once.
"""

import time
from dataclasses import dataclass, field

from . import spec

# --- Framing -------------------------------------------------------------------------------------
#: SLIP special bytes (RFC 1055).
END = 0xC0
ESC = 0xDB
ESC_END = 0xDC
ESC_ESC = 0xDD

#: CRC-16/CCITT-FALSE: polynomial 0x1021, initial value 0xFFFF, no reflection, no final xor.
CRC_POLY = 0x1021
CRC_INIT = 0xFFFF
CRC_BYTES = 2

# --- Payload layout ------------------------------------------------------------------------------
#: Bytes of one bus word and of one bus address in a payload (both little-endian).
WORD_BYTES = spec.BUS_DATA_BITS // 8
ADDR_BYTES = (spec.BUS_ADDR_BITS + 7) // 8
COUNT_BYTES = 2
#: Request header: cmd, seq, addr, count.
REQUEST_HEADER_BYTES = 2 + ADDR_BYTES + COUNT_BYTES
#: Longest request payload (a full WRITE), CRC included.
MAX_REQUEST_BYTES = REQUEST_HEADER_BYTES + WORD_BYTES * spec.LINK_MAX_WORDS + CRC_BYTES
#: Longest response payload (a full READ), CRC included.
MAX_RESPONSE_BYTES = 2 + WORD_BYTES * spec.LINK_MAX_WORDS + CRC_BYTES

STATUS_NAMES = {code: name for name, code in spec.LINK_STATUS.items()}
#: Statuses that mean "the request was damaged on the way": the host sends it again.
RETRYABLE = ("bad_crc", "bad_length")
#: Statuses whose response carries no address field.
_NO_ADDR = ("ok", "duplicate")

assert spec.BUS_DATA_BITS % 8 == 0, "bus words travel as whole bytes"
assert 1 <= spec.LINK_MAX_WORDS < (1 << (8 * COUNT_BYTES))


def _crc16_bitwise(data, crc=CRC_INIT):
    """The bit-serial recurrence (MSB first), the same as the gateware's ``crc16_update``."""
    for byte in data:
        crc ^= byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ CRC_POLY) if crc & 0x8000 else (crc << 1)
            crc &= 0xFFFF
    return crc


#: crc16 one byte at a time: the bit-serial recurrence tabulated for every byte value.
_CRC_TABLE = tuple(_crc16_bitwise(bytes([b]), 0) for b in range(256))


def crc16(data, crc=CRC_INIT):
    """CRC-16/CCITT-FALSE of `data` (bytes-like), continuing from `crc`.

    Table-driven form of the bit-serial recurrence (``_crc16_bitwise``, the same as the
    gateware's ``crc16_update``). ``crc16(b"123456789") == 0x29B1``.
    """
    table = _CRC_TABLE
    for byte in data:
        crc = ((crc << 8) & 0xFFFF) ^ table[(crc >> 8) ^ byte]
    return crc


def seal(body):
    """`body` followed by its CRC (little-endian): a complete, unframed payload."""
    return bytes(body) + crc16(body).to_bytes(CRC_BYTES, "little")


def slip_encode(payload):
    """Frame one payload: END, the payload with END/ESC escaped, END.

    The leading END makes the receiver discard any line noise before the frame.
    """
    body = bytes(payload).replace(bytes([ESC]), bytes([ESC, ESC_ESC])) \
        .replace(bytes([END]), bytes([ESC, ESC_END]))
    return bytes([END]) + body + bytes([END])


class SlipDecoder:
    """Turns a byte stream into frame payloads.

    ``feed(data)`` returns the payloads completed by `data` (a list, possibly empty). An END
    ends the frame in progress; empty frames are skipped. An ESC followed by anything but
    ESC_END/ESC_ESC keeps the byte as it is (RFC 1055); the frame's CRC then rejects it.
    A frame growing past `max_payload` bytes is line noise: it is dropped up to the next END
    and counted in ``overlong``.
    """

    def __init__(self, max_payload=max(MAX_REQUEST_BYTES, MAX_RESPONSE_BYTES)):
        self.max_payload = max_payload
        self.overlong = 0
        self.reset()

    def reset(self):
        """Forget any partial frame (the next END starts afresh)."""
        self._frame = bytearray()
        self._escaped = False
        self._discarding = False

    def feed(self, data):
        """Decode `data`; return the list of payloads it completed, in order."""
        payloads = []
        for byte in data:
            if byte == END:
                if self._frame and not self._discarding:
                    payloads.append(bytes(self._frame))
                self.reset()
                continue
            if self._discarding:
                continue
            if self._escaped:
                self._escaped = False
                byte = {ESC_END: END, ESC_ESC: ESC}.get(byte, byte)
            elif byte == ESC:
                self._escaped = True
                continue
            if len(self._frame) >= self.max_payload:
                self._discarding = True
                self.overlong += 1
                continue
            self._frame.append(byte)
        return payloads


@dataclass
class ReceivedFrame:
    """One frame as the link bridge's receiver delimits it (see FrameReceiver).

    payload:    its bytes after unescaping, the CRC field included; a frame longer than the
                longest request keeps only its first MAX_REQUEST_BYTES + 1 bytes (enough to
                know that it is too long, and its seq).
    bad_escape: an ESC in it was followed by neither ESC_END nor ESC_ESC.
    """
    payload: bytes
    bad_escape: bool = False


class FrameReceiver:
    """The link bridge's receiver (``LinkBridge``'s RECEIVE state) in Python: the device side
    of the framing, for model backends.

    ``feed(data)`` returns the ReceivedFrames that `data` completed. It differs from the host's
    SlipDecoder where the bridge does: a frame too long for any request is still a frame (the
    bridge answers it ``bad_length``, not silence), and a bad escape is remembered with the
    frame (the bridge answers ``bad_crc`` even when the CRC, computed over the byte kept as it
    is, matches). As in the bridge, a frame is empty (and gets no answer) when it delivered no
    byte: END END, or END ESC END.
    """

    def __init__(self):
        self.reset()

    def reset(self):
        """Forget any partial frame, as the bridge does after it has answered one."""
        self._frame = bytearray()
        self._received = 0              # bytes delivered, kept or not
        self._escaped = False
        self._bad_escape = False

    def feed(self, data):
        """Delimit and unescape `data`; return the list of frames it completed, in order."""
        frames = []
        keep = MAX_REQUEST_BYTES + 1
        for byte in bytes(data):
            if byte == END:
                if self._received:
                    frames.append(ReceivedFrame(bytes(self._frame), self._bad_escape))
                self.reset()
                continue
            if self._escaped:
                self._escaped = False
                if byte == ESC_END:
                    byte = END
                elif byte == ESC_ESC:
                    byte = ESC
                else:
                    self._bad_escape = True     # the byte itself is kept, as in the bridge
            elif byte == ESC:
                self._escaped = True
                continue
            self._received += 1
            if len(self._frame) < keep:
                self._frame.append(byte)
        return frames


# --- Requests and responses ----------------------------------------------------------------------
def _command_code(cmd):
    if isinstance(cmd, str):
        if cmd not in spec.LINK_COMMANDS:
            raise ValueError(f"unknown link command {cmd!r}; known: {sorted(spec.LINK_COMMANDS)}")
        return spec.LINK_COMMANDS[cmd]
    if cmd not in spec.LINK_COMMANDS.values():
        raise ValueError(f"unknown link command code {cmd!r}; known: {spec.LINK_COMMANDS}")
    return cmd


def _check_span(addr, count):
    if not 1 <= count <= spec.LINK_MAX_WORDS:
        raise ValueError(f"a frame carries 1..{spec.LINK_MAX_WORDS} words; got count {count}")
    if not 0 <= addr or addr + count > (1 << spec.BUS_ADDR_BITS):
        raise ValueError(f"words 0x{addr:06x}..0x{addr + count - 1:06x} are outside the "
                         f"{spec.BUS_ADDR_BITS}-bit bus address space")


def encode_request(cmd, seq, addr, count, words=None):
    """A framed request (bytes ready for the wire).

    cmd:   "read"/"write" or its code from spec.LINK_COMMANDS.
    seq:   sequence number 0..255 (a retry reuses it).
    addr:  word address of the first word; the address increments per word.
    count: words to read or write, 1..LINK_MAX_WORDS.
    words: the `count` words of a WRITE (each 0..2**32-1); None for a READ.
    """
    code = _command_code(cmd)
    if not 0 <= seq <= 0xFF:
        raise ValueError(f"seq {seq} is outside 0..255")
    _check_span(addr, count)
    body = bytearray([code, seq])
    body += addr.to_bytes(ADDR_BYTES, "little") + count.to_bytes(COUNT_BYTES, "little")
    if code == spec.LINK_COMMANDS["write"]:
        words = list(words if words is not None else [])
        if len(words) != count:
            raise ValueError(f"a write of count {count} needs {count} words; got {len(words)}")
        for i, word in enumerate(words):
            if not 0 <= word < (1 << spec.BUS_DATA_BITS):
                raise ValueError(f"word {i} is {word}; bus words are 0..2**{spec.BUS_DATA_BITS}-1")
            body += int(word).to_bytes(WORD_BYTES, "little")
    elif words is not None:
        raise ValueError("a read request carries no words")
    return slip_encode(seal(body))


class FrameError(ValueError):
    """A payload that is not a well-formed response (bad CRC, wrong length)."""


@dataclass
class Response:
    """One decoded response.

    status: name from spec.LINK_STATUS, or "error_0xNN" for a code the spec does not name.
    code:   the status byte.
    seq:    the sequence number the device echoed.
    words:  the data of a successful READ (empty otherwise).
    addr:   for an error status, the address field: the failing word for a bus error, 0 for a
            frame error (bad_crc, bad_length, unknown_command); None for ok and duplicate.
    payload: the unframed payload it was decoded from (CRC included).
    """
    status: str
    seq: int
    words: list = field(default_factory=list)
    addr: int | None = None
    code: int = 0
    payload: bytes = b""


def decode_response(payload):
    """Decode a response payload (unframed, CRC included). Raises FrameError if malformed."""
    payload = bytes(payload)
    if len(payload) < 2 + CRC_BYTES:
        raise FrameError(f"response of {len(payload)} bytes; the shortest is {2 + CRC_BYTES}")
    body, received = payload[:-CRC_BYTES], int.from_bytes(payload[-CRC_BYTES:], "little")
    computed = crc16(body)
    if received != computed:
        raise FrameError(f"response CRC 0x{received:04x} does not match its bytes "
                         f"(0x{computed:04x})")
    code, seq, tail = body[0], body[1], body[2:]
    status = STATUS_NAMES.get(code, f"error_0x{code:02x}")
    if status == "ok":
        if len(tail) % WORD_BYTES:
            raise FrameError(f"ok response with {len(tail)} data bytes, not whole words")
        words = [int.from_bytes(tail[i:i + WORD_BYTES], "little")
                 for i in range(0, len(tail), WORD_BYTES)]
        return Response(status, seq, words, None, code, payload)
    if status == "duplicate":
        if tail:
            raise FrameError(f"duplicate response with {len(tail)} extra bytes")
        return Response(status, seq, [], None, code, payload)
    if len(tail) != ADDR_BYTES:
        raise FrameError(f"{status} response with {len(tail)} bytes after seq; expected the "
                         f"{ADDR_BYTES}-byte address")
    return Response(status, seq, [], int.from_bytes(tail, "little"), code, payload)


# --- The bridge's twin ---------------------------------------------------------------------------
@dataclass
class LinkState:
    """What the link bridge remembers between frames: the seq of the last WRITE it completed
    (None after reset, an executed READ or a WRITE that hit a bus error)."""
    last_write_seq: int | None = None


def _error_response(status, seq, addr=0):
    code = spec.LINK_STATUS[status] if isinstance(status, str) else status
    return seal(bytes([code, seq]) + addr.to_bytes(ADDR_BYTES, "little"))


def execute_request(payload, bus, state, bad_escape=False):
    """LinkBridge's handling of one request, in Python: the response payload (CRC included).

    payload:    one request payload as FrameReceiver delimits it (CRC included; any length).
    bus:        has ``read(addr) -> int`` and ``write(addr, value)``; a bus error is an
                exception with a ``status`` attribute (a LINK_STATUS name or code).
    state:      a LinkState, updated by the duplicate rule.
    bad_escape: the frame held a bad escape (ReceivedFrame.bad_escape): answered ``bad_crc``
                if its length is right, whatever its CRC.

    Checks and effects follow docs/protocol.md exactly, in the gateware's order, so a model
    backend answers every frame, damaged ones included, byte for byte like the engine.
    """
    if not isinstance(state, LinkState):
        raise TypeError(f"state must be an ember.protocol.LinkState; got {state!r}")
    payload = bytes(payload)
    seq = payload[1] if len(payload) >= 2 else 0
    if not REQUEST_HEADER_BYTES + CRC_BYTES <= len(payload) <= MAX_REQUEST_BYTES:
        return _error_response("bad_length", seq)
    cmd = payload[0]
    addr = int.from_bytes(payload[2:2 + ADDR_BYTES], "little")
    count = int.from_bytes(payload[2 + ADDR_BYTES:REQUEST_HEADER_BYTES], "little")
    data = payload[REQUEST_HEADER_BYTES:-CRC_BYTES]
    is_write = cmd == spec.LINK_COMMANDS["write"]
    if cmd in spec.LINK_COMMANDS.values():
        if not 1 <= count <= spec.LINK_MAX_WORDS or \
                len(data) != (WORD_BYTES * count if is_write else 0):
            return _error_response("bad_length", seq)
    if bad_escape or \
            crc16(payload[:-CRC_BYTES]) != int.from_bytes(payload[-CRC_BYTES:], "little"):
        return _error_response("bad_crc", seq)
    if cmd not in spec.LINK_COMMANDS.values():
        return _error_response("unknown_command", seq)
    if is_write and seq == state.last_write_seq:
        return seal(bytes([spec.LINK_STATUS["duplicate"], seq]))
    state.last_write_seq = None
    words = []
    for i in range(count):
        # The bridge's address counter has BUS_ADDR_BITS bits.
        word_addr = (addr + i) & ((1 << spec.BUS_ADDR_BITS) - 1)
        try:
            if is_write:
                bus.write(word_addr, int.from_bytes(data[WORD_BYTES * i:WORD_BYTES * (i + 1)],
                                                    "little"))
            else:
                words.append(bus.read(word_addr))
        except Exception as error:
            status = getattr(error, "status", None)
            if status is None:
                raise
            return _error_response(status, seq, word_addr)
    if is_write:
        state.last_write_seq = seq
    return seal(bytes([spec.LINK_STATUS["ok"], seq])
                + b"".join(int(w).to_bytes(WORD_BYTES, "little") for w in words))


# --- The client ----------------------------------------------------------------------------------
class LinkError(RuntimeError):
    """A link operation that failed: the device refused it, or no valid response came.

    status: the device's status name, or "no_response" when retries ran out.
    seq:    the frame's sequence number.
    addr:   the failing word's address for a bus error, else None.
    """

    def __init__(self, message, status, seq, addr=None):
        super().__init__(message)
        self.status = status
        self.seq = seq
        self.addr = addr


def default_timeout(baud):
    """Seconds to wait for one response: a worst-case (fully escaped) longest request and
    response at `baud`, 10 bits per byte, plus 0.25 s of slack for the host's OS."""
    worst_bytes = 2 * (MAX_REQUEST_BYTES + MAX_RESPONSE_BYTES) + 4
    return 0.25 + worst_bytes * 10 / baud


@dataclass(frozen=True)
class PostedWrite:
    """A WRITE frame sent by ``Link.post_write`` whose answer is owed."""
    seq: int
    frame: bytes
    what: str


class Link:
    """Word reads and writes to the engine over a byte port.

    port:    any pyserial-like object with ``write(bytes)``, ``read(n)`` (returns what arrived,
             possibly nothing, within the port's own timeout, which must be finite) and
             ``reset_input_buffer()``.
    retries: how often a frame is sent again after a timeout, a garbled response or a
             bad_crc/bad_length status, before LinkError.
    timeout: seconds to wait for each response, on `clock`; by default long enough for the
             longest frames at the port's ``baudrate`` (spec.DEFAULT_BAUD if it has none).
    clock:   what the timeout is measured on: a callable returning seconds, by default the
             wall clock (``time.monotonic``); if it has a ``restart()`` method, that is called
             when a wait for an answer begins. The simulated board's link passes the
             simulation's own time (ember.device.SimulationClock), so a slow simulator makes
             the host wait longer instead of sending frames again.

    Each frame gets the next sequence number (mod 256); a retry reuses it, so a WRITE whose
    response was lost is answered ``duplicate`` instead of being executed twice, which counts
    as success. Before its first write a Link sends one read (of the word it is about to write)
    so the device forgets the last WRITE seq of a previous session, which could otherwise
    equal the new one.

    Counters (cumulative): ``tx_bytes``/``rx_bytes``, every byte written and read (bytes
    dropped before a resend included); ``resent_frames`` (also ``retransmissions``), frames
    sent again, and ``resent_bytes``, their bytes; ``resent_answer_bytes``, bytes received
    beyond one answer per frame (answers to earlier transmissions of a frame sent again, late
    answers, line noise). Over a link that loses nothing, the device has therefore received
    ``tx_bytes`` bytes of which ``resent_bytes`` a session without resends would not have
    sent, and sent ``rx_bytes`` of which ``resent_answer_bytes`` such a session would not
    have received: what tests comparing link counters subtract.
    """

    def __init__(self, port, retries=5, timeout=None, clock=None):
        self.port = port
        self.retries = retries
        baud = getattr(port, "baudrate", None) or spec.DEFAULT_BAUD
        self.timeout = default_timeout(baud) if timeout is None else timeout
        self.clock = clock or time.monotonic
        self.seq = 0
        self.tx_bytes = 0
        self.rx_bytes = 0
        self.resent_frames = 0
        self.resent_bytes = 0
        self.resent_answer_bytes = 0
        self._decoder = SlipDecoder()
        self._device_synced = False
        # posted writes whose answer is owed: seq -> (Response, its wire bytes) once it has
        # arrived while the host waited for another frame's, else None
        self._owed = {}
        self._owed_bytes = 0
        #: bytes of answers to posted writes that arrived while the Link waited for another
        #: frame's answer (counted in rx_bytes when they arrived)
        self.kept_answer_bytes = 0

    @property
    def retransmissions(self):
        """Frames sent again (the same as ``resent_frames``)."""
        return self.resent_frames

    def resend_counts(self):
        """The resend counters as a dict (for a run's JSON)."""
        return {"link_resent_frames": self.resent_frames,
                "link_resent_bytes": self.resent_bytes,
                "link_resent_answer_bytes": self.resent_answer_bytes}

    def read_words(self, addr, count):
        """Read `count` words starting at word address `addr`; returns a list of ints."""
        if count < 1 or addr < 0 or addr + count > (1 << spec.BUS_ADDR_BITS):
            raise ValueError(f"cannot read {count} words at 0x{addr:06x}: the bus has "
                             f"{spec.BUS_ADDR_BITS}-bit addresses and a read needs >= 1 word")
        what = f"read of {count} words at 0x{addr:06x}"
        words = []
        for start in range(0, count, spec.LINK_MAX_WORDS):
            n = min(spec.LINK_MAX_WORDS, count - start)
            words += self._transact("read", addr + start, n, None, what).words
        return words

    def post_write(self, addr, word):
        """Send a one-word WRITE whose answer comes late (a command: the engine answers it
        when the command ends) and return at once, with a ticket for ``await_write``.
        Meanwhile other frames go and come as usual (the device answers them while the
        command runs, docs/protocol.md section 10); the posted frame's answer, if it arrives
        among theirs, is kept for ``await_write``. One write may be owed at a time."""
        if self._owed:
            raise RuntimeError("a posted write's answer is still owed")
        self._check_words(addr, [word])
        what = f"write of 1 words at 0x{addr:06x}"
        if not self._device_synced:
            self._transact("read", addr, 1, None, what, any_status=True)
        seq, frame = self._next_frame("write", addr, 1, [int(word)])
        received_before = self.rx_bytes
        self._send(frame)
        # what waited in the port (a late answer, noise) is beyond one answer per frame
        self.resent_answer_bytes += self.rx_bytes - received_before
        self._owed[seq] = None
        return PostedWrite(seq, frame, what)

    def await_write(self, posted):
        """Wait for the answer to ``post_write``'s frame, up to the Link's timeout; returns it
        or raises LinkError, as ``write_words``. The frame is sent again only if the device
        answered that it arrived garbled (bad_crc, bad_length: not executed). A lost or
        garbled answer raises LinkError (``no_response``) instead: the command may have run,
        and a WRITE sent after it means the device would run it again rather than answer
        ``duplicate``."""
        return self._transact("write", None, 1, None, posted.what, posted=posted)

    def write_words(self, addr, words):
        """Write `words` (ints 0..2**32-1) starting at word address `addr`.

        Split into frames of at most LINK_MAX_WORDS; if one fails, the frames before it and the
        words before the failing one (see LinkError.addr) stay written.
        """
        words = [int(w) for w in words]
        self._check_words(addr, words)
        what = f"write of {len(words)} words at 0x{addr:06x}"
        if not self._device_synced:
            self._transact("read", addr, 1, None, what, any_status=True)
        for start in range(0, len(words), spec.LINK_MAX_WORDS):
            chunk = words[start:start + spec.LINK_MAX_WORDS]
            self._transact("write", addr + start, len(chunk), chunk, what)

    @staticmethod
    def _check_words(addr, words):
        if not words or addr < 0 or addr + len(words) > (1 << spec.BUS_ADDR_BITS):
            raise ValueError(f"cannot write {len(words)} words at 0x{addr:06x}: the bus has "
                             f"{spec.BUS_ADDR_BITS}-bit addresses and a write needs >= 1 word")
        for i, word in enumerate(words):
            if not 0 <= int(word) < (1 << spec.BUS_DATA_BITS):
                raise ValueError(f"word {i} is {word}; bus words are 0..2**{spec.BUS_DATA_BITS}-1")

    def _next_frame(self, cmd, addr, count, words):
        seq, self.seq = self.seq, (self.seq + 1) & 0xFF
        return seq, encode_request(cmd, seq, addr, count, words)

    def _send(self, frame):
        self._drop_input()
        if not self._owed:
            self._decoder.reset()       # (while an answer is owed, it may be half received)
        self.port.write(frame)
        self.tx_bytes += len(frame)

    def _transact(self, cmd, addr, count, words, what, any_status=False, posted=None):
        """Send one frame until a valid response arrives; return it or raise LinkError. A
        `posted` frame (post_write) has been sent once already: its answer may be kept."""
        if posted is None:
            seq, frame = self._next_frame(cmd, addr, count, words)
            kept = None
        else:
            seq, frame = posted.seq, posted.frame
            kept = self._owed.pop(seq)
        expect_words = count if cmd == "read" else 0
        problem = None
        # bytes of an answer owed to a posted frame are that frame's, not extra bytes of this
        self._owed_bytes = 0
        received_before = self.rx_bytes - (kept[1] if kept else 0)
        for attempt in range(self.retries + 1):
            if attempt:
                self.resent_frames += 1
                self.resent_bytes += len(frame)
            if attempt or posted is None:
                self._send(frame)
            if kept:
                (response, _), problem, kept = kept, None, None
            else:
                response, problem = self._await_response(seq, expect_words)
            if response is None and posted is not None:
                # never sent again: its answer may be lost after it ran, and the writes sent
                # since mean the device would not know it for a duplicate
                raise LinkError(f"{what} (posted) got no valid answer ({problem}); the "
                                "command may have run", "no_response", seq)
            if response is None:
                continue
            if response.status in RETRYABLE:
                problem = f"device answered {response.status}"
                continue
            # one answer per frame: the accepted one, or for a resent write answered
            # duplicate, the ok answer its executed transmission got (received before it)
            one = response.payload if response.status != "duplicate" or not attempt else \
                seal(bytes([spec.LINK_STATUS["ok"], seq]))
            self.resent_answer_bytes += (self.rx_bytes - received_before - self._owed_bytes
                                         - len(slip_encode(one)))
            if cmd == "read":
                # An executed read makes the device forget its last write seq (docs/protocol.md).
                self._device_synced = True
            if any_status or response.status == "ok":
                return response
            if response.status == "duplicate" and cmd == "write":
                if attempt:
                    return response         # our earlier attempt was executed; its answer was lost
                raise LinkError(f"{what} failed: the device called the first transmission of "
                                f"seq {seq} a duplicate (is another host using the link?)",
                                response.status, seq)
            where = f" at 0x{response.addr:06x}" if response.addr is not None and \
                response.status not in ("bad_crc", "bad_length", "unknown_command") else ""
            written = f"; words before 0x{response.addr:06x} were written" \
                if where and cmd == "write" else ""
            raise LinkError(f"{what} failed: {response.status}{where} (seq {seq}){written}",
                            response.status, seq, response.addr if where else None)
        raise LinkError(f"{what} failed: no valid response to seq {seq} after "
                        f"{self.retries + 1} attempts (last: {problem})", "no_response", seq)

    def _drop_input(self):
        """Discard what waits in the port (a late answer, noise), counting it in rx_bytes."""
        waiting = getattr(self.port, "in_waiting", 0)
        while waiting:
            dropped = self.port.read(waiting)
            if not dropped:
                break
            self.rx_bytes += len(dropped)
            if self._owed:
                for payload in self._decoder.feed(dropped):
                    self._keep_if_owed(payload)
            waiting = getattr(self.port, "in_waiting", 0)
        if not self._owed:
            # (while an answer is owed, bytes arriving now may be it: they stay to be read)
            self.port.reset_input_buffer()

    def _keep_if_owed(self, payload, response=None):
        """Keep the answer to a posted frame that arrived while the host waited for another;
        True if it was one."""
        if response is None:
            try:
                response = decode_response(payload)
            except FrameError:
                return False
        if response.seq not in self._owed or self._owed[response.seq] is not None:
            return False
        size = len(slip_encode(payload))
        self._owed[response.seq] = (response, size)
        self._owed_bytes += size
        self.kept_answer_bytes += size
        return True

    def _await_response(self, seq, expect_words):
        """Read until the response to `seq` arrives. Returns (Response, None) or
        (None, why) on timeout (measured on self.clock) or a garbled frame. Well-formed
        responses to other sequence numbers (late answers to earlier frames, answers to line
        noise) are skipped."""
        if hasattr(self.clock, "restart"):
            self.clock.restart()                      # a new wait (SimulationClock's stall)
        deadline = self.clock() + self.timeout
        while self.clock() < deadline:
            chunk = self.port.read(1)
            if not chunk:
                continue
            waiting = getattr(self.port, "in_waiting", 0)
            if waiting:
                chunk += self.port.read(waiting)
            self.rx_bytes += len(chunk)
            result = None
            for payload in self._decoder.feed(chunk):
                if result is not None:
                    # after this frame's answer: a posted frame's, if it came in the same read
                    self._keep_if_owed(payload)
                    continue
                try:
                    response = decode_response(payload)
                except FrameError as error:
                    result = None, f"garbled response ({error})"
                    continue
                if response.seq != seq:
                    self._keep_if_owed(payload, response)
                elif response.status == "ok" and len(response.words) != expect_words:
                    result = None, (f"ok response with {len(response.words)} words; "
                                    f"expected {expect_words}")
                else:
                    result = response, None
            if result is not None:
                return result
        return None, f"no response within {self.timeout:.3g} s"
