-- App Store Connect's daily sales reports (issue 42; docs/finance.md), kept as Apple sent them:
-- one record per day, version and revision (a day fetched again whose file changed is Apple's
-- restatement: a new revision; the same file changes nothing), and each line of a report with
-- every column by its header's name. The comparison with the ledger reads the latest revision.
CREATE TABLE apple_sales_reports (
    vendor_number text        NOT NULL,
    report_date   date        NOT NULL,
    version       text        NOT NULL,
    revision      integer     NOT NULL CHECK (revision > 0),
    -- `report`: a file; `no-sales`: Apple counted no sales that day (no file).
    outcome       text        NOT NULL CHECK (outcome IN ('report', 'no-sales')),
    -- The SHA-256 of the report's text (the file Apple sent, decompressed: a file compressed
    -- again differs in its gzip header alone); NULL for a day without sales.
    sha256        text        CHECK (sha256 ~ '^[0-9a-f]{64}$'),
    row_count     integer     NOT NULL CHECK (row_count >= 0),
    fetched_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (vendor_number, report_date, version, revision),
    CHECK ((outcome = 'report') = (sha256 IS NOT NULL))
);

CREATE TABLE apple_sales_rows (
    vendor_number     text    NOT NULL,
    report_date       date    NOT NULL,
    version           text    NOT NULL,
    revision          integer NOT NULL,
    line              integer NOT NULL,
    sku               text    NOT NULL,
    parent_identifier text    NOT NULL,
    product_type      text    NOT NULL,
    units             integer NOT NULL,
    country_code      text    NOT NULL,
    fields            jsonb   NOT NULL,
    PRIMARY KEY (vendor_number, report_date, version, revision, line),
    FOREIGN KEY (vendor_number, report_date, version, revision) REFERENCES apple_sales_reports
);

GRANT SELECT, INSERT ON apple_sales_reports, apple_sales_rows TO ledger_writer;
