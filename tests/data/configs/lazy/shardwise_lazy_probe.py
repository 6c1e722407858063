"""A module whose import a test can see (not a config)."""

IMPORTED = []


class Probe:
    pass


IMPORTED.append(__name__)
