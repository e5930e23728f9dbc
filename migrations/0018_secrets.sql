-- kodx schema, version 18: secrets kept by kodx for a repository (SPEC §12, "Egress by
-- name"; `kodx secret set|list|rm`). The value is sealed with ChaCha20-Poly1305 under the
-- deployment's key (`KODX_SECRETS_KEY`, or `secrets.key` in `KODX_DATA_DIR`), the
-- repository and the name as associated data; `key_id` names the key (the first 8 bytes
-- of its SHA-256) so a process with another key says so instead of decrypting. Nonce and
-- ciphertext are base64 text on both backends.
CREATE TABLE secrets (
    repo        TEXT NOT NULL,
    name        TEXT NOT NULL,
    key_id      TEXT NOT NULL,
    nonce       TEXT NOT NULL,
    ciphertext  TEXT NOT NULL,
    created_at  BIGINT NOT NULL,
    updated_at  BIGINT NOT NULL,
    PRIMARY KEY (repo, name)
);
