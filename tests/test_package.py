import subprocess
import sys

import v4flash


def test_version_matches_core():
    assert v4flash.__version__
    out = subprocess.run(
        [sys.executable, "-m", "v4flash", "--version"], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == f"v4flash {v4flash.__version__}"


def test_kernel_tier_is_known():
    assert v4flash.kernel_tier() in ("portable", "avx2", "avx512", "neon", "neon-dotprod")
