"""Measurement on top of the engine: quality scores, acceptance maps, comparisons."""
