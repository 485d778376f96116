"""A transparency log's formats and proofs: RFC 6962 Merkle trees and the C2SP tlog documents.

Pure functions and small value types, shared by the gateway's log and by anyone checking it:

- :mod:`.merkle`: leaf and node hashing, inclusion and consistency proofs computed from stored
  hashes (``read(level, index)``), and their verification;
- :mod:`.note`: ``signed-note`` keys, signatures and ``cosignature/v1``;
- :mod:`.checkpoint`: ``tlog-checkpoint`` bodies, ``tlog-proof@v1`` documents and the origin line
  of a tenant's log;
- :mod:`.tiles`: ``tlog-tiles`` paths, tile bytes, entry bundles and a hash reader over tiles;
- :mod:`.policy`: the offline verifier's trust policy and the check of a receipt's proof.

Imports nothing of the gateway; needs only ``cryptography``.
"""

from tollgate_client.tlog.checkpoint import PROOF_HEADER, Checkpoint, TlogProof, log_origin, tenant_of_origin
from tollgate_client.tlog.merkle import (
    EMPTY_ROOT,
    HashReader,
    ProofError,
    consistency_proof,
    inclusion_proof,
    leaf_hash,
    node_hash,
    root_from_inclusion_proof,
    subtree_hash,
    tree_hash,
    verify_consistency,
    verify_inclusion,
)
from tollgate_client.tlog.note import (
    ALG_COSIGNATURE_V1,
    ALG_ED25519,
    Cosigner,
    NoteError,
    NoteSignature,
    Signer,
    Verifier,
    format_note,
    generate_signer,
    key_id,
    parse_note,
    verified_signatures,
)
from tollgate_client.tlog.policy import (
    POLICY_FORMAT,
    Policy,
    TransparencyVerdict,
    verify_checkpoint_note,
    verify_transparency,
)
from tollgate_client.tlog.tiles import (
    TILE_HEIGHT,
    TILE_WIDTH,
    entry_bundle,
    hash_reader_from_tiles,
    parse_entry_bundle,
    parse_tile_path,
    tile_bytes,
    tile_path,
    tiles_for_size,
)

__all__ = [
    "ALG_COSIGNATURE_V1",
    "ALG_ED25519",
    "EMPTY_ROOT",
    "POLICY_FORMAT",
    "PROOF_HEADER",
    "TILE_HEIGHT",
    "TILE_WIDTH",
    "Checkpoint",
    "Cosigner",
    "HashReader",
    "NoteError",
    "NoteSignature",
    "Policy",
    "ProofError",
    "Signer",
    "TlogProof",
    "TransparencyVerdict",
    "Verifier",
    "consistency_proof",
    "entry_bundle",
    "format_note",
    "generate_signer",
    "hash_reader_from_tiles",
    "inclusion_proof",
    "key_id",
    "leaf_hash",
    "log_origin",
    "node_hash",
    "parse_entry_bundle",
    "parse_note",
    "parse_tile_path",
    "root_from_inclusion_proof",
    "subtree_hash",
    "tenant_of_origin",
    "tile_bytes",
    "tile_path",
    "tiles_for_size",
    "tree_hash",
    "verified_signatures",
    "verify_checkpoint_note",
    "verify_consistency",
    "verify_inclusion",
    "verify_transparency",
]
