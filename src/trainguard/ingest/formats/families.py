"""The format families, imported by name: importing this module declares every contract (`FORMATS`)."""

from __future__ import annotations
