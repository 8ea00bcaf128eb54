-- Apps are data (#39): the apps the ledger serves, one row per bundle id, managed by
-- `ledger apps add|set`, `POST /v1/apps` and `PATCH /v1/apps/{bundleId}`, and the app the
-- `LEDGER_APPLE_*` settings describe, created or updated at start (docs/apps.md). Configuration,
-- not projections: a rebuild keeps them.

-- An app: its bundle id (Apple's rule: letters, digits, hyphens and periods; here starting with
-- a letter or digit, as a reverse-DNS name does; Apple holds bundle ids case-insensitive, so two
-- spellings of one are one app), its Apple app id (Apple's verifier needs it for
-- Production-signed data), the environments whose signed data it accepts, the refund it would
-- have Apple grant when a product says nothing, and whether it is retired.
CREATE TABLE apps (
    bundle_id         text        PRIMARY KEY CHECK (bundle_id ~ '^[A-Za-z0-9][A-Za-z0-9.-]{0,127}$'),
    app_apple_id      bigint      CHECK (app_apple_id > 0),
    environments      text[]      NOT NULL DEFAULT ARRAY['Production', 'Sandbox']
                                  CHECK (cardinality(environments) > 0 AND environments <@ ARRAY['Production', 'Sandbox']),
    refund_preference text        CHECK (refund_preference IN ('DECLINE', 'GRANT_FULL', 'GRANT_PRORATED')),
    retired           boolean     NOT NULL DEFAULT false,
    created_at        timestamptz NOT NULL DEFAULT now(),
    updated_at        timestamptz NOT NULL DEFAULT now()
);
CREATE UNIQUE INDEX apps_bundle_id_folded ON apps (lower(bundle_id));

-- An app's secrets, apart from the app so that no grant on `apps` or view of it reaches them:
-- the legacy shared secret (verifyReceipt) and the App Store Server API key. The key is its
-- issuer id, key id and private key, all or none; the private key is either stored here (the
-- `.p8` file's PEM text) or named by a reference read where it is used (`env:NAME`, an
-- environment variable of the ledger's process; `file:PATH`, a file on its machine). Only the
-- owner and the service's role (docs/operations.md) read this table; ledger_reader and
-- ledger_writer get nothing of it.
CREATE TABLE app_credentials (
    bundle_id           text        PRIMARY KEY REFERENCES apps (bundle_id),
    shared_secret       text        CHECK (length(shared_secret) BETWEEN 1 AND 256),
    api_issuer_id       text        CHECK (length(api_issuer_id) BETWEEN 1 AND 128),
    api_key_id          text        CHECK (length(api_key_id) BETWEEN 1 AND 128),
    api_private_key     text        CHECK (length(api_private_key) BETWEEN 1 AND 16384),
    api_private_key_ref text        CHECK (api_private_key_ref ~ '^(env:[A-Za-z_][A-Za-z0-9_]*|file:.+)$' AND length(api_private_key_ref) <= 1029),
    updated_at          timestamptz NOT NULL DEFAULT now(),
    CHECK ((api_issuer_id IS NULL AND api_key_id IS NULL AND api_private_key IS NULL AND api_private_key_ref IS NULL)
        OR (api_issuer_id IS NOT NULL AND api_key_id IS NOT NULL AND (api_private_key IS NULL) <> (api_private_key_ref IS NULL)))
);

REVOKE ALL ON apps, app_credentials FROM PUBLIC;
REVOKE ALL ON apps, app_credentials FROM ledger_reader, ledger_writer;

-- What dashboards may know of the apps: whether each has a shared secret and a key, never them.
CREATE VIEW dashboards.apps AS
    SELECT a.bundle_id, a.app_apple_id, a.environments, a.refund_preference, a.retired,
           c.shared_secret IS NOT NULL AS has_shared_secret, c.api_key_id IS NOT NULL AS has_api_key,
           a.created_at, a.updated_at
      FROM public.apps a
      LEFT JOIN public.app_credentials c ON c.bundle_id = a.bundle_id;
GRANT SELECT ON dashboards.apps TO ledger_reader;
