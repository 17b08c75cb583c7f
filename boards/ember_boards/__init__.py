"""Board tops and build flows (iCEBreaker, ULX3S)."""
