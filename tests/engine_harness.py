"""Drive EngineCore's bus from an Amaranth testbench: the host side of a training step,
shared by the engine's pysim tests; and `without_resends`, shared by the tests that compare
a device's link counters with the model's."""

from amaranth.sim import Simulator

from ember import regmap, spec, virtual
from ember.golden import GoldenModel


_STATUS_NAMES = {v: k for k, v in spec.LINK_STATUS.items()}


class BusError(RuntimeError):
    """The engine answered an access (or a command's end) with an error status."""

    def __init__(self, status, addr):
        super().__init__(f"bus error {status} at {addr:#x}")
        self.status, self.addr = status, addr


class BusDriver:
    """Async word reads and writes on EngineCore's bus, from an Amaranth testbench."""

    def __init__(self, ctx, bus, timeout=5_000_000):
        self.ctx, self.bus, self.timeout = ctx, bus, timeout

    async def _access(self, addr, data=None):
        ctx, bus = self.ctx, self.bus
        ctx.set(bus.addr, addr)
        if data is not None:
            ctx.set(bus.w_data, data & 0xFFFFFFFF)
            ctx.set(bus.w_stb, 1)
        else:
            ctx.set(bus.r_stb, 1)
        for _ in range(self.timeout):
            if ctx.get(bus.ack) or ctx.get(bus.err):
                error = ctx.get(bus.err)
                value = ctx.get(bus.r_data)
                deferred = ctx.get(bus.defer)
                await ctx.tick()
                ctx.set(bus.w_stb, 0)
                ctx.set(bus.r_stb, 0)
                if error:
                    raise BusError(_STATUS_NAMES[value & 0xFF], addr)
                if deferred:
                    await self._command_end(addr)
                return value
            await ctx.tick()
        raise TimeoutError(f"no answer at {addr:#x}")

    async def _command_end(self, addr):
        """A write that started a command (bus.defer): owe its answer until the command ends
        (bus.cmd_done), as the link bridge does; a stopped command raises BusError."""
        ctx, bus = self.ctx, self.bus
        ctx.set(bus.owing, 1)
        for _ in range(self.timeout):
            if ctx.get(bus.cmd_done):
                status = ctx.get(bus.cmd_status)
                await ctx.tick()
                ctx.set(bus.owing, 0)
                if status != spec.LINK_STATUS["ok"]:
                    raise BusError(_STATUS_NAMES[status], addr)
                return
            await ctx.tick()
        raise TimeoutError(f"the command started at {addr:#x} did not end")

    async def write(self, addr, value):
        await self._access(addr, value)

    async def read(self, addr):
        return await self._access(addr)

    async def write_words(self, addr, words):
        for i, w in enumerate(words):
            await self.write(addr + i, w)

    async def read_words(self, addr, count):
        return [await self.read(addr + i) for i in range(count)]


class EngineSession:
    """The host's sequence of bus operations for configure / load / train / read."""

    def __init__(self, driver, build, layers, batch):
        self.d, self.build, self.layers, self.batch = driver, build, layers, batch

    async def configure(self, weights):
        for addr, v in regmap.descriptor_writes(self.layers, self.build, self.batch):
            await self.d.write(addr, v)
        for addr, v in sorted(regmap.pack_weights(weights, self.layers, self.build).items()):
            await self.d.write(addr, v)

    async def run(self, control):
        # the engine answers a command's write when the command has finished
        await self.d.write(regmap.reg("control"), control)
        assert not (await self.d.read(regmap.reg("status"))) & 1

    async def train(self, x, y, settings):
        for addr, v in regmap.settings_writes(settings, len(self.layers) - 1):
            await self.d.write(addr, v)
        for base, words in regmap.batch_writes(x, y):
            await self.d.write_words(base, words)
        await self.run(spec.CONTROL_TRAIN)
        return await self.d.read(regmap.reg("correct"))

    async def infer(self, x):
        for base, words in regmap.batch_writes(x):
            await self.d.write_words(base, words)
        await self.run(spec.CONTROL_INFER)
        words = await self.d.read_words(regmap.region("predictions"), (len(x) + 1) // 2)
        return regmap.unpack_halves(words, len(x))

    async def weights(self):
        async def read(addr, count):
            return await self.d.read_words(addr, count)
        out = []
        # unpack_weights wants a synchronous reader: fetch each layer's words first
        cache = {}
        for d in regmap.layout(self.layers, self.build):
            n = self.build.blocks(d["outputs"]) * d["inputs"] * self.build.lanes // 2
            base = regmap.region("weights") + d["weight_base"] * self.build.lanes // 2
            cache[base] = await read(base, n)
        return regmap.unpack_weights(lambda a, c: cache[a][:c], self.layers, self.build)

    async def counters(self):
        words = await self.d.read_words(regmap.region("counters"), 2 * len(spec.COUNTERS))
        return regmap.counters_from_words(words)


def run_testbench(dut, body, vcd=None):
    """Run `body(ctx)` against `dut` in the Amaranth simulator."""
    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(body)
    if vcd:
        with sim.write_vcd(vcd):
            sim.run()
    else:
        sim.run()


def model_access(model, addr, data=None):
    """The model's answer to a bus access, as the unit tests compare it: ("ok", word or None)
    or (status name, None)."""
    try:
        if data is None:
            return "ok", model.read(addr)
        model.write(addr, data)
        return "ok", None
    except virtual.BusError as e:
        return e.status, None


def golden_for(build, layers, weights):
    g = GoldenModel(build)
    g.configure(layers)
    g.load_weights(weights)
    return g


def without_resends(counters, link, since=None):
    """The device's `counters` as a session without resent frames would have counted them.

    A frame the host sent again (ember.protocol.Link: a timeout, a garbled answer) reaches the
    device once more and is answered once more, so the device's link_rx_bytes hold the Link's
    resent_bytes on top of the model's, and its link_tx_bytes the resent_answer_bytes (the
    link loses nothing in simulation). `since`: the Link's resend_counts() just before the
    counters were last cleared. The other counters are returned as they are.
    """
    now = link.resend_counts()
    before = since or dict.fromkeys(now, 0)
    out = dict(counters)
    out["link_rx_bytes"] -= now["link_resent_bytes"] - before["link_resent_bytes"]
    out["link_tx_bytes"] -= now["link_resent_answer_bytes"] - before["link_resent_answer_bytes"]
    return out


def random_step_settings(rng, n_layers):
    """Random step settings of every unit: an SLU mask (or none), zero skipping, PSG absolute
    or relative, ssProp by |dY| or LFSR at a few keep ratios, a random lr_shift."""
    from ember import spec
    return spec.StepSettings(
        update_mask=(tuple(bool(v) for v in rng.integers(0, 2, n_layers))
                     if rng.random() < 0.5 else None),
        zero_skip=bool(rng.integers(0, 2)), psg=bool(rng.integers(0, 2)),
        psg_relative=bool(rng.integers(0, 2)), psg_tau=int(rng.integers(0, 5)),
        keep_q8=int(rng.choice([256, 200, 128, 64])), ssprop_random=bool(rng.integers(0, 2)),
        lfsr_seed=int(rng.integers(1, 1 << 16)), lr_shift=int(rng.integers(4, 14)))
