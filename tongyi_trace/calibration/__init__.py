"""Calibration of the synthetic traces against their targets: drivers that run the analyses and the
simulator over a generated trace (profiles.py: a profile's figures against its bands)."""
