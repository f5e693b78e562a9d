#!/usr/bin/env python3
"""Thin wrapper: ``python benches/bench.py ARGS`` == ``python -m v4flash.bench ARGS``."""

from __future__ import annotations

import sys

from v4flash.bench import main

if __name__ == "__main__":
    sys.exit(main())
