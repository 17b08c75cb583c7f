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
CONTROL, the only register that defers), goes back to RECEIVE and answers other frames meanwhile (STATUS, an abort).
When the engine reports the end (``cmd_done``), the owed answer goes out as soon as no frame
is being received: ``ok``, or the error ``aborted``/``watchdog`` at CONTROL's address. A
retransmission of the owed frame (a WRITE with its seq) is dropped: its answer is coming.
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
                are meaningful only under a strobe (they are not zeroed in between).
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
        max_words = spec.LINK_MAX_WORDS
        word_bytes = protocol.WORD_BYTES
        header_bytes = protocol.REQUEST_HEADER_BYTES
        status_code = spec.LINK_STATUS
        read_cmd, write_cmd = spec.LINK_COMMANDS["read"], spec.LINK_COMMANDS["write"]

        # The frame buffer: WRITE data on the way in, READ data on the way out.
        m.submodules.buffer = buffer = Memory(shape=unsigned(spec.BUS_DATA_BITS),
                                              depth=max_words, init=[])
        buffer_w = buffer.write_port(granularity=8)
        buffer_r = buffer.read_port()

        # Request header, captured as it arrives.
        is_read = Signal()                      # cmd is READ
        is_write = Signal()                     # cmd is WRITE
        seq = Signal(8)
        addr = Signal(spec.BUS_ADDR_BITS)       # also the current word while executing
        count = Signal(range(max_words + 1))    # the count field's low bits...
        count_over = Signal()                   # ...and whether any higher bit is set

        # Receive state.
        escaped = Signal()                      # the previous byte was ESC
        bad_escape = Signal()                   # ESC followed by neither ESC_END nor ESC_ESC
        too_long = Signal()                     # more data than LINK_MAX_WORDS words
        held = Signal(range(3))                 # bytes in the delay line
        recent = Signal(16)                     # delay line: [0:8] older, [8:16] newest byte
        header_index = Signal(range(header_bytes + 1))
        word_index = Signal(range(max_words + 1))   # frame buffer word: rx, execute, tx
        lane = Signal(range(max(word_bytes, protocol.ADDR_BYTES)))  # byte within a word/addr
        crc = Signal(16, init=protocol.CRC_INIT)

        last_write_seq = Signal(8)
        last_write_valid = Signal()

        # The owed answer of a WRITE that started a command (bus.defer): its seq; owed_done once
        # the command has ended. Only CONTROL starts commands, so the answer's address is
        # CONTROL's; the engine holds the command's status until the next command, which does
        # not start while the answer is owed (bus.owing).
        owed = Signal()
        owed_seq = Signal(8)
        owed_done = Signal()
        owed_status = self.bus.cmd_status
        deferred = Signal()             # a word of the frame being executed started a command
        m.d.comb += self.bus.owing.eq(owed)
        with m.If(owed & self.bus.cmd_done):
            m.d.sync += owed_done.eq(1)

        # Response state.
        status = Signal(8)
        tail = Signal(range(5))
        response_field = Signal(range(_FIELD_DONE + 1))
        # The delay line's older byte is idle while responding: it holds the unescaped byte
        # being sent, so the CRC unit always reads the same byte.
        out_byte = recent[:8]

        known_cmd = is_read | is_write
        last_word = word_index + 1 == count

        # One CRC unit over recent[:8]: the receiver feeds it request bytes leaving the delay
        # line, SEND the response bytes (out_byte) as they go out.
        crc_next = Signal(16)
        m.d.comb += crc_next.eq(crc16_update(crc, recent[:8]))

        m.d.comb += [
            buffer_r.addr.eq(word_index),
            # Address and write data need only be valid under a strobe (ember_hw.bus); driving
            # them all the time saves a gate per bit.
            self.bus.addr.eq(addr),
            self.bus.w_data.eq(buffer_r.data),
            self.rx_bytes.eq(self.rx.valid & self.rx.ready),
            self.tx_bytes.eq(self.tx.valid & self.tx.ready),
        ]

        # SLIP decoding of the byte on rx (acted on only in RECEIVE, where rx.ready is high).
        frame_end = Signal()
        byte_in = Signal()
        byte = Signal(8)
        with m.If(self.rx.valid & self.rx.ready):
            with m.If(self.rx.payload == protocol.END):
                m.d.comb += frame_end.eq(1)
            with m.Elif(escaped):
                m.d.comb += [
                    byte_in.eq(1),
                    byte.eq(Mux(self.rx.payload == protocol.ESC_END, protocol.END,
                            Mux(self.rx.payload == protocol.ESC_ESC, protocol.ESC,
                                self.rx.payload))),
                ]
            with m.Elif(self.rx.payload != protocol.ESC):
                m.d.comb += [byte_in.eq(1), byte.eq(self.rx.payload)]

        restart_receive = [
            escaped.eq(0), bad_escape.eq(0), too_long.eq(0), held.eq(0), header_index.eq(0),
            word_index.eq(0), lane.eq(0), crc.eq(protocol.CRC_INIT), seq.eq(0),
            deferred.eq(0),
        ]

        def respond_error(code):
            # Frame errors report address 0: the received one may be garbage.
            return [status.eq(code), tail.eq(_TAIL_ZERO)]

        # the owed answer goes out between frames, never into the middle of one
        answer_owed = Signal()
        m.d.comb += answer_owed.eq(owed & owed_done & (held == 0) & ~escaped)

        with m.FSM() as fsm:
            with m.State("RECEIVE"):
                m.d.comb += self.rx.ready.eq(~answer_owed)
                with m.If(answer_owed):
                    m.d.sync += [status.eq(owed_status), seq.eq(owed_seq),
                                 tail.eq(Mux(owed_status == status_code["ok"], _TAIL_NONE,
                                             _TAIL_CONTROL)),
                                 owed.eq(0), owed_done.eq(0),
                                 last_write_seq.eq(owed_seq),
                                 last_write_valid.eq(owed_status == status_code["ok"])]
                    m.next = "OPEN"
                with m.If(frame_end):
                    with m.If(held == 0):
                        m.d.sync += restart_receive     # empty frame: nothing to answer
                    with m.Else():
                        m.next = "CHECK"
                with m.If(self.rx.valid & self.rx.ready & (self.rx.payload != protocol.END)):
                    with m.If(escaped):
                        m.d.sync += escaped.eq(0)
                        with m.If((self.rx.payload != protocol.ESC_END) &
                                  (self.rx.payload != protocol.ESC_ESC)):
                            m.d.sync += bad_escape.eq(1)
                    with m.Elif(self.rx.payload == protocol.ESC):
                        m.d.sync += escaped.eq(1)
                with m.If(byte_in):
                    m.d.sync += recent.eq(Cat(recent[8:], byte))
                    with m.If(held == 1):
                        # Taken straight away, so even a frame too short to check echoes it.
                        m.d.sync += seq.eq(byte)
                    with m.If(held != 2):
                        m.d.sync += held.eq(held + 1)
                    with m.Else():
                        # The byte leaving the delay line is not part of the CRC field.
                        body = recent[:8]
                        m.d.sync += crc.eq(crc_next)
                        with m.If(header_index != header_bytes):
                            m.d.sync += header_index.eq(header_index + 1)
                            with m.Switch(header_index):
                                with m.Case(0):
                                    m.d.sync += [is_read.eq(body == read_cmd),
                                                 is_write.eq(body == write_cmd)]
                                for k in range(protocol.ADDR_BYTES):
                                    with m.Case(2 + k):
                                        m.d.sync += addr.word_select(k, 8).eq(body)
                                for k in range(protocol.COUNT_BYTES):
                                    kept = min(8, max(0, len(count) - 8 * k))
                                    with m.Case(2 + protocol.ADDR_BYTES + k):
                                        if kept:
                                            m.d.sync += count[8 * k:][:kept].eq(body)
                                        if kept < 8:
                                            m.d.sync += count_over.eq(
                                                body[kept:] != 0)
                        with m.Elif(word_index == max_words):
                            m.d.sync += too_long.eq(1)      # discard until END
                        with m.Else():
                            m.d.comb += [
                                buffer_w.addr.eq(word_index),
                                buffer_w.data.eq(body.replicate(word_bytes)),
                                buffer_w.en.eq(Const(1, word_bytes) << lane),
                            ]
                            with m.If(lane == word_bytes - 1):
                                m.d.sync += [lane.eq(0), word_index.eq(word_index + 1)]
                            with m.Else():
                                m.d.sync += lane.eq(lane + 1)

            with m.State("CHECK"):
                short = header_index != header_bytes
                count_ok = ~count_over & (count != 0) & (count <= max_words)
                data_ok = (lane == 0) & Mux(is_write, word_index == count, word_index == 0)
                m.d.sync += [word_index.eq(0), lane.eq(0)]
                m.next = "OPEN"
                with m.If(too_long | short | (known_cmd & ~(count_ok & data_ok))):
                    m.d.sync += respond_error(status_code["bad_length"])
                with m.Elif(bad_escape | (crc != recent)):
                    m.d.sync += respond_error(status_code["bad_crc"])
                with m.Elif(~known_cmd):
                    m.d.sync += respond_error(status_code["unknown_command"])
                with m.Elif(is_write & owed & (seq == owed_seq)):
                    # the owed frame again (the host timed out): its answer is coming
                    m.d.sync += restart_receive
                    m.next = "RECEIVE"
                with m.Elif(is_write & last_write_valid & (seq == last_write_seq)):
                    m.d.sync += [status.eq(status_code["duplicate"]), tail.eq(_TAIL_NONE)]
                with m.Else():
                    with m.If(~is_write):
                        m.d.sync += last_write_valid.eq(0)
                    m.next = "FETCH"

            with m.State("FETCH"):
                # Strobes low for a cycle; the buffer's read port presents word_index's word.
                m.next = "BUS"

            with m.State("BUS"):
                m.d.comb += [
                    self.bus.w_stb.eq(is_write),
                    self.bus.r_stb.eq(~is_write),
                ]
                with m.If(self.bus.err):
                    # addr stays on the failing word; words before it stay written (a command
                    # one of them started runs on, unanswered).
                    m.d.sync += [status.eq(self.bus.r_data[:8]), tail.eq(_TAIL_ADDR)]
                    with m.If(deferred):
                        m.d.sync += owed.eq(0)
                    with m.If(is_write):
                        m.d.sync += last_write_valid.eq(0)
                    m.next = "OPEN"
                with m.Elif(self.bus.ack):
                    with m.If(self.bus.defer):
                        m.d.sync += [owed.eq(1), owed_done.eq(0), owed_seq.eq(seq),
                                     deferred.eq(1)]
                    with m.If(~is_write):
                        m.d.comb += [
                            buffer_w.addr.eq(word_index),
                            buffer_w.data.eq(self.bus.r_data),
                            buffer_w.en.eq((1 << word_bytes) - 1),
                        ]
                    m.d.sync += [addr.eq(addr + 1), word_index.eq(word_index + 1)]
                    with m.If(last_word & (self.bus.defer | deferred)):
                        # a word of this frame started a command: answered when it ends
                        m.d.sync += restart_receive
                        m.next = "RECEIVE"
                    with m.Elif(last_word):
                        m.d.sync += [status.eq(status_code["ok"]),
                                     tail.eq(Mux(is_write, _TAIL_NONE, _TAIL_DATA))]
                        with m.If(is_write):
                            m.d.sync += [last_write_seq.eq(seq), last_write_valid.eq(1)]
                        m.next = "OPEN"
                    with m.Else():
                        m.next = "FETCH"

            with m.State("OPEN"):
                m.d.comb += [self.tx.valid.eq(1), self.tx.payload.eq(protocol.END)]
                with m.If(self.tx.ready):
                    m.d.sync += [crc.eq(protocol.CRC_INIT), word_index.eq(0), lane.eq(0),
                                 response_field.eq(_FIELD_STATUS)]
                    m.next = "LOAD"

            with m.State("LOAD"):
                # Pick the next unescaped response byte; the CRC covers all but its own bytes.
                field_byte = Signal(8)
                with m.Switch(response_field):
                    with m.Case(_FIELD_STATUS):
                        m.d.comb += field_byte.eq(status)
                        m.d.sync += response_field.eq(_FIELD_SEQ)
                    with m.Case(_FIELD_SEQ):
                        m.d.comb += field_byte.eq(seq)
                        m.d.sync += response_field.eq(
                            Mux(tail == _TAIL_NONE, _FIELD_CRC_LO, _FIELD_TAIL))
                    with m.Case(_FIELD_TAIL):
                        with m.If(tail != _TAIL_DATA):
                            m.d.comb += field_byte.eq(Mux(
                                tail == _TAIL_ADDR, addr.word_select(lane, 8),
                                Mux(tail == _TAIL_CONTROL,
                                    Const(_CONTROL_ADDR, 24).word_select(lane, 8), 0)))
                            with m.If(lane == protocol.ADDR_BYTES - 1):
                                m.d.sync += [lane.eq(0), response_field.eq(_FIELD_CRC_LO)]
                            with m.Else():
                                m.d.sync += lane.eq(lane + 1)
                        with m.Else():
                            m.d.comb += field_byte.eq(buffer_r.data.word_select(lane, 8))
                            with m.If(lane == word_bytes - 1):
                                m.d.sync += [lane.eq(0), word_index.eq(word_index + 1)]
                                with m.If(last_word):
                                    m.d.sync += response_field.eq(_FIELD_CRC_LO)
                            with m.Else():
                                m.d.sync += lane.eq(lane + 1)
                    with m.Case(_FIELD_CRC_LO):
                        m.d.comb += field_byte.eq(crc[:8])
                        m.d.sync += response_field.eq(_FIELD_CRC_HI)
                    with m.Case(_FIELD_CRC_HI):
                        m.d.comb += field_byte.eq(crc[8:])
                        m.d.sync += response_field.eq(_FIELD_DONE)
                with m.If(response_field == _FIELD_DONE):
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
                    with m.If(response_field <= _FIELD_CRC_LO):
                        m.d.sync += crc.eq(crc_next)
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
                    m.d.sync += restart_receive
                    m.next = "RECEIVE"

        m.d.comb += self.busy.eq(~fsm.ongoing("RECEIVE") | (held != 0) | owed)
        return m
