"""A second, independent implementation reads our tiles, checkpoints, cosignatures and proofs.

``tlog-scales`` (a public Python client for C2SP tlog-tiles logs; a test-only dependency in
requirements-dev.txt) is pointed at a directory laid out exactly as the gateway will serve it
(``checkpoint``, ``tile/<L>/<N>[.p/<W>]``, ``tile/entries/<N>[.p/<W>]``), written with
``tollgate_client.tlog``: it must verify our checkpoint signature and a witness's ``cosignature/v1``,
rebuild our root from our tiles, compute the same inclusion and consistency proofs as ours, accept
ours, and read our entries back. No database.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import pytest

# Skipped, not failed, where the shared environment predates tlog-scales in requirements-dev.txt.
pytest.importorskip("tlog_scales", reason="tlog-scales is a test-only dependency (requirements-dev.txt)")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "client"))

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from tlog_scales.backend import LocalBackend
from tlog_scales.reader import TilesReader
from tlog_scales.signing import Vkey
from tlog_scales.tlog import ConsistencyProof, InclusionProof, InclusionProofInvalid
from tollgate_client.tlog import (
    Cosigner,
    TlogProof,
    consistency_proof,
    entry_bundle,
    hash_reader_from_tiles,
    inclusion_proof,
    leaf_hash,
    parse_tile_path,
    tile_bytes,
    tile_path,
    tiles_for_size,
)

from tests.tlog_helpers import MemoryLog

SIZE = 70_000  # the tlog-tiles example: partial tiles at levels 0, 1 and 2


@pytest.fixture(scope="module")
def served():
    """Our log of 70,000 statements written out as its tiles, with a cosigned checkpoint."""
    log = MemoryLog.for_tenant("spn_Tiles")
    for i in range(SIZE):
        log.append(b'{"n":%d,"type":"receipt"}' % i)
    witness = Cosigner("witness.test/w1", Ed25519PrivateKey.generate())
    note = log.checkpoint()
    text = note.split("\n\n")[0] + "\n"
    note += witness.cosign(text.encode(), 1_800_000_000).line()
    with tempfile.TemporaryDirectory(prefix="tollgate-tiles-") as tmp:
        root = Path(tmp)
        (root / "checkpoint").write_text(note)
        for level, index, width in tiles_for_size(SIZE):
            path = root / tile_path(level, index, width)
            assert parse_tile_path(tile_path(level, index, width)) == (level, index, width)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(tile_bytes(level, index, width, log.read))
            if level == 0:
                bundle = root / tile_path("entries", index, width)
                bundle.parent.mkdir(parents=True, exist_ok=True)
                bundle.write_bytes(entry_bundle(log.leaves[index * 256 : index * 256 + width]))
        yield log, witness, root


def _reader(root: Path) -> TilesReader:
    reader = TilesReader(LocalBackend(root))
    reader.get_checkpoint()
    return reader


def test_it_verifies_our_checkpoint_and_cosignature(served):
    log, witness, root = served
    reader = TilesReader(LocalBackend(root))
    checkpoint = reader.get_checkpoint()
    assert (checkpoint.origin, checkpoint.size, checkpoint.root_hash) == (log.origin, SIZE, log.root())
    checkpoint.verify(Vkey.from_string(str(log.signer.verifier)))
    checkpoint.verify(Vkey.from_string(str(witness.verifier)))


def test_it_rebuilds_our_root_from_our_tiles(served):
    log, _, root = served
    assert _reader(root).calculate_root_hash() == log.root()


@pytest.mark.parametrize("index", [0, 1, 255, 256, 65_535, 65_536, 69_887, 69_888, SIZE - 1])
def test_inclusion_proofs_agree(served, index):
    log, _, root = served
    ours = inclusion_proof(index, SIZE, log.read)
    theirs = _reader(root).get_inclusion_proof(index, SIZE)
    assert theirs.node_hashes == ours
    InclusionProof(index, SIZE, ours).check(leaf_hash(log.leaves[index]), log.root())
    # And our tlog-proof@v1 text carries exactly that path.
    assert list(TlogProof.parse(log.proof(index, log.checkpoint())).path) == ours
    with pytest.raises(InclusionProofInvalid):
        InclusionProof(index, SIZE, ours).check(leaf_hash(b"another statement"), log.root())


@pytest.mark.parametrize("old", [1, 255, 256, 4_096, 65_536, 69_999])
def test_consistency_proofs_agree(served, old):
    log, _, root = served
    ours = consistency_proof(old, SIZE, log.read)
    theirs = _reader(root).get_consistency_proof(old, SIZE)
    assert theirs.node_hashes == ours
    ConsistencyProof(old, SIZE, ours).check(log.root(old), log.root())


def test_it_reads_our_entries_and_we_read_our_tiles(served):
    log, _, root = served
    reader = _reader(root)
    for index in (0, 300, SIZE - 1):
        assert reader.get_entry(index) == log.leaves[index]

    def fetch(level: int, index: int, width: int) -> bytes:
        return (root / tile_path(level, index, width)).read_bytes()

    from_tiles = hash_reader_from_tiles(SIZE, fetch)
    assert inclusion_proof(12_345, SIZE, from_tiles) == inclusion_proof(12_345, SIZE, log.read)
