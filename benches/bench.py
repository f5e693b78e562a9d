#!/usr/bin/env python3
"""Thin wrapper: ``python benches/bench.py ARGS`` == ``v4flash bench ARGS``."""

from __future__ import annotations

import sys

from v4flash.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", *sys.argv[1:]]))
