"""The offline verifier against committed golden portable receipts (no database needed)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from receipts.verify import verify_portable

GOLDEN = Path(__file__).resolve().parent / "golden" / "portable"
EXPECTED = json.loads((GOLDEN / "expected.json").read_text())
ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_golden_verdicts(name):
    verdict = verify_portable(json.loads((GOLDEN / name).read_text()))
    assert (verdict.valid, verdict.reason) == (EXPECTED[name]["valid"], EXPECTED[name]["reason"])


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_cli_exit_codes(name):
    done = subprocess.run(
        [sys.executable, "-m", "receipts.verify", str(GOLDEN / name)], capture_output=True, text=True, cwd=ROOT
    )
    assert done.returncode == (0 if EXPECTED[name]["valid"] else 1), done.stdout + done.stderr


def test_a_trusted_key_set_overrides_the_embedded_snapshot():
    doc = json.loads((GOLDEN / "unknown_kid.json").read_text())
    jwks = json.loads((GOLDEN / "jwks_both_keys.json").read_text())
    assert verify_portable(doc).reason == "unknown_kid"
    assert verify_portable(doc, jwks).valid
    # And a snapshot without the signer's key refuses even a well-signed receipt.
    valid = json.loads((GOLDEN / "valid.json").read_text())
    assert verify_portable(valid, {"keys": []}).reason == "unknown_kid"
    assert verify_portable(valid, {"nokeys": 1}).reason == "no_key_set"


def test_unreadable_input_exits_2(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    done = subprocess.run([sys.executable, "-m", "receipts.verify", str(bad)], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 2
    assert verify_portable([1, 2]).reason == "not_an_object"
    assert verify_portable({"format": "other"}).reason == "unknown_format"
