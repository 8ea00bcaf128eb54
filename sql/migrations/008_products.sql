-- The product catalog: the product ids the app sells or sold. Configuration, not a projection:
-- managed by API (PUT /v1/products/{productId}), CLI (ledger products) or SQL, and kept by
-- rebuilds. A retired product's orphans are never given a recovery order (they wait for
-- support: a later app version may have removed what they bought).
CREATE TABLE products (
    product_id text        PRIMARY KEY CHECK (length(product_id) BETWEEN 1 AND 128),
    status     text        NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'retired')),
    price      numeric     CHECK (price >= 0),
    currency   text        CHECK (currency ~ '^[A-Z]{3}$'),
    updated_at timestamptz NOT NULL DEFAULT now()
);

CREATE VIEW dashboards.products AS SELECT product_id, status, price, currency, updated_at FROM public.products;
GRANT SELECT ON dashboards.products TO ledger_reader;
