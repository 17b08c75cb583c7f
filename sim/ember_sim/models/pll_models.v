// Behavioural stand-ins for the board tops' PLL primitives, for simulating a whole board top
// (ember_sim.board_sim). The PLL is MODELLED, NOT SIMULATED:
//
//   - the output clock is the reference clock passed straight through. A zero-delay simulation
//     cannot make a faster clock out of a slower one, so the bench drives the board's clock pin
//     at the PLL's *output* frequency (the top's clock_hz, e.g. 36 MHz on the iCEBreaker
//     instead of its 12 MHz oscillator). The divider parameters are accepted and ignored here;
//     their arithmetic is checked by tests/test_boards.py, and the real PLL by nextpnr;
//   - LOCK rises after LOCK_CYCLES cycles of the reference once the PLL is out of reset, and
//     falls at once when it is put back in reset, so the top's reset hold
//     (ember_boards.common.engine_domain) runs as it does on the board.
//
// Module names and ports are those of the primitives (Yosys's iCE40 cells_sim.v and ECP5
// cells_bb.v), so the tops' own Instance()s bind to them unchanged. Yosys's iCE40 cells_sim.v
// declares SB_PLL40_PAD as an empty blackbox: ember_sim.board_sim compiles a copy of it
// without that module next to this file. No `timescale: nothing here waits for time.

module SB_PLL40_PAD (
	input   PACKAGEPIN,
	output  PLLOUTCORE,
	output  PLLOUTGLOBAL,
	input   EXTFEEDBACK,
	input   [7:0] DYNAMICDELAY,
	output  LOCK,
	input   BYPASS,
	input   RESETB,
	input   LATCHINPUTVALUE,
	output  SDO,
	input   SDI,
	input   SCLK
);
	parameter FEEDBACK_PATH = "SIMPLE";
	parameter DELAY_ADJUSTMENT_MODE_FEEDBACK = "FIXED";
	parameter DELAY_ADJUSTMENT_MODE_RELATIVE = "FIXED";
	parameter SHIFTREG_DIV_MODE = 1'b0;
	parameter FDA_FEEDBACK = 4'b0000;
	parameter FDA_RELATIVE = 4'b0000;
	parameter PLLOUT_SELECT = "GENCLK";
	parameter DIVR = 4'b0000;
	parameter DIVF = 7'b0000000;
	parameter DIVQ = 3'b000;
	parameter FILTER_RANGE = 3'b000;
	parameter ENABLE_ICEGATE = 1'b0;
	parameter TEST_MODE = 1'b0;
	parameter EXTERNAL_DIVIDE_FACTOR = 1;
	// model only: reference cycles from reset release to LOCK
	parameter LOCK_CYCLES = 64;

	reg [15:0] lock_count = 16'd0;
	// RESETB is active low; an unconnected (z) or x RESETB counts as "running"
	wire running = RESETB !== 1'b0;
	always @(posedge PACKAGEPIN or negedge running)
		if (!running)
			lock_count <= 16'd0;
		else if (lock_count != LOCK_CYCLES)
			lock_count <= lock_count + 16'd1;

	assign PLLOUTCORE = PACKAGEPIN;
	assign PLLOUTGLOBAL = PACKAGEPIN;
	assign LOCK = running && lock_count == LOCK_CYCLES;
	assign SDO = 1'b0;
endmodule

module EHXPLLL (
	input   CLKI,
	input   CLKFB,
	input   PHASESEL1,
	input   PHASESEL0,
	input   PHASEDIR,
	input   PHASESTEP,
	input   PHASELOADREG,
	input   STDBY,
	input   PLLWAKESYNC,
	input   RST,
	input   ENCLKOP,
	input   ENCLKOS,
	input   ENCLKOS2,
	input   ENCLKOS3,
	output  CLKOP,
	output  CLKOS,
	output  CLKOS2,
	output  CLKOS3,
	output  LOCK,
	output  INTLOCK,
	output  REFCLK,
	output  CLKINTFB
);
	parameter CLKI_DIV = 1;
	parameter CLKFB_DIV = 1;
	parameter CLKOP_DIV = 8;
	parameter CLKOS_DIV = 8;
	parameter CLKOS2_DIV = 8;
	parameter CLKOS3_DIV = 8;
	parameter CLKOP_ENABLE = "ENABLED";
	parameter CLKOS_ENABLE = "DISABLED";
	parameter CLKOS2_ENABLE = "DISABLED";
	parameter CLKOS3_ENABLE = "DISABLED";
	parameter CLKOP_CPHASE = 0;
	parameter CLKOS_CPHASE = 0;
	parameter CLKOS2_CPHASE = 0;
	parameter CLKOS3_CPHASE = 0;
	parameter CLKOP_FPHASE = 0;
	parameter CLKOS_FPHASE = 0;
	parameter CLKOS2_FPHASE = 0;
	parameter CLKOS3_FPHASE = 0;
	parameter FEEDBK_PATH = "CLKOP";
	parameter CLKOP_TRIM_POL = "RISING";
	parameter CLKOP_TRIM_DELAY = 0;
	parameter CLKOS_TRIM_POL = "RISING";
	parameter CLKOS_TRIM_DELAY = 0;
	parameter OUTDIVIDER_MUXA = "DIVA";
	parameter OUTDIVIDER_MUXB = "DIVB";
	parameter OUTDIVIDER_MUXC = "DIVC";
	parameter OUTDIVIDER_MUXD = "DIVD";
	parameter PLL_LOCK_MODE = 0;
	parameter PLL_LOCK_DELAY = 200;
	parameter STDBY_ENABLE = "DISABLED";
	parameter REFIN_RESET = "DISABLED";
	parameter SYNC_ENABLE = "DISABLED";
	parameter INT_LOCK_STICKY = "ENABLED";
	parameter DPHASE_SOURCE = "DISABLED";
	parameter PLLRST_ENA = "DISABLED";
	parameter INTFB_WAKE = "DISABLED";
	// model only: reference cycles from reset release to LOCK
	parameter LOCK_CYCLES = 64;

	reg [15:0] lock_count = 16'd0;
	// RST is active high (it only acts with PLLRST_ENA "ENABLED"); z or x counts as "running"
	wire running = PLLRST_ENA != "ENABLED" || RST !== 1'b1;
	always @(posedge CLKI or negedge running)
		if (!running)
			lock_count <= 16'd0;
		else if (lock_count != LOCK_CYCLES)
			lock_count <= lock_count + 16'd1;

	// CLKOP only (the tops use no other output); ENCLKOP, the phase and standby inputs are
	// not modelled
	assign CLKOP = CLKI;
	assign CLKOS = 1'b0;
	assign CLKOS2 = 1'b0;
	assign CLKOS3 = 1'b0;
	assign LOCK = running && lock_count == LOCK_CYCLES;
	assign INTLOCK = LOCK;
	assign REFCLK = CLKI;
	assign CLKINTFB = 1'b0;
endmodule
