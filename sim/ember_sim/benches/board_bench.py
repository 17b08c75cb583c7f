"""cocotb side of the simulated board: serves the engine's link on a loopback TCP socket.

The host opens `socket://127.0.0.1:PORT` with pyserial (exactly as it opens a board's serial
port) and talks the link protocol; this bench moves the bytes between the socket and the
SimBoard FIFOs and otherwise lets the simulation run in large steps. It ends when the host
closes the connection.

Case (ember_sim.rtl.load_case): {"port_file": path, "port": 0 or a fixed port,
"accept_timeout_s": seconds to wait for the host, "quiet_cycles": idle cycles after which the
link is surely idle and the bench blocks on the socket instead of simulating}.
"""

import os
import select
import socket

import cocotb
from cocotb.triggers import FallingEdge, First, Timer

from ember import spec
from ember_sim import clock, rtl

MIN_STEP, MAX_STEP = 64, 4096


async def drain(dut, count):
    """Pop `count` bytes the engine sent (called at a falling edge); returns them and the
    cycles it took."""
    out = bytearray()
    cycles = 0
    while len(out) < count:
        ready = int(dut.host_r_rdy.value)
        if ready:
            out.append(int(dut.host_r_data.value))
        dut.host_r_en.value = ready
        await FallingEdge(dut.clk)
        cycles += 1
    dut.host_r_en.value = 0
    return bytes(out), cycles


@cocotb.test()
async def serve(dut):
    case = rtl.load_case()
    # inputs are driven before the reset ends: an undriven strobe is X in Icarus, and an X
    # byte strobe in the cycle after the reset would be counted into the link counters
    dut.host_w_en.value = 0
    dut.host_r_en.value = 0
    clk = clock.start_clock(dut)
    await clock.reset(dut, clk)
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
    period = clock.CLOCK_PERIOD_NS
    step = MIN_STEP
    cycles = quiet = 0
    # cycles without traffic after which the link is surely idle (a UART byte takes
    # 10 * divisor cycles; give it a few bytes' time)
    quiet_limit = int(case.get("quiet_cycles", 1024))
    await FallingEdge(dut.clk)
    while True:
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
            for byte in data:
                dut.host_w_data.value = byte
                dut.host_w_en.value = 1
                await FallingEdge(dut.clk)
            dut.host_w_en.value = 0
            cycles += len(data)
            moved = True
        level = int(dut.host_r_level.value)
        if level:
            out, spent = await drain(dut, level)
            cycles += spent
            try:
                conn.sendall(bytes(out))
            except (BrokenPipeError, ConnectionResetError):
                break
            moved = True
        if int(dut.busy.value):
            # the engine computes: run at full speed until it is done (the host's status
            # polls wait in the socket meanwhile)
            await First(Timer(MAX_STEP * period, unit="ns"), FallingEdge(dut.busy))
            await FallingEdge(dut.clk)
            step = MIN_STEP
        elif moved:
            step, quiet = MIN_STEP, 0
        elif quiet >= quiet_limit and int(dut.idle.value):
            # nothing in flight and the engine idle: nothing can happen until the host
            # sends, so wait for it without advancing simulated time
            select.select([conn], [], [], 0.5)
        else:
            # end the step a quarter period before a falling edge, then meet that edge: an
            # await that fired in the very time step of an edge could return without a
            # rising edge in between and lose the byte written before it
            await Timer(step * period * 1000 - period * 250, unit="ps")
            await FallingEdge(dut.clk)
            cycles += step
            quiet += step
            step = min(MAX_STEP, step * 2)
    conn.close()
    rtl.write_result({"cycles": cycles})


@cocotb.test(skip=True)
async def idle_speed(dut):
    """Simulated cycles per second of the whole board with Python asleep (selected by name)."""
    import time
    cycles = int(rtl.load_case().get("cycles", 200_000))
    # inputs are driven before the reset ends: an undriven strobe is X in Icarus, and an X
    # byte strobe in the cycle after the reset would be counted into the link counters
    dut.host_w_en.value = 0
    dut.host_r_en.value = 0
    clk = clock.start_clock(dut)
    await clock.reset(dut, clk)
    start = time.perf_counter()
    await clock.wait_cycles(clk, cycles)
    rtl.write_result({"cycles": cycles, "seconds": time.perf_counter() - start})


@cocotb.test(skip=True)
async def answers_a_frame(dut):
    """A READ of the id register pushed into the FIFO is answered (selected by name)."""
    from ember import protocol, regmap
    clk = clock.start_clock(dut)
    dut.host_w_en.value = 0
    dut.host_r_en.value = 0
    await clock.reset(dut, clk)
    await FallingEdge(dut.clk)
    frame = protocol.encode_request("read", 5, regmap.reg("id"), 1)
    for byte in frame:
        dut.host_w_data.value = byte
        dut.host_w_en.value = 1
        await FallingEdge(dut.clk)
    dut.host_w_en.value = 0
    for _ in range(2000):
        await FallingEdge(dut.clk)
        if int(dut.host_r_level.value):
            break
    for _ in range(100):                     # the rest of the response
        await FallingEdge(dut.clk)
    out, _ = await drain(dut, int(dut.host_r_level.value))
    payloads = protocol.SlipDecoder().feed(bytes(out))
    assert payloads, f"no response frame in {bytes(out)!r} (level {level})"
    response = protocol.decode_response(payloads[0])
    assert response.status == "ok" and response.words == [spec.ENGINE_ID], response
