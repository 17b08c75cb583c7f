"""The link bridge: host request frames in, bus transactions, one response frame out.

The frame format is docs/protocol.md; the host side is ``ember.protocol`` (whose constants this
module imports, so both sides share one definition). The bridge works frame by frame:

1. RECEIVE: unescape SLIP bytes from ``rx``; keep the header in registers and the data words
   in one frame buffer (``LINK_MAX_WORDS`` bus words); run the CRC over every byte but the last
   two, which are held back in a two-byte delay line since any byte may turn out to be the
   CRC when END arrives.
2. CHECK (at END): length, CRC, command and the duplicate rule, in that order. A frame that
   fails touches nothing on the bus.
3. EXECUTE: one bus transaction per word, the address incrementing; a READ stores each word in
   the (now unused) frame buffer. The first ``err`` stops it.
4. RESPOND: status, seq, then the failing address (errors) or the read words (READ ok), CRC,
   SLIP-escaped on ``tx``, honouring back-pressure.

``rx`` is not ready outside RECEIVE: bytes arriving then are the sender's problem (a UART
receiver in front drops them and flags overrun; the host waits for each response anyway).

A WRITE that starts a train or infer command (the engine acknowledges its word with ``defer``)
is answered when the command ends, not at once: the bridge keeps the frame's seq (the word is
CONTROL, the only register that defers), goes back to RECEIVE and answers other frames
meanwhile (STATUS, an abort). When the engine reports the end (``cmd_done``), the owed answer
goes out as soon as no frame is being received: ``ok``, or the error ``aborted``/``watchdog``
at CONTROL's address. A retransmission of the owed frame (a WRITE with its seq) is dropped: its
answer is coming.
"""

from amaranth import *
from amaranth.lib import stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from ember import protocol, spec

from .bus import BusSignature


def crc16_update(crc, byte):
    """CRC-16/CCITT-FALSE after one more byte, as a combinational Amaranth expression.

    Eight unrolled steps of the bit-serial recurrence of ``ember.protocol.crc16`` (MSB first):
    a few dozen XORs, no table.
    """
    for i in reversed(range(8)):
        feedback = crc[15] ^ byte[i]
        crc = Cat(C(0, 1), crc[:15]) ^ Mux(feedback, protocol.CRC_POLY, 0)
    return crc[:16]


# What follows seq in a response.
# (an address tail is the failing word's, 0 for a frame error, or CONTROL's for a command's
# owed answer: chosen as the bytes go out, so the address register needs no load of 0 or of
# CONTROL)
_TAIL_NONE, _TAIL_ADDR, _TAIL_DATA, _TAIL_ZERO, _TAIL_CONTROL = range(5)
_CONTROL_ADDR = spec.ADDRESS_MAP["regs"][0] + spec.REGISTERS["control"][0]
# Which part of the response LOAD picks next.
_FIELD_STATUS, _FIELD_SEQ, _FIELD_TAIL, _FIELD_CRC_LO, _FIELD_CRC_HI, _FIELD_DONE = range(6)


class LinkBridge(wiring.Component):
    """Bus master driven by host frames (docs/protocol.md).

    Ports:
      rx:       bytes from the host (stream); ready only while a frame is being received.
      tx:       bytes to the host (stream); every frame is answered by one response frame,
                which waits for ``ready`` byte by byte.
      bus:      the engine bus (ember_hw.bus.BusSignature), mastered one word at a time; the
                strobe drops for at least one cycle between words. ``addr`` and ``w_data``
                are meaningful only under a strobe (they are not zeroed in between). ``addr``
                is a register; ``w_data`` is the frame buffer's read data, a block RAM's
                output register, which holds the word through BUS (its address does not
                change there): a copy in flip-flops would cost a logic cell a bit on the
                iCE40.
      rx_bytes: one-cycle strobe per byte taken from ``rx`` (END and ESC included).
      tx_bytes: one-cycle strobe per byte sent on ``tx``.
      busy:     high from the first byte of a frame until its response has been sent (for a
                command's frame, until the command's answer has been sent).

    Timing: one cycle per received byte; at END one cycle of checks; per word two cycles
    plus the slave's latency; per response byte two cycles (three if escaped) plus waits for
    ``tx.ready``.

    Duplicate rule: the bridge remembers the seq of the last WRITE it completed. A WRITE with
    that seq is answered ``duplicate`` and not executed. Executing a READ, or a WRITE that
    ends in a bus error, forgets it (so a retried failing write is executed, and fails, again).
    Frames that fail the checks leave it as it was.
    """

    rx: In(stream.Signature(8))
    tx: Out(stream.Signature(8))
    bus: Out(BusSignature())
    rx_bytes: Out(1)
    tx_bytes: Out(1)
    busy: Out(1)

    def elaborate(self, platform):
        m = Module()
        f = _Frame(m)
        m.d.comb += self.bus.owing.eq(f.owed)
        with m.If(f.owed & self.bus.cmd_done):
            m.d.sync += f.owed_done.eq(1)

        # One CRC unit over recent[:8]: the receiver feeds it request bytes leaving the delay
        # line, SEND the response bytes (out_byte) as they go out.
        m.d.comb += f.crc_next.eq(crc16_update(f.crc, f.recent[:8]))

        m.d.comb += [
            # Address and write data need only be valid under a strobe (ember_hw.bus); driving
            # them all the time saves a gate per bit.
            self.bus.addr.eq(f.addr),
            self.bus.w_data.eq(f.buffer_r.data),
            self.rx_bytes.eq(self.rx.valid & self.rx.ready),
            self.tx_bytes.eq(self.tx.valid & self.tx.ready),
        ]
        self._decode_slip(m, f)
        # the owed answer goes out between frames, never into the middle of one
        m.d.comb += f.answer_owed.eq(f.owed & f.owed_done & (f.held == 0) & ~f.escaped)

        with m.FSM() as fsm:
            self._receive(m, f)
            self._check(m, f)
            self._execute(m, f)
            self._respond(m, f)

        m.d.comb += self.busy.eq(~fsm.ongoing("RECEIVE") | (f.held != 0) | f.owed)
        return m

    def _decode_slip(self, m, f):
        """SLIP decoding of the byte on rx (acted on only in RECEIVE, where rx.ready is high):
        f.frame_end at END, else f.byte_in with the unescaped f.byte (none for an ESC)."""
        with m.If(self.rx.valid & self.rx.ready):
            with m.If(self.rx.payload == protocol.END):
                m.d.comb += f.frame_end.eq(1)
            with m.Elif(f.escaped):
                m.d.comb += [
                    f.byte_in.eq(1),
                    f.byte.eq(Mux(self.rx.payload == protocol.ESC_END, protocol.END,
                              Mux(self.rx.payload == protocol.ESC_ESC, protocol.ESC,
                                  self.rx.payload))),
                ]
            with m.Elif(self.rx.payload != protocol.ESC):
                m.d.comb += [f.byte_in.eq(1), f.byte.eq(self.rx.payload)]

    def _receive(self, m, f):
        """RECEIVE: header into registers, data into the frame buffer, the CRC over all but the
        last two bytes (the delay line); or, between frames, the owed answer of a command."""
        status_code = spec.LINK_STATUS
        header_bytes = protocol.REQUEST_HEADER_BYTES
        word_bytes = protocol.WORD_BYTES
        with m.State("RECEIVE"):
            m.d.comb += self.rx.ready.eq(~f.answer_owed)
            with m.If(f.answer_owed):
                owed_status = self.bus.cmd_status
                m.d.sync += [f.status.eq(owed_status), f.seq.eq(f.owed_seq),
                             f.tail.eq(Mux(owed_status == status_code["ok"], _TAIL_NONE,
                                           _TAIL_CONTROL)),
                             f.owed.eq(0), f.owed_done.eq(0),
                             f.last_write_seq.eq(f.owed_seq),
                             f.last_write_valid.eq(owed_status == status_code["ok"])]
                m.next = "OPEN"
            with m.If(f.frame_end):
                with m.If(f.held == 0):
                    m.d.sync += f.restart_receive()     # empty frame: nothing to answer
                with m.Else():
                    m.next = "CHECK"
            with m.If(self.rx.valid & self.rx.ready & (self.rx.payload != protocol.END)):
                with m.If(f.escaped):
                    m.d.sync += f.escaped.eq(0)
                    with m.If((self.rx.payload != protocol.ESC_END) &
                              (self.rx.payload != protocol.ESC_ESC)):
                        m.d.sync += f.bad_escape.eq(1)
                with m.Elif(self.rx.payload == protocol.ESC):
                    m.d.sync += f.escaped.eq(1)
            with m.If(f.byte_in):
                m.d.sync += f.recent.eq(Cat(f.recent[8:], f.byte))
                with m.If(f.held == 1):
                    # Taken straight away, so even a frame too short to check echoes it.
                    m.d.sync += f.seq.eq(f.byte)
                with m.If(f.held != 2):
                    m.d.sync += f.held.eq(f.held + 1)
                with m.Else():
                    # The byte leaving the delay line is not part of the CRC field.
                    body = f.recent[:8]
                    m.d.sync += f.crc.eq(f.crc_next)
                    with m.If(f.header_index != header_bytes):
                        m.d.sync += f.header_index.eq(f.header_index + 1)
                        self._header_byte(m, f, body)
                    with m.Elif(f.word_index == f.max_words):
                        m.d.sync += f.too_long.eq(1)      # discard until END
                    with m.Else():
                        m.d.comb += [
                            f.buffer_w.addr.eq(f.word_index),
                            f.buffer_w.data.eq(body.replicate(word_bytes)),
                            f.buffer_w.en.eq(Const(1, word_bytes) << f.lane),
                        ]
                        with m.If(f.lane == word_bytes - 1):
                            m.d.sync += [f.lane.eq(0), f.word_index.eq(f.word_index + 1)]
                        with m.Else():
                            m.d.sync += f.lane.eq(f.lane + 1)

    @staticmethod
    def _header_byte(m, f, body):
        """Header byte number f.header_index (`body`) into the command, address and count."""
        read_cmd, write_cmd = spec.LINK_COMMANDS["read"], spec.LINK_COMMANDS["write"]
        with m.Switch(f.header_index):
            with m.Case(0):
                m.d.sync += [f.is_read.eq(body == read_cmd),
                             f.is_write.eq(body == write_cmd)]
            for k in range(protocol.ADDR_BYTES):
                with m.Case(2 + k):
                    m.d.sync += f.addr.word_select(k, 8).eq(body)
            for k in range(protocol.COUNT_BYTES):
                kept = min(8, max(0, len(f.count) - 8 * k))
                with m.Case(2 + protocol.ADDR_BYTES + k):
                    if kept:
                        m.d.sync += f.count[8 * k:][:kept].eq(body)
                    if kept < 8:
                        m.d.sync += f.count_over.eq(body[kept:] != 0)

    def _check(self, m, f):
        """CHECK (at END): length, CRC, command and the duplicate rule, in that order."""
        status_code = spec.LINK_STATUS
        with m.State("CHECK"):
            short = f.header_index != protocol.REQUEST_HEADER_BYTES
            count_ok = ~f.count_over & (f.count != 0) & (f.count <= f.max_words)
            data_ok = (f.lane == 0) & Mux(f.is_write, f.word_index == f.count,
                                          f.word_index == 0)
            m.d.sync += [f.word_index.eq(0), f.lane.eq(0)]
            m.next = "OPEN"
            with m.If(f.too_long | short | (f.known_cmd & ~(count_ok & data_ok))):
                m.d.sync += f.respond_error(status_code["bad_length"])
            with m.Elif(f.bad_escape | (f.crc != f.recent)):
                m.d.sync += f.respond_error(status_code["bad_crc"])
            with m.Elif(~f.known_cmd):
                m.d.sync += f.respond_error(status_code["unknown_command"])
            with m.Elif(f.is_write & f.owed & (f.seq == f.owed_seq)):
                # the owed frame again (the host timed out): its answer is coming
                m.d.sync += f.restart_receive()
                m.next = "RECEIVE"
            with m.Elif(f.is_write & f.last_write_valid & (f.seq == f.last_write_seq)):
                m.d.sync += [f.status.eq(status_code["duplicate"]), f.tail.eq(_TAIL_NONE)]
            with m.Else():
                with m.If(~f.is_write):
                    m.d.sync += f.last_write_valid.eq(0)
                m.next = "FETCH"

    def _execute(self, m, f):
        """FETCH, BUS: one bus transaction per word, the address incrementing; a READ stores
        each word in the frame buffer; the first `err` stops it; a `defer` owes the answer."""
        status_code = spec.LINK_STATUS
        word_bytes = protocol.WORD_BYTES
        bus = self.bus
        # the strobes are registers, raised for BUS and dropped as it ends: each slave's
        # decision starts from a flip-flop, not from the state's decoding
        w_stb, r_stb = Signal(name="w_stb"), Signal(name="r_stb")
        m.d.comb += [bus.w_stb.eq(w_stb), bus.r_stb.eq(r_stb)]
        with m.State("FETCH"):
            # Strobes low for a cycle while the buffer's read port reads word_index's word,
            # which it then holds for the bus through BUS.
            m.d.sync += [w_stb.eq(f.is_write), r_stb.eq(~f.is_write)]
            m.next = "BUS"

        with m.State("BUS"):
            with m.If(bus.err | bus.ack):
                m.d.sync += [w_stb.eq(0), r_stb.eq(0)]
            with m.If(bus.err):
                # addr stays on the failing word; words before it stay written (a command
                # one of them started runs on, unanswered).
                m.d.sync += [f.status.eq(bus.r_data[:spec.LINK_STATUS_BITS]),
                             f.tail.eq(_TAIL_ADDR)]
                with m.If(f.deferred):
                    m.d.sync += f.owed.eq(0)
                with m.If(f.is_write):
                    m.d.sync += f.last_write_valid.eq(0)
                m.next = "OPEN"
            with m.Elif(bus.ack):
                with m.If(bus.defer):
                    m.d.sync += [f.owed.eq(1), f.owed_done.eq(0), f.owed_seq.eq(f.seq),
                                 f.deferred.eq(1)]
                with m.If(~f.is_write):
                    m.d.comb += [
                        f.buffer_w.addr.eq(f.word_index),
                        f.buffer_w.data.eq(bus.r_data),
                        f.buffer_w.en.eq((1 << word_bytes) - 1),
                    ]
                m.d.sync += [f.addr.eq(f.addr + 1), f.word_index.eq(f.word_index + 1)]
                with m.If(f.last_word & (bus.defer | f.deferred)):
                    # a word of this frame started a command: answered when it ends
                    m.d.sync += f.restart_receive()
                    m.next = "RECEIVE"
                with m.Elif(f.last_word):
                    m.d.sync += [f.status.eq(status_code["ok"]),
                                 f.tail.eq(Mux(f.is_write, _TAIL_NONE, _TAIL_DATA))]
                    with m.If(f.is_write):
                        m.d.sync += [f.last_write_seq.eq(f.seq), f.last_write_valid.eq(1)]
                    m.next = "OPEN"
                with m.Else():
                    m.next = "FETCH"

    def _respond(self, m, f):
        """OPEN, LOAD, SEND, SEND_ESCAPED, CLOSE: status, seq, tail and CRC, SLIP-escaped on
        tx, byte by byte as tx takes them."""
        word_bytes = protocol.WORD_BYTES
        out_byte = f.out_byte
        with m.State("OPEN"):
            m.d.comb += [self.tx.valid.eq(1), self.tx.payload.eq(protocol.END)]
            with m.If(self.tx.ready):
                m.d.sync += [f.crc.eq(protocol.CRC_INIT), f.word_index.eq(0), f.lane.eq(0),
                             f.response_field.eq(_FIELD_STATUS)]
                m.next = "LOAD"

        with m.State("LOAD"):
            # Pick the next unescaped response byte; the CRC covers all but its own bytes.
            field_byte = Signal(8)
            with m.Switch(f.response_field):
                with m.Case(_FIELD_STATUS):
                    m.d.comb += field_byte.eq(f.status)
                    m.d.sync += f.response_field.eq(_FIELD_SEQ)
                with m.Case(_FIELD_SEQ):
                    m.d.comb += field_byte.eq(f.seq)
                    m.d.sync += f.response_field.eq(
                        Mux(f.tail == _TAIL_NONE, _FIELD_CRC_LO, _FIELD_TAIL))
                with m.Case(_FIELD_TAIL):
                    with m.If(f.tail != _TAIL_DATA):
                        m.d.comb += field_byte.eq(Mux(
                            f.tail == _TAIL_ADDR, f.addr.word_select(f.lane, 8),
                            Mux(f.tail == _TAIL_CONTROL,
                                Const(_CONTROL_ADDR, 24).word_select(f.lane, 8), 0)))
                        with m.If(f.lane == protocol.ADDR_BYTES - 1):
                            m.d.sync += [f.lane.eq(0), f.response_field.eq(_FIELD_CRC_LO)]
                        with m.Else():
                            m.d.sync += f.lane.eq(f.lane + 1)
                    with m.Else():
                        m.d.comb += field_byte.eq(f.buffer_r.data.word_select(f.lane, 8))
                        with m.If(f.lane == word_bytes - 1):
                            m.d.sync += [f.lane.eq(0), f.word_index.eq(f.word_index + 1)]
                            with m.If(f.last_word):
                                m.d.sync += f.response_field.eq(_FIELD_CRC_LO)
                        with m.Else():
                            m.d.sync += f.lane.eq(f.lane + 1)
                with m.Case(_FIELD_CRC_LO):
                    m.d.comb += field_byte.eq(f.crc[:8])
                    m.d.sync += f.response_field.eq(_FIELD_CRC_HI)
                with m.Case(_FIELD_CRC_HI):
                    m.d.comb += field_byte.eq(f.crc[8:])
                    m.d.sync += f.response_field.eq(_FIELD_DONE)
            with m.If(f.response_field == _FIELD_DONE):
                m.next = "CLOSE"
            with m.Else():
                m.d.sync += out_byte.eq(field_byte)
                m.next = "SEND"

        with m.State("SEND"):
            special = (out_byte == protocol.END) | (out_byte == protocol.ESC)
            m.d.comb += [self.tx.valid.eq(1),
                         self.tx.payload.eq(Mux(special, protocol.ESC, out_byte))]
            with m.If(self.tx.ready):
                # response_field is already the next field: the CRC covers out_byte unless
                # it is one of the CRC's own bytes.
                with m.If(f.response_field <= _FIELD_CRC_LO):
                    m.d.sync += f.crc.eq(f.crc_next)
                with m.If(special):
                    m.next = "SEND_ESCAPED"
                with m.Else():
                    m.next = "LOAD"

        with m.State("SEND_ESCAPED"):
            m.d.comb += [self.tx.valid.eq(1),
                         self.tx.payload.eq(Mux(out_byte == protocol.END, protocol.ESC_END,
                                                protocol.ESC_ESC))]
            with m.If(self.tx.ready):
                m.next = "LOAD"

        with m.State("CLOSE"):
            m.d.comb += [self.tx.valid.eq(1), self.tx.payload.eq(protocol.END)]
            with m.If(self.tx.ready):
                m.d.sync += f.restart_receive()
                m.next = "RECEIVE"


class _Frame:
    """The bridge's state: the frame buffer (WRITE data on the way in, READ data on the way
    out), the request header, the receiver's, the owed answer's and the response's registers.
    One set, shared by the FSM's phases (LinkBridge._receive ... _respond)."""

    def __init__(self, m):
        self.max_words = max_words = spec.LINK_MAX_WORDS
        word_bytes = protocol.WORD_BYTES
        header_bytes = protocol.REQUEST_HEADER_BYTES

        m.submodules.buffer = buffer = Memory(shape=unsigned(spec.BUS_DATA_BITS),
                                              depth=max_words, init=[])
        self.buffer_w = buffer.write_port(granularity=8)
        self.buffer_r = buffer.read_port()

        # Request header, captured as it arrives.
        self.is_read = Signal(name="is_read")           # cmd is READ
        self.is_write = Signal(name="is_write")         # cmd is WRITE
        self.seq = Signal(8, name="seq")
        self.addr = Signal(spec.BUS_ADDR_BITS, name="addr")  # also the word being executed
        self.count = Signal(range(max_words + 1), name="count")  # the count's low bits...
        self.count_over = Signal(name="count_over")     # ...and whether a higher bit is set

        # Receive state.
        self.escaped = Signal(name="escaped")           # the previous byte was ESC
        self.bad_escape = Signal(name="bad_escape")     # ESC then neither ESC_END nor ESC_ESC
        self.too_long = Signal(name="too_long")         # more data than LINK_MAX_WORDS words
        self.held = Signal(range(3), name="held")       # bytes in the delay line
        self.recent = Signal(16, name="recent")         # delay line: [0:8] older, [8:16] newest
        self.header_index = Signal(range(header_bytes + 1), name="header_index")
        # frame buffer word: rx, execute, tx
        self.word_index = Signal(range(max_words + 1), name="word_index")
        # the buffer's read port reads word_index's word: the bus's write data in BUS (read
        # in FETCH), the response's READ data in SEND
        m.d.comb += self.buffer_r.addr.eq(self.word_index)
        # byte within a word or address
        self.lane = Signal(range(max(word_bytes, protocol.ADDR_BYTES)), name="lane")
        self.crc = Signal(16, init=protocol.CRC_INIT, name="crc")

        self.last_write_seq = Signal(8, name="last_write_seq")
        self.last_write_valid = Signal(name="last_write_valid")

        # The owed answer of a WRITE that started a command (bus.defer): its seq; owed_done once
        # the command has ended. Only CONTROL starts commands, so the answer's address is
        # CONTROL's; the engine holds the command's status until the next command, which does
        # not start while the answer is owed (bus.owing).
        self.owed = Signal(name="owed")
        self.owed_seq = Signal(8, name="owed_seq")
        self.owed_done = Signal(name="owed_done")
        # a word of the frame being executed started a command
        self.deferred = Signal(name="deferred")

        # Response state.
        self.status = Signal(spec.LINK_STATUS_BITS, name="status")
        self.tail = Signal(range(5), name="tail")
        self.response_field = Signal(range(_FIELD_DONE + 1), name="response_field")
        # The delay line's older byte is idle while responding: it holds the unescaped byte
        # being sent, so the CRC unit always reads the same byte.
        self.out_byte = self.recent[:8]

        self.known_cmd = self.is_read | self.is_write
        self.last_word = self.word_index + 1 == self.count
        self.crc_next = Signal(16, name="crc_next")

        # the SLIP decoder's outputs (LinkBridge._decode_slip)
        self.frame_end = Signal(name="frame_end")
        self.byte_in = Signal(name="byte_in")
        self.byte = Signal(8, name="byte")
        self.answer_owed = Signal(name="answer_owed")

    def restart_receive(self):
        return [
            self.escaped.eq(0), self.bad_escape.eq(0), self.too_long.eq(0), self.held.eq(0),
            self.header_index.eq(0), self.word_index.eq(0), self.lane.eq(0),
            self.crc.eq(protocol.CRC_INIT), self.seq.eq(0), self.deferred.eq(0),
        ]

    def respond_error(self, code):
        # Frame errors report address 0: the received one may be garbage.
        return [self.status.eq(code), self.tail.eq(_TAIL_ZERO)]
