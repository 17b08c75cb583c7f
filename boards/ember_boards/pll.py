"""PLL parameters for the board tops, computed in Python so the achieved clock is known before
anything is built.

`ice40_pll(f_in, f_target)` and `ecp5_pll(f_in, f_target)` search every legal divider setting of
the iCE40 SB_PLL40 and the ECP5 EHXPLLL and return the one whose output is closest to the
target (ties: the VCO frequency nearest the middle of its legal range, away from the
edges where lock is least robust). Both return a `PllConfig` that
names the dividers and the frequency it really gives; the tops hand that figure (never the
target) to the UART divisor, and the build report shows both.
"""

from dataclasses import dataclass, field

__all__ = ["PllConfig", "ice40_pll", "ecp5_pll"]


@dataclass(frozen=True)
class PllConfig:
    """One PLL setting.

    f_in_hz:  reference clock.
    f_out_hz: the output frequency these dividers give (exact, not rounded to the target).
    f_vco_hz: VCO frequency.
    f_pfd_hz: phase detector frequency (reference after the input divider).
    params:   the divider parameters by their primitive's parameter names.
    """
    f_in_hz: float
    f_out_hz: float
    f_vco_hz: float
    f_pfd_hz: float
    params: dict = field(default_factory=dict)

    def error(self, f_target_hz):
        """Relative distance of the output from `f_target_hz`."""
        return abs(self.f_out_hz - f_target_hz) / f_target_hz


# --- iCE40 SB_PLL40 (iCE40 sysCLOCK PLL user guide, TN1251; the same limits as icepll) -----------
ICE40_PFD_HZ = (10e6, 133e6)
ICE40_VCO_HZ = (533e6, 1066e6)
ICE40_OUT_HZ = (16e6, 275e6)
ICE40_IN_HZ = (10e6, 133e6)


def _ice40_filter_range(f_pfd_hz):
    # Loop filter setting by PFD frequency, as icepll chooses it.
    for limit, value in ((17e6, 1), (26e6, 2), (44e6, 3), (66e6, 4), (101e6, 5)):
        if f_pfd_hz < limit:
            return value
    return 6


def ice40_pll(f_in_hz, f_target_hz):
    """Dividers of an iCE40 SB_PLL40 in SIMPLE feedback mode for `f_target_hz` from `f_in_hz`.

    f_out = f_in * (DIVF + 1) / ((DIVR + 1) * 2**DIVQ), with f_in / (DIVR + 1) in 10..133 MHz
    and the VCO (before the 2**DIVQ output divider) in 533..1066 MHz.
    Returns the closest `PllConfig`; params DIVR, DIVF, DIVQ, FILTER_RANGE.
    Raises ValueError if the reference or the target is outside the PLL's range.
    """
    if not ICE40_IN_HZ[0] <= f_in_hz <= ICE40_IN_HZ[1]:
        raise ValueError(f"iCE40 PLL reference {f_in_hz / 1e6:g} MHz is outside "
                         f"{ICE40_IN_HZ[0] / 1e6:g}..{ICE40_IN_HZ[1] / 1e6:g} MHz")
    if not ICE40_OUT_HZ[0] <= f_target_hz <= ICE40_OUT_HZ[1]:
        raise ValueError(f"iCE40 PLL output {f_target_hz / 1e6:g} MHz is outside "
                         f"{ICE40_OUT_HZ[0] / 1e6:g}..{ICE40_OUT_HZ[1] / 1e6:g} MHz")
    best = None
    for divr in range(16):
        f_pfd = f_in_hz / (divr + 1)
        if not ICE40_PFD_HZ[0] <= f_pfd <= ICE40_PFD_HZ[1]:
            continue
        for divf in range(128):
            f_vco = f_pfd * (divf + 1)
            if not ICE40_VCO_HZ[0] <= f_vco <= ICE40_VCO_HZ[1]:
                continue
            for divq in range(1, 7):
                f_out = f_vco / (1 << divq)
                if not ICE40_OUT_HZ[0] <= f_out <= ICE40_OUT_HZ[1]:
                    continue
                key = (round(abs(f_out - f_target_hz)), abs(f_vco - sum(ICE40_VCO_HZ) / 2))
                if best is None or key < best[0]:
                    best = (key, PllConfig(f_in_hz, f_out, f_vco, f_pfd, {
                        "DIVR": divr, "DIVF": divf, "DIVQ": divq,
                        "FILTER_RANGE": _ice40_filter_range(f_pfd)}))
    if best is None:
        raise ValueError(f"no iCE40 PLL setting reaches {f_target_hz / 1e6:g} MHz from "
                         f"{f_in_hz / 1e6:g} MHz")
    return best[1]


# --- ECP5 EHXPLLL (FPGA-TN-02200; the same limits as ecppll and LiteX's ECP5PLL) -------------
ECP5_IN_HZ = (8e6, 400e6)
ECP5_PFD_HZ = (3.125e6, 400e6)
ECP5_VCO_HZ = (400e6, 800e6)
ECP5_OUT_HZ = (3.125e6, 400e6)


def ecp5_pll(f_in_hz, f_target_hz):
    """Dividers of an ECP5 EHXPLLL with CLKOP fed back (FEEDBK_PATH "CLKOP").

    f_out = f_in * CLKFB_DIV / CLKI_DIV and f_vco = f_out * CLKOP_DIV, with the PFD
    (f_in / CLKI_DIV) in 3.125..400 MHz and the VCO in 400..800 MHz.
    Returns the closest `PllConfig`; params CLKI_DIV, CLKFB_DIV, CLKOP_DIV, CLKOP_CPHASE.
    Raises ValueError if the reference or the target is outside the PLL's range.
    """
    if not ECP5_IN_HZ[0] <= f_in_hz <= ECP5_IN_HZ[1]:
        raise ValueError(f"ECP5 PLL reference {f_in_hz / 1e6:g} MHz is outside "
                         f"{ECP5_IN_HZ[0] / 1e6:g}..{ECP5_IN_HZ[1] / 1e6:g} MHz")
    if not ECP5_OUT_HZ[0] <= f_target_hz <= ECP5_OUT_HZ[1]:
        raise ValueError(f"ECP5 PLL output {f_target_hz / 1e6:g} MHz is outside "
                         f"{ECP5_OUT_HZ[0] / 1e6:g}..{ECP5_OUT_HZ[1] / 1e6:g} MHz")
    best = None
    for clki_div in range(1, 129):
        f_pfd = f_in_hz / clki_div
        if not ECP5_PFD_HZ[0] <= f_pfd <= ECP5_PFD_HZ[1]:
            continue
        for clkfb_div in range(1, 81):
            f_out = f_pfd * clkfb_div
            if not ECP5_OUT_HZ[0] <= f_out <= ECP5_OUT_HZ[1]:
                continue
            for clkop_div in range(1, 129):
                f_vco = f_out * clkop_div
                if not ECP5_VCO_HZ[0] <= f_vco <= ECP5_VCO_HZ[1]:
                    continue
                key = (round(abs(f_out - f_target_hz)), abs(f_vco - sum(ECP5_VCO_HZ) / 2),
                       clki_div)
                if best is None or key < best[0]:
                    # CPHASE = CLKOP_DIV - 1 is zero phase shift (as ecppll and LiteX set it)
                    best = (key, PllConfig(f_in_hz, f_out, f_vco, f_pfd, {
                        "CLKI_DIV": clki_div, "CLKFB_DIV": clkfb_div, "CLKOP_DIV": clkop_div,
                        "CLKOP_CPHASE": clkop_div - 1}))
    if best is None:
        raise ValueError(f"no ECP5 PLL setting reaches {f_target_hz / 1e6:g} MHz from "
                         f"{f_in_hz / 1e6:g} MHz")
    return best[1]
