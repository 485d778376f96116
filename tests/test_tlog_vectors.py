"""The transparency-log library (client/tollgate_client/tlog) against the public reference test vectors.

The vectors under tests/golden/tlog/ are copied from the reference implementations' test data
(tests/golden/tlog/README.md names each source): RFC 6962 hashing, inclusion and consistency proof
verification (every probe of transparency-dev/merkle's testdata, the failing ones too), proof
generation over the 8-leaf reference tree, signed notes (golang.org/x/mod's sumdb/note), a real
sum.golang.org checkpoint, a real CT log checkpoint with a witness cosignature/v1, and tile paths.
No database needed.
"""

from __future__ import annotations

import base64
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "client"))

from tollgate_client.tlog import (
    EMPTY_ROOT,
    Checkpoint,
    NoteError,
    ProofError,
    Signer,
    Verifier,
    consistency_proof,
    format_note,
    inclusion_proof,
    leaf_hash,
    node_hash,
    parse_note,
    parse_tile_path,
    tile_path,
    tiles_for_size,
    tree_hash,
    verified_signatures,
    verify_consistency,
    verify_inclusion,
)
from tollgate_client.tlog.note import cosignature_timestamp

GOLDEN = Path(__file__).resolve().parent / "golden" / "tlog"
TREE = json.loads((GOLDEN / "merkle_tree.json").read_text())
NOTES = json.loads((GOLDEN / "notes.json").read_text())
INCLUSION = json.loads((GOLDEN / "merkle_inclusion.json").read_text())["vectors"]
CONSISTENCY = json.loads((GOLDEN / "merkle_consistency.json").read_text())["vectors"]


def _b64(values: list[str] | None) -> list[bytes]:
    return [base64.b64decode(v) for v in values or []]


def _reference_reader():
    """The 8-leaf reference tree's complete-subtree hashes, as a hash reader."""
    nodes = [[bytes.fromhex(h) for h in level] for level in TREE["node_hashes_hex"]]
    return lambda level, index: nodes[level][index]


@pytest.mark.parametrize("case", TREE["hashing"], ids=lambda c: c["desc"])
def test_rfc6962_hashing(case):
    if case["kind"] == "empty":
        got = EMPTY_ROOT
    elif case["kind"] == "leaf":
        got = leaf_hash(case["input"].encode())
    else:
        got = node_hash(case["left"].encode(), case["right"].encode())
    assert got.hex() == case["want_hex"]


def test_reference_tree_leaves_nodes_and_roots():
    leaves = [bytes.fromhex(h) for h in TREE["leaf_inputs_hex"]]
    assert [leaf_hash(x).hex() for x in leaves] == TREE["node_hashes_hex"][0]
    read = _reference_reader()
    for size, root in enumerate(TREE["root_hashes_hex"]):
        assert tree_hash(size, read).hex() == root


@pytest.mark.parametrize("vector", TREE["inclusion_proofs_1_based"]["vectors"], ids=str)
def test_inclusion_proof_generation(vector):
    leaf, size, want = vector
    assert [h.hex() for h in inclusion_proof(leaf - 1, size, _reference_reader())] == want


@pytest.mark.parametrize("vector", TREE["consistency_proofs"], ids=str)
def test_consistency_proof_generation(vector):
    size1, size2, want = vector
    assert [h.hex() for h in consistency_proof(size1, size2, _reference_reader())] == want


def test_every_proof_of_the_reference_tree_verifies():
    read = _reference_reader()
    roots = [bytes.fromhex(h) for h in TREE["root_hashes_hex"]]
    for size in range(1, 9):
        for index in range(size):
            verify_inclusion(index, size, read(0, index), inclusion_proof(index, size, read), roots[size])
        for size1 in range(1, size + 1):
            verify_consistency(size1, size, consistency_proof(size1, size, read), roots[size1], roots[size])


@pytest.mark.parametrize("probe", INCLUSION, ids=lambda p: p["source"])
def test_inclusion_probes(probe):
    leaf = base64.b64decode(probe["leafHash"] or "")
    root = base64.b64decode(probe["root"] or "")
    index, size, proof = probe["leafIdx"], probe["treeSize"], _b64(probe["proof"])
    if probe["wantErr"]:
        with pytest.raises(ProofError):
            verify_inclusion(index, size, leaf, proof, root)
    else:
        verify_inclusion(index, size, leaf, proof, root)


@pytest.mark.parametrize("probe", CONSISTENCY, ids=lambda p: p["source"])
def test_consistency_probes(probe):
    roots = [base64.b64decode(probe["root1"] or ""), base64.b64decode(probe["root2"] or "")]
    args = (probe["size1"], probe["size2"], _b64(probe["proof"]), *roots)
    if probe["wantErr"]:
        with pytest.raises(ProofError):
            verify_consistency(*args)
    else:
        verify_consistency(*args)


def test_sumdb_note_signature_is_reproduced_and_verified():
    case = NOTES["sumdb_note"]
    signer = Signer.parse(case["signer_key"])
    assert str(signer.verifier) == case["verifier_key"]
    assert format_note(case["text"], [signer.sign(case["text"].encode())]) == case["signed"]
    text, signatures = parse_note(case["signed"] + case["other_signature_line"])
    peter, enoch = Verifier.parse(case["verifier_key"]), Verifier.parse(case["other_verifier_key"])
    assert text == case["text"]
    assert verified_signatures(text, signatures, [peter, enoch]) == [peter, enoch]
    assert verified_signatures(text, signatures, [enoch]) == [enoch]
    # A known key's line that does not verify makes the note malformed.
    forged = case["signed"].replace("ZJkuBS9", "ZJkuBS8")
    with pytest.raises(NoteError) as err:
        verified_signatures(*parse_note(forged), [peter])
    assert err.value.reason == "bad_signature"


@pytest.mark.parametrize("bad", NOTES["sumdb_note"]["bad_verifier_keys"])
def test_bad_verifier_keys_are_refused(bad):
    with pytest.raises(NoteError):
        Verifier.parse(bad)


def test_every_mangling_of_a_verifier_key_is_refused():
    good = NOTES["sumdb_note"]["verifier_key"]
    for i in range(len(good)):
        mangled = good[:i] + chr(ord(good[i]) + 1) + good[i + 1 :]
        with pytest.raises(NoteError):
            Verifier.parse(mangled)


def test_c2sp_signed_note_example():
    case = NOTES["c2sp_signed_note"]
    verifier = Verifier.parse(case["verifier_key"])
    assert verifier.public_key.hex() == case["public_key_hex"]
    assert verified_signatures(*parse_note(case["signed"]), [verifier]) == [verifier]


def test_a_real_sumdb_checkpoint():
    case = NOTES["sumdb_checkpoint"]
    verifier = Verifier.parse(case["verifier_key"])
    text, signatures = parse_note(case["signed"])
    assert verified_signatures(text, signatures, [verifier]) == [verifier]
    checkpoint = Checkpoint.parse(text)
    assert (checkpoint.origin, checkpoint.size) == (case["origin"], case["size"])
    assert checkpoint.text() == text
    tampered = case["signed"].replace("6476701", "6476702")
    with pytest.raises(NoteError):
        verified_signatures(*parse_note(tampered), [verifier])


def test_a_real_checkpoint_with_a_witness_cosignature_v1():
    case = NOTES["cosigned_checkpoint"]
    log, witness = Verifier.parse(case["log_verifier_key"]), Verifier.parse(case["witness_verifier_key"])
    assert witness.alg == 0x04
    text, signatures = parse_note(case["signed"])
    assert Checkpoint.parse(text).size == case["size"]
    assert verified_signatures(text, signatures, [log, witness]) == [log, witness]
    clobbered = case["signed"].replace(str(case["size"]), "42")
    with pytest.raises(NoteError):
        verified_signatures(*parse_note(clobbered), [witness])


def test_cosignature_timestamp():
    from tollgate_client.tlog.note import NoteSignature

    raw = base64.b64decode(NOTES["cosignature_timestamp"]["signature_base64"])
    sig = NoteSignature("w", int.from_bytes(raw[:4], "big"), raw[4:])
    assert cosignature_timestamp(sig) == NOTES["cosignature_timestamp"]["timestamp"]


@pytest.mark.parametrize("path", sorted(NOTES["tile_paths"]["valid"]))
def test_tile_paths(path):
    level, index, width = NOTES["tile_paths"]["valid"][path]
    assert parse_tile_path(path) == (level, index, width)
    assert tile_path(level, index, width) == path


@pytest.mark.parametrize("path", NOTES["tile_paths"]["invalid"])
def test_invalid_tile_paths(path):
    with pytest.raises(ValueError):
        parse_tile_path(path)


@pytest.mark.parametrize("case", NOTES["tiles_for_size"]["cases"], ids=lambda c: str(c["size"]))
def test_tiles_for_size(case):
    tiles = tiles_for_size(case["size"])
    full: dict[str, int] = {}
    partial: dict[str, int] = {}
    for level, _index, width in tiles:
        if width == 256:
            full[str(level)] = full.get(str(level), 0) + 1
        else:
            partial[str(level)] = width
    assert (full, partial) == (case["full"], case["partial"])


def _mth(leaves: list[bytes]) -> bytes:
    """MTH of RFC 9162 section 2.1.1, straight from its recursive definition."""
    if not leaves:
        return EMPTY_ROOT
    if len(leaves) == 1:
        return leaf_hash(leaves[0])
    k = 1 << ((len(leaves) - 1).bit_length() - 1)
    return node_hash(_mth(leaves[:k]), _mth(leaves[k:]))


def _path(m: int, leaves: list[bytes]) -> list[bytes]:
    if len(leaves) == 1:
        return []
    k = 1 << ((len(leaves) - 1).bit_length() - 1)
    if m < k:
        return [*_path(m, leaves[:k]), _mth(leaves[k:])]
    return [*_path(m - k, leaves[k:]), _mth(leaves[:k])]


def _subproof(m: int, leaves: list[bytes], complete: bool) -> list[bytes]:
    if m == len(leaves):
        return [] if complete else [_mth(leaves)]
    k = 1 << ((len(leaves) - 1).bit_length() - 1)
    if m <= k:
        return [*_subproof(m, leaves[:k], complete), _mth(leaves[k:])]
    return [*_subproof(m - k, leaves[k:], False), _mth(leaves[:k])]


def test_proofs_from_stored_hashes_match_the_rfc_definitions():
    """Every inclusion and consistency proof of every tree up to 40 leaves, against RFC 9162's recursion."""
    from tests.tlog_helpers import MemoryLog

    log = MemoryLog("gw.test/tlog/spn_Rfc")
    leaves: list[bytes] = []
    for size in range(1, 41):
        leaf = b"leaf %d" % size
        leaves.append(leaf)
        log.append(leaf)
        assert log.root() == _mth(leaves)
        for m in range(size):
            assert inclusion_proof(m, size, log.read) == _path(m, leaves)
        for m in range(1, size + 1):
            proof = consistency_proof(m, size, log.read)
            assert proof == _subproof(m, leaves, True)
            verify_consistency(m, size, proof, _mth(leaves[:m]), _mth(leaves))


def test_a_policy_names_a_log_whose_origin_is_not_its_key_name():
    """sum.golang.org signs checkpoints of the origin "go.sum database tree": {"origin", "key"} trusts it."""
    from tollgate_client.tlog import POLICY_FORMAT, Policy, verify_checkpoint_note

    case = NOTES["sumdb_checkpoint"]
    by_name = Policy.from_json({"format": POLICY_FORMAT, "logs": [case["verifier_key"]]})
    refused = verify_checkpoint_note(case["signed"], by_name)
    assert not isinstance(refused, tuple)
    assert refused.reason == "tlog_unknown_log"
    by_origin = Policy.from_json(
        {"format": POLICY_FORMAT, "logs": [{"origin": case["origin"], "key": case["verifier_key"]}]}
    )
    checked = verify_checkpoint_note(case["signed"], by_origin)
    assert isinstance(checked, tuple)
    assert (checked[0].size, checked[1]) == (case["size"], ())
    cosigned = NOTES["cosigned_checkpoint"]
    policy = Policy.from_json(
        {
            "format": POLICY_FORMAT,
            "logs": [cosigned["log_verifier_key"]],
            "witnesses": [cosigned["witness_verifier_key"]],
            "quorum": 1,
        }
    )
    checked = verify_checkpoint_note(cosigned["signed"], policy)
    assert isinstance(checked, tuple)
    assert checked[1] == ("remora.n621.de",)


def test_tiles_rebuild_every_stored_hash_and_bundles_round_trip():
    """Our tiles, read back through ``hash_reader_from_tiles``, give the same hashes, roots and proofs."""
    from tollgate_client.tlog import entry_bundle, hash_reader_from_tiles, parse_entry_bundle, tile_bytes

    from tests.tlog_helpers import MemoryLog

    log = MemoryLog("gw.test/tlog/spn_Tiles")
    for i in range(256 * 3 + 17):
        log.append(b"entry %d" % i)
    size = log.size
    tiles = {(level, index): tile_bytes(level, index, width, log.read) for level, index, width in tiles_for_size(size)}
    fetched: list[tuple[int, int, int]] = []

    def fetch(level: int, index: int, width: int) -> bytes:
        fetched.append((level, index, width))
        return tiles[(level, index)]

    read = hash_reader_from_tiles(size, fetch)
    for level, nodes in enumerate(log.levels):
        for index in range(len(nodes)):
            assert read(level, index) == nodes[index]
    assert tree_hash(size, read) == log.root()
    assert inclusion_proof(700, size, read) == inclusion_proof(700, size, log.read)
    assert consistency_proof(300, size, read) == consistency_proof(300, size, log.read)
    assert set(fetched) == set(tiles_for_size(size))  # each tile at its own width, each fetched once
    assert len(fetched) == len(set(fetched))
    bundle = entry_bundle(log.leaves[:256])
    assert parse_entry_bundle(bundle) == log.leaves[:256]
    with pytest.raises(ValueError):
        parse_entry_bundle(bundle[:-1])
    with pytest.raises(ValueError):
        hash_reader_from_tiles(size, lambda level, index, width: b"short")(0, 0)
