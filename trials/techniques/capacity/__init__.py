"""Capacity under an SLO: the highest rate a served configuration sustains, found by search."""
