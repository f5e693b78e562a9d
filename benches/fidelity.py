"""Thin wrapper: ``python3 benches/fidelity.py --model DIR`` runs ``python -m v4flash.fidelity``
(the code is in python/v4flash/fidelity.py so the tests can use it from the installed package)."""

import sys

from v4flash.fidelity import main

if __name__ == "__main__":
    sys.exit(main())
