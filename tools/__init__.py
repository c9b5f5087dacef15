"""Helpers outside the wheel: the demo run by ``make demo``."""
