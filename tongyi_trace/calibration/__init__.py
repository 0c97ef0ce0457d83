"""Calibration checks: a synthetic trace measured through ingest, the analyses and the simulator."""
