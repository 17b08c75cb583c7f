"""cocotb side of the simulated board: serves the engine's link on a loopback TCP socket.

The host opens `socket://127.0.0.1:PORT` with pyserial (exactly as it opens a board's serial
port) and talks the link protocol; this bench moves the bytes between the socket and the
design and otherwise lets the simulation run in large steps. It ends when the host closes the
connection. Two designs, one serving loop (`_serve`) with an adapter for each:

``serve``: the SimBoard of ember_sim.board_top (`_BurstLink`): bytes go through its burst
ports, up to BURST_BYTES per wake, and its `busy` and `idle` outputs tell when the engine is
done.

``serve_pins``: a real board top (ember_sim.board_sim; selected by name) driven through its
pins only (`_PinLink`): the clock pin runs inside the design, the bench sends the host's
bytes as 8N1 bits on the UART rx pin and reads the tx pin's bits back into bytes (one wake per
bit), and watches the LED pins. With no status port, it tells a link at rest by counting
frames: every request frame is answered by exactly one response frame (ember.protocol), so
once both directions have carried as many frames and the wires are quiet, nothing can happen
until the host sends.

Case (ember_sim.rtl.load_case): {"port_file": path, "port": 0 or a fixed port,
"accept_timeout_s": seconds to wait for the host, "quiet_cycles": idle cycles after which the
link is surely idle and the bench blocks on the socket instead of simulating, "progress_file":
where the simulated time goes for the host (_Progress), optional}; ``serve_pins``
also takes the pins and timing of ember_sim.board_sim.BoardTopSim.bench_case() and writes
back {"cycles", "leds": {role: {"pin", "active_low", "start", "end", "seen", "changes"}},
"line_errors"}: each LED pin's level after the start-up, at the end, every level it had and
how often it changed; and the bytes whose start, stop or data bits were wrong or not 0/1.
"""

import os
import select
import socket

import cocotb
from cocotb.queue import Queue
from cocotb.simtime import get_sim_time
from cocotb.triggers import Event, FallingEdge, First, RisingEdge, Timer

from ember import spec
from ember.protocol import SlipDecoder
from ember_sim import clock, rtl
from ember_sim.board_top import BURST_BYTES, collected_bytes

MIN_STEP, MAX_STEP = 64, 4096
#: Spans the engine runs a command without a wake. A wake updates the progress file and
#: passes on what the host sent meanwhile. The first span of a command is BUSY_STEP cycles;
#: each span in which the host sent nothing doubles the next, up to MAX_BUSY_STEP, and one
#: in which it sent something sets it back to BUSY_STEP. So a host that talks to the engine
#: during a command (STATUS reads, an abort) is heard within BUSY_STEP cycles, and one that
#: waits for the answer costs few wakes (each costs about as much as a few hundred cycles).
BUSY_STEP, MAX_BUSY_STEP = 1 << 11, 1 << 15


async def cycles(dut, count):
    """Let `count` cycles pass with one wake (called at a falling edge of `clk`, returns at
    the `count`-th falling edge after it)."""
    # end a quarter period before the falling edge, then meet that edge: an await that fired
    # in the very time step of an edge could return without a rising edge in between
    period_ps = clock.CLOCK_PERIOD_NS * 1000
    await Timer(count * period_ps - period_ps // 4, unit="ps")
    await FallingEdge(dut.clk)


async def load_burst(dut, data):
    """Hand up to BURST_BYTES bytes to the SimBoard's `host_w_burst` port (at a falling edge,
    the previous burst taken); returns at the next falling edge."""
    dut.host_w_burst.value = int.from_bytes(data, "little")
    dut.host_w_count.value = len(data)
    dut.host_w_load.value = 1
    await FallingEdge(dut.clk)
    dut.host_w_load.value = 0


async def drain(dut):
    """Collect every byte the engine has sent so far, up to BURST_BYTES per wake (called at a
    falling edge); returns them and the cycles it took."""
    out = bytearray()
    spent = 0
    count, level = int(dut.host_r_count.value), int(dut.host_r_level.value)
    while count or level:
        if level and count < BURST_BYTES:
            # the collector takes one byte per cycle from the FIFO
            step = min(level, BURST_BYTES - count)
            await cycles(dut, step)
            spent += step
        else:
            out += collected_bytes(int(dut.host_r_burst.value), count)
            dut.host_r_take.value = 1
            await FallingEdge(dut.clk)
            dut.host_r_take.value = 0
            spent += 1
        count, level = int(dut.host_r_count.value), int(dut.host_r_level.value)
    return bytes(out), spent


class _Progress:
    """The simulation's progress for the host: the simulated time in picoseconds, as 8
    little-endian bytes at the start of the file `path` (the case's "progress_file"), which
    ember.device.SimulationClock reads. The host measures its link timeouts on it, so a slow
    simulator makes the host wait longer, never send a frame again. No file: does nothing."""

    def __init__(self, path):
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644) if path else None
        self.update()

    def update(self):
        if self.fd is not None:
            os.pwrite(self.fd, int(get_sim_time("ps")).to_bytes(8, "little"), 0)


def _accept(case):
    """Listen on the loopback port of `case`, name it in the port file, wait for the host;
    returns the non-blocking connection."""
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", int(case.get("port", 0))))
    server.listen(1)
    server.settimeout(float(case.get("accept_timeout_s", 60)))
    port = server.getsockname()[1]
    tmp = case["port_file"] + ".tmp"
    with open(tmp, "w") as f:
        f.write(str(port))
    os.replace(tmp, case["port_file"])
    conn, _ = server.accept()
    server.close()
    conn.setblocking(False)
    return conn


async def _serve(conn, link, quiet_limit, profile=None, progress=None):
    """Move bytes between the host's connection and `link` (_BurstLink or _PinLink) until the
    host closes it; returns the cycles simulated while bytes moved or the link settled (not
    while the engine ran a command: see _BurstLink.run_while_busy). `quiet_limit`: cycles
    without traffic after which the link is surely idle (a UART byte takes 10 * divisor
    cycles; give it a few bytes' time). `profile`, a dict, gets the wall seconds spent in
    each part of the loop ("send", "receive", "busy", "step", "host") and the wakes of each;
    `progress` (a _Progress) is told the simulated time at every turn of the loop. At the
    end `profile` also gets the loop's wall and CPU seconds and the simulated ns."""
    import time
    profile = {} if profile is None else profile
    clock_now = time.perf_counter

    def spent(part, since):
        now = clock_now()
        profile[part + "_s"] = profile.get(part + "_s", 0.0) + now - since
        profile[part + "_n"] = profile.get(part + "_n", 0) + 1
        return now

    progress = progress or _Progress(None)
    started, started_cpu = clock_now(), time.process_time()
    step, busy_step = MIN_STEP, BUSY_STEP
    cycles = quiet = 0
    while True:
        progress.update()
        t = clock_now()
        try:
            data = conn.recv(1 << 16)
            if not data:
                break                                  # the host closed the link
        except BlockingIOError:
            data = b""
        except ConnectionResetError:
            break
        moved = False
        if data:
            cycles += await link.send(data)
            moved = True
            t = spent("send", t)
        out, spent_cycles = await link.receive()
        cycles += spent_cycles
        if out:
            try:
                conn.sendall(out)
            except (BrokenPipeError, ConnectionResetError):
                break
            moved = True
            t = spent("receive", t)
        if data or out:
            busy_step = BUSY_STEP
        if await link.run_while_busy(busy_step):
            step = MIN_STEP
            busy_step = min(MAX_BUSY_STEP, 2 * busy_step)
            spent("busy", t)
        elif moved:
            step, quiet = MIN_STEP, 0
        elif quiet >= quiet_limit and link.idle():
            # nothing in flight and the engine idle: nothing can happen until the host
            # sends, so wait for it without advancing simulated time
            select.select([conn], [], [], 0.5)
            spent("host", t)
        else:
            stepped = await link.step(step)
            cycles += stepped
            quiet += stepped
            step = min(MAX_STEP, step * 2)
            spent("step", t)
    conn.close()
    # the simulator process's CPU seconds too: on a shared machine they do not grow with
    # the other processes' load the way wall seconds do
    profile.update(wall_s=clock_now() - started, cpu_s=time.process_time() - started_cpu,
                   sim_ns=int(get_sim_time("ns")))
    return cycles


class _BurstLink:
    """The SimBoard's burst ports; every call starts and ends at a falling edge of `clk`."""

    def __init__(self, dut):
        self.dut = dut
        self.period = clock.CLOCK_PERIOD_NS

    async def start(self):
        dut = self.dut
        # inputs are driven before the reset ends: an undriven strobe is X in Icarus, and an
        # X load or take strobe in the cycle after the reset would move bytes
        dut.host_w_load.value = 0
        dut.host_w_count.value = 0
        dut.host_w_burst.value = 0
        dut.host_r_take.value = 0
        # the clock runs inside the design (ember_sim.board.build_board): hold the
        # synchronous reset for two rising edges
        dut.rst.value = 1
        for _ in range(2):
            await RisingEdge(dut.clk)
        dut.rst.value = 0
        await RisingEdge(dut.clk)

    async def ready(self):
        await FallingEdge(self.dut.clk)

    async def send(self, data):
        dut = self.dut
        spent = 0
        for start in range(0, len(data), BURST_BYTES):
            if int(dut.host_w_busy.value):
                await FallingEdge(dut.host_w_busy)
                await FallingEdge(dut.clk)
                spent += 1
            await load_burst(dut, data[start:start + BURST_BYTES])
            spent += 1
        return spent

    async def receive(self):
        return await drain(self.dut)

    async def run_while_busy(self, span):
        """If the engine runs a command, run at full speed until it is done or `span` cycles
        have passed (what the host sends meanwhile waits in the socket until then) and return
        True."""
        dut = self.dut
        if not int(dut.busy.value):
            return False
        await First(Timer(span * self.period, unit="ns"), FallingEdge(dut.busy))
        await FallingEdge(dut.clk)
        return True

    def idle(self):
        return bool(int(self.dut.idle.value))

    async def step(self, count):
        """Let up to `count` cycles pass; return how many did. Ends early, at the falling edge
        after it, when the link falls idle (the answers to what was sent are all in the FIFO
        by then) or a command starts: the wait ends when there is something to do, not after
        a guess at how long a frame takes."""
        dut = self.dut
        period_ps = self.period * 1000
        started = get_sim_time("ps")
        await First(Timer(count * period_ps - period_ps // 4, unit="ps"),
                    RisingEdge(dut.idle), RisingEdge(dut.busy))
        await FallingEdge(dut.clk)
        return int(get_sim_time("ps") - started) // period_ps


@cocotb.test()
async def serve(dut):
    case = rtl.load_case()
    link = _BurstLink(dut)
    await link.start()
    conn = _accept(case)
    await link.ready()
    profile = {}
    cycles = await _serve(conn, link, int(case.get("quiet_cycles", 1024)), profile,
                          _Progress(case.get("progress_file")))
    rtl.write_result({"cycles": cycles, "profile": profile})


def _level(handle):
    """A 1-bit pin as "0", "1", "x" or "z"."""
    return str(handle.value).lower()


class _PinLink:
    """A board top through its pins: the clock pin (running inside the design, watched for
    its edges), the UART's rx (driven here) and tx
    (sampled here) pins and the LED pins (watched). Frames are counted both ways."""

    def __init__(self, dut, case):
        self.clock = getattr(dut, case["clock"])
        self.rx = getattr(dut, case["rx"])
        self.tx = getattr(dut, case["tx"])
        self.period_ps = int(case["clock_period_ps"])
        self.bit_ps = self.period_ps * int(case["divisor"])
        self.startup_cycles = int(case["startup_cycles"])
        self.leds = {role: (pin, getattr(dut, pin), bool(active_low))
                     for role, (pin, active_low) in case["leds"].items()}
        self.led_log = {}
        self.to_engine = Queue()
        self.sending = self.receiving = False
        self.received = bytearray()
        self.requests, self.responses = SlipDecoder(), SlipDecoder()
        self.frames_sent = self.frames_answered = 0
        self.answered = Event()
        self.line_errors = []

    async def start(self):
        self.rx.value = 1                              # the line idles high
        # the clock pin runs inside the design (ember_sim.board_sim.build_board_top)
        # the PLL model locks, then the top holds the engine in reset (engine_domain)
        await Timer(self.startup_cycles * self.period_ps, unit="ps")
        await FallingEdge(self.clock)
        for role, (name, pin, active_low) in self.leds.items():
            self.led_log[role] = {"pin": name, "active_low": active_low,
                                  "start": _level(pin), "seen": {_level(pin)}, "changes": 0}
            cocotb.start_soon(self._watch(role, pin))
        cocotb.start_soon(self._transmit())
        cocotb.start_soon(self._receive())

    async def ready(self):
        pass

    async def _watch(self, role, pin):
        log = self.led_log[role]
        while True:
            await pin.value_change
            log["changes"] += 1
            log["seen"].add(_level(pin))

    async def _transmit(self):
        """Host's UART: bytes from `to_engine` as 8N1 bits on the engine's rx pin, each
        burst starting at a falling edge of the clock."""
        while True:
            byte = await self.to_engine.get()
            if not self.sending:
                self.sending = True
                await FallingEdge(self.clock)
            for bit in (0, *(byte >> i & 1 for i in range(8)), 1):
                self.rx.value = bit
                await Timer(self.bit_ps, unit="ps")
            self.sending = not self.to_engine.empty()

    async def _receive(self):
        """Host's UART: the engine's tx pin sampled in the middle of every bit."""
        while True:
            await FallingEdge(self.tx)
            self.receiving = True
            await Timer(self.bit_ps // 2, unit="ps")
            bits = [_level(self.tx)]                   # the start bit, still low
            for _ in range(9):                         # 8 data bits, then the stop bit
                await Timer(self.bit_ps, unit="ps")
                bits.append(_level(self.tx))
            self.receiving = False
            if bits[0] != "0" or bits[9] != "1" or not set(bits) <= {"0", "1"}:
                self.line_errors.append("".join(bits))
                continue
            byte = sum(1 << i for i, b in enumerate(bits[1:9]) if b == "1")
            self.received.append(byte)
            self.frames_answered += len(self.responses.feed(bytes([byte])))
            if self.frames_answered >= self.frames_sent:
                self.answered.set()

    async def send(self, data):
        self.frames_sent += len(self.requests.feed(data))
        for byte in data:
            self.to_engine.put_nowait(byte)
        return 0

    async def receive(self):
        out, self.received = bytes(self.received), bytearray()
        return out, 0

    async def run_while_busy(self, span):
        return False                                   # no busy port: frames tell

    def idle(self):
        return (self.frames_answered >= self.frames_sent and not self.sending
                and self.to_engine.empty() and not self.receiving)

    async def step(self, cycles):
        # wakes early when the last response frame is complete; returns the cycles it took
        started = get_sim_time("ps")
        if self.frames_answered < self.frames_sent:
            self.answered.clear()
            await First(Timer(cycles * self.period_ps, unit="ps"), self.answered.wait())
        else:
            await Timer(cycles * self.period_ps, unit="ps")
        return int(get_sim_time("ps") - started) // self.period_ps

    def report(self):
        leds = {}
        for role, (_, pin, _) in self.leds.items():
            log = dict(self.led_log[role])
            log["end"] = _level(pin)
            log["seen"] = sorted(log["seen"])
            leds[role] = log
        return {"leds": leds, "line_errors": self.line_errors[:20]}


@cocotb.test(skip=True)
async def serve_pins(dut):
    """A board top (ember_sim.board_sim) through its pins (selected by name)."""
    case = rtl.load_case()
    link = _PinLink(dut, case)
    await link.start()
    conn = _accept(case)
    profile = {}
    cycles = await _serve(conn, link, int(case.get("quiet_cycles", 1024)), profile,
                          _Progress(case.get("progress_file")))
    rtl.write_result({"cycles": cycles, "profile": profile, **link.report()})


@cocotb.test(skip=True)
async def idle_speed(dut):
    """Simulated cycles per second of the whole board with Python asleep (selected by name)."""
    import time
    count = int(rtl.load_case().get("cycles", 200_000))
    link = _BurstLink(dut)
    await link.start()
    start, start_cpu = time.perf_counter(), time.process_time()
    await link.ready()
    await cycles(dut, count)
    # CPU seconds too: on a shared machine they do not grow with other processes' load
    rtl.write_result({"cycles": count, "seconds": time.perf_counter() - start,
                      "cpu_seconds": time.process_time() - start_cpu})


@cocotb.test(skip=True)
async def answers_a_frame(dut):
    """Three READs loaded as one burst are answered, in more bytes than a burst holds
    (selected by name)."""
    from ember import protocol, regmap
    link = _BurstLink(dut)
    await link.start()
    await link.ready()
    words = 2 * len(spec.COUNTERS)
    read_id = protocol.encode_request("read", 5, regmap.reg("id"), 1)
    read_counters = protocol.encode_request("read", 6, regmap.region("counters"), words)
    frames = read_id + read_counters + protocol.encode_request("read", 7, regmap.reg("id"), 1)
    await link.send(frames)
    out = bytearray()
    for _ in range(200):
        await link.step(64)
        got, _ = await link.receive()
        out += got
        if len(protocol.SlipDecoder().feed(bytes(out))) == 3:
            break
    assert len(out) > BURST_BYTES, f"{len(out)} bytes answered; the test needs > {BURST_BYTES}"
    payloads = protocol.SlipDecoder().feed(bytes(out))
    assert len(payloads) == 3, f"{len(payloads)} response frames in {bytes(out)!r}"
    first, second, third = (protocol.decode_response(p) for p in payloads)
    for response, seq in ((first, 5), (third, 7)):
        assert response.status == "ok" and response.seq == seq, response
        assert response.words == [spec.ENGINE_ID], response
    assert second.status == "ok" and second.seq == 6 and len(second.words) == words, second
    counters = regmap.counters_from_words(second.words)
    # the bridge takes a frame's bytes only once it has answered the one before
    assert counters["link_rx_bytes"] == len(read_id) + len(read_counters), counters
    assert counters["link_tx_bytes"] == len(protocol.slip_encode(payloads[0])), counters
