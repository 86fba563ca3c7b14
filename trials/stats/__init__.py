"""Pure formulas, no torch (the dashboard imports them): ``factorial`` (main effects and interactions
of a 2^n design with 95 % t-intervals over repeats), ``theory`` (the predictions logged beside
measurements: Leviathan's tokens per pass, the bandwidth roofline), ``serving`` (percentiles with
intervals, goodput) and ``step_time`` (llama-server's step time against its tokens, and the p95 ITL
a ``-b`` predicts).
"""
