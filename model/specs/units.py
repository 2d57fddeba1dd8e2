"""Unit conversions. Everything inside the model is SI (s, bytes, FLOP, bytes/s); external names
carry their unit as a suffix. This module is the one place that converts."""

KB, MB, GB, TB = 1e3, 1e6, 1e9, 1e12
KIB, MIB, GIB, TIB = 2.0**10, 2.0**20, 2.0**30, 2.0**40
TFLOPS = 1e12  # FLOP/s
PFLOPS = 1e15
MS = 1e-3
US = 1e-6
HOUR = 3600.0
GBIT = 1e9 / 8  # bytes per gigabit


def bits_to_bytes(bits: float) -> float:
    return bits / 8.0


def to_ms(seconds: float) -> float:
    return seconds / MS


def from_ms(milliseconds: float) -> float:
    return milliseconds * MS


def gbps_to_bytes_per_s(gigabytes_per_s: float) -> float:
    return gigabytes_per_s * GB


def gbit_to_bytes_per_s(gigabits_per_s: float) -> float:
    return gigabits_per_s * GBIT
