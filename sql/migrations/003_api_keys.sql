-- API keys: only a SHA-256 of each key is stored; the key itself is shown once, at creation.
CREATE TABLE api_keys (
    name       text        PRIMARY KEY CHECK (length(name) BETWEEN 1 AND 128),
    key_hash   text        NOT NULL UNIQUE,
    scopes     text[]      NOT NULL CHECK (scopes <@ ARRAY['append', 'read', 'admin'] AND cardinality(scopes) > 0),
    created_at timestamptz NOT NULL DEFAULT now(),
    revoked_at timestamptz
);
