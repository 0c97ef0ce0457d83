"""Calibration of the synthetic traces against their targets: drivers that run ingest, the analyses and the
simulator over a generated trace (profiles.py: a profile's figures against its bands; twin.py: a twin
against the run it follows)."""
