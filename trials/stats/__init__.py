"""Pure formulas, no torch (the dashboard imports them): ``factorial`` (main effects and interactions
of a 2^n design with 95 % t-intervals over repeats) and ``theory`` (the predictions logged beside
measurements: Leviathan's tokens per pass, the bandwidth roofline).
"""
