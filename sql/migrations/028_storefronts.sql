-- Each Apple transaction's storefront, and Apple's sales compared per storefront country too
-- (issue 42; docs/finance.md, "The comparison").
--
-- A signed transaction names its storefront's country ISO 3166-1 alpha-3 (`USA`); a legacy
-- receipt does not say, and neither did the ledger before this migration (the log holds no
-- storefront for those rows: they stay NULL). Apple's sales reports name the country alpha-2.
ALTER TABLE apple_transactions ADD COLUMN storefront text CHECK (storefront ~ '^[A-Z]{3}$');

-- ISO 3166-1's countries, alpha-3 to alpha-2, and Apple's storefront for Kosovo (XKS, XK), which
-- ISO does not assign.
CREATE TABLE storefront_countries (
    alpha3 text PRIMARY KEY CHECK (alpha3 ~ '^[A-Z]{3}$'),
    alpha2 text NOT NULL UNIQUE CHECK (alpha2 ~ '^[A-Z]{2}$')
);
INSERT INTO storefront_countries (alpha3, alpha2) VALUES
    ('ABW', 'AW'), ('AFG', 'AF'), ('AGO', 'AO'), ('AIA', 'AI'), ('ALA', 'AX'), ('ALB', 'AL'),
    ('AND', 'AD'), ('ARE', 'AE'), ('ARG', 'AR'), ('ARM', 'AM'), ('ASM', 'AS'), ('ATA', 'AQ'),
    ('ATF', 'TF'), ('ATG', 'AG'), ('AUS', 'AU'), ('AUT', 'AT'), ('AZE', 'AZ'), ('BDI', 'BI'),
    ('BEL', 'BE'), ('BEN', 'BJ'), ('BES', 'BQ'), ('BFA', 'BF'), ('BGD', 'BD'), ('BGR', 'BG'),
    ('BHR', 'BH'), ('BHS', 'BS'), ('BIH', 'BA'), ('BLM', 'BL'), ('BLR', 'BY'), ('BLZ', 'BZ'),
    ('BMU', 'BM'), ('BOL', 'BO'), ('BRA', 'BR'), ('BRB', 'BB'), ('BRN', 'BN'), ('BTN', 'BT'),
    ('BVT', 'BV'), ('BWA', 'BW'), ('CAF', 'CF'), ('CAN', 'CA'), ('CCK', 'CC'), ('CHE', 'CH'),
    ('CHL', 'CL'), ('CHN', 'CN'), ('CIV', 'CI'), ('CMR', 'CM'), ('COD', 'CD'), ('COG', 'CG'),
    ('COK', 'CK'), ('COL', 'CO'), ('COM', 'KM'), ('CPV', 'CV'), ('CRI', 'CR'), ('CUB', 'CU'),
    ('CUW', 'CW'), ('CXR', 'CX'), ('CYM', 'KY'), ('CYP', 'CY'), ('CZE', 'CZ'), ('DEU', 'DE'),
    ('DJI', 'DJ'), ('DMA', 'DM'), ('DNK', 'DK'), ('DOM', 'DO'), ('DZA', 'DZ'), ('ECU', 'EC'),
    ('EGY', 'EG'), ('ERI', 'ER'), ('ESH', 'EH'), ('ESP', 'ES'), ('EST', 'EE'), ('ETH', 'ET'),
    ('FIN', 'FI'), ('FJI', 'FJ'), ('FLK', 'FK'), ('FRA', 'FR'), ('FRO', 'FO'), ('FSM', 'FM'),
    ('GAB', 'GA'), ('GBR', 'GB'), ('GEO', 'GE'), ('GGY', 'GG'), ('GHA', 'GH'), ('GIB', 'GI'),
    ('GIN', 'GN'), ('GLP', 'GP'), ('GMB', 'GM'), ('GNB', 'GW'), ('GNQ', 'GQ'), ('GRC', 'GR'),
    ('GRD', 'GD'), ('GRL', 'GL'), ('GTM', 'GT'), ('GUF', 'GF'), ('GUM', 'GU'), ('GUY', 'GY'),
    ('HKG', 'HK'), ('HMD', 'HM'), ('HND', 'HN'), ('HRV', 'HR'), ('HTI', 'HT'), ('HUN', 'HU'),
    ('IDN', 'ID'), ('IMN', 'IM'), ('IND', 'IN'), ('IOT', 'IO'), ('IRL', 'IE'), ('IRN', 'IR'),
    ('IRQ', 'IQ'), ('ISL', 'IS'), ('ISR', 'IL'), ('ITA', 'IT'), ('JAM', 'JM'), ('JEY', 'JE'),
    ('JOR', 'JO'), ('JPN', 'JP'), ('KAZ', 'KZ'), ('KEN', 'KE'), ('KGZ', 'KG'), ('KHM', 'KH'),
    ('KIR', 'KI'), ('KNA', 'KN'), ('KOR', 'KR'), ('KWT', 'KW'), ('LAO', 'LA'), ('LBN', 'LB'),
    ('LBR', 'LR'), ('LBY', 'LY'), ('LCA', 'LC'), ('LIE', 'LI'), ('LKA', 'LK'), ('LSO', 'LS'),
    ('LTU', 'LT'), ('LUX', 'LU'), ('LVA', 'LV'), ('MAC', 'MO'), ('MAF', 'MF'), ('MAR', 'MA'),
    ('MCO', 'MC'), ('MDA', 'MD'), ('MDG', 'MG'), ('MDV', 'MV'), ('MEX', 'MX'), ('MHL', 'MH'),
    ('MKD', 'MK'), ('MLI', 'ML'), ('MLT', 'MT'), ('MMR', 'MM'), ('MNE', 'ME'), ('MNG', 'MN'),
    ('MNP', 'MP'), ('MOZ', 'MZ'), ('MRT', 'MR'), ('MSR', 'MS'), ('MTQ', 'MQ'), ('MUS', 'MU'),
    ('MWI', 'MW'), ('MYS', 'MY'), ('MYT', 'YT'), ('NAM', 'NA'), ('NCL', 'NC'), ('NER', 'NE'),
    ('NFK', 'NF'), ('NGA', 'NG'), ('NIC', 'NI'), ('NIU', 'NU'), ('NLD', 'NL'), ('NOR', 'NO'),
    ('NPL', 'NP'), ('NRU', 'NR'), ('NZL', 'NZ'), ('OMN', 'OM'), ('PAK', 'PK'), ('PAN', 'PA'),
    ('PCN', 'PN'), ('PER', 'PE'), ('PHL', 'PH'), ('PLW', 'PW'), ('PNG', 'PG'), ('POL', 'PL'),
    ('PRI', 'PR'), ('PRK', 'KP'), ('PRT', 'PT'), ('PRY', 'PY'), ('PSE', 'PS'), ('PYF', 'PF'),
    ('QAT', 'QA'), ('REU', 'RE'), ('ROU', 'RO'), ('RUS', 'RU'), ('RWA', 'RW'), ('SAU', 'SA'),
    ('SDN', 'SD'), ('SEN', 'SN'), ('SGP', 'SG'), ('SGS', 'GS'), ('SHN', 'SH'), ('SJM', 'SJ'),
    ('SLB', 'SB'), ('SLE', 'SL'), ('SLV', 'SV'), ('SMR', 'SM'), ('SOM', 'SO'), ('SPM', 'PM'),
    ('SRB', 'RS'), ('SSD', 'SS'), ('STP', 'ST'), ('SUR', 'SR'), ('SVK', 'SK'), ('SVN', 'SI'),
    ('SWE', 'SE'), ('SWZ', 'SZ'), ('SXM', 'SX'), ('SYC', 'SC'), ('SYR', 'SY'), ('TCA', 'TC'),
    ('TCD', 'TD'), ('TGO', 'TG'), ('THA', 'TH'), ('TJK', 'TJ'), ('TKL', 'TK'), ('TKM', 'TM'),
    ('TLS', 'TL'), ('TON', 'TO'), ('TTO', 'TT'), ('TUN', 'TN'), ('TUR', 'TR'), ('TUV', 'TV'),
    ('TWN', 'TW'), ('TZA', 'TZ'), ('UGA', 'UG'), ('UKR', 'UA'), ('UMI', 'UM'), ('URY', 'UY'),
    ('USA', 'US'), ('UZB', 'UZ'), ('VAT', 'VA'), ('VCT', 'VC'), ('VEN', 'VE'), ('VGB', 'VG'),
    ('VIR', 'VI'), ('VNM', 'VN'), ('VUT', 'VU'), ('WLF', 'WF'), ('WSM', 'WS'), ('XKS', 'XK'),
    ('YEM', 'YE'), ('ZAF', 'ZA'), ('ZMB', 'ZM'), ('ZWE', 'ZW');
GRANT SELECT ON storefront_countries TO ledger_reader, ledger_writer;

-- Each report line's every column apart from the columns the comparison reads, so that a month
-- of the comparison reads narrow rows (a line's columns by name are some 700 bytes; the rest, 60).
CREATE TABLE apple_sales_fields (
    vendor_number text    NOT NULL,
    report_date   date    NOT NULL,
    version       text    NOT NULL,
    revision      integer NOT NULL,
    line          integer NOT NULL,
    fields        jsonb   NOT NULL,
    -- Written with its line of apple_sales_rows, in the same transaction (no foreign key: its
    -- check would cost a lookup per line).
    PRIMARY KEY (vendor_number, report_date, version, revision, line)
);
INSERT INTO apple_sales_fields (vendor_number, report_date, version, revision, line, fields)
    SELECT vendor_number, report_date, version, revision, line, fields FROM apple_sales_rows;
ALTER TABLE apple_sales_rows DROP COLUMN fields;
GRANT SELECT, INSERT ON apple_sales_fields TO ledger_writer;

-- What the history sweep found where Apple counted more purchases of a product on a day than
-- the ledger saw (docs/finance.md, "Differences act"): the latest sweep of each day, app and
-- product, of the users with open orders of that product from that day.
CREATE TABLE apple_sales_sweeps (
    day        date        NOT NULL,
    bundle_id  text        NOT NULL,  -- '' in a ledger that holds no app
    product_id text        NOT NULL,
    swept_at   timestamptz NOT NULL,
    -- Apple's purchases less the ledger's before the sweep, in every country of the day.
    missing    integer     NOT NULL CHECK (missing > 0),
    users      integer     NOT NULL CHECK (users >= 0),
    accounts   integer     NOT NULL CHECK (accounts >= 0),
    -- Transactions the sweep ingested that the ledger did not know (tied to orders or pooled),
    -- and those it could not read (Apple failed or refused).
    found      integer     NOT NULL CHECK (found >= 0),
    failed     integer     NOT NULL CHECK (failed >= 0),
    PRIMARY KEY (day, bundle_id, product_id)
);
GRANT SELECT, INSERT, UPDATE ON apple_sales_sweeps TO ledger_writer;

-- The refunds the comparison counts, found without reading the whole log (refunds are few).
CREATE INDEX events_refunded ON events (stream_id) WHERE type = 'refunded';

DROP VIEW dashboards.apple_sales;
DROP FUNCTION ledger_apple_sales(date, date);

-- 027's comparison, per storefront country too: per day (the report's, in Pacific time as Apple
-- counts), app, product and country, production only, Apple's units (purchases; refunds are its
-- negative units) from the latest revision of each day's report beside the ledger's purchases
-- (transactions tied to orders, subscription renewals), each order counting its quantity, and
-- refunds (order refunds, by their revocation date). A ledger row whose storefront the ledger
-- does not know has no country; Apple's rows of that product and day that it may explain say so.
-- A report line names its app by `Parent Identifier` (the app's SKU); a line without one (an
-- app's own download) is not an in-app purchase. `sweep`: what the latest sweep for the row's
-- day, app and product found (apple_sales_sweeps), '' when none ran.
CREATE FUNCTION ledger_apple_sales(p_from date, p_to date)
RETURNS TABLE (day date, bundle_id text, product_id text, country text, apple_purchases integer, ledger_purchases integer,
               apple_refunds integer, ledger_refunds integer, cause text, next_step text, sweep text)
-- SECURITY DEFINER: dashboards.apple_sales calls it for ledger_reader, who reads no table here
-- (EXECUTE is granted below to the ledger's roles alone, not to PUBLIC).
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = public, pg_temp AS $fn$
    -- Every side is keyed by day, app, product and country with '' for an unknown app or
    -- country, so that each join is on plain equality (hashed) and each row is joined once.
    WITH latest AS (
        -- Each day's latest fetch (its revision of the version fetched last).
        SELECT DISTINCT ON (r.vendor_number, r.report_date) r.vendor_number, r.report_date, r.version, r.revision
          FROM apple_sales_reports r
         WHERE r.report_date BETWEEN p_from AND p_to
         ORDER BY r.vendor_number, r.report_date, r.fetched_at DESC, r.revision DESC
    ), reported AS (
        SELECT DISTINCT l.report_date AS day FROM latest l
    ), apple AS (
        SELECT s.report_date AS day, a.bundle_id, s.sku AS product_id, s.country_code AS country,
               sum(greatest(s.units, 0))::integer AS apple_purchases, sum(greatest(-s.units, 0))::integer AS apple_refunds
          FROM latest l
          JOIN apple_sales_rows s ON s.vendor_number = l.vendor_number AND s.report_date = l.report_date
                                 AND s.version = l.version AND s.revision = l.revision
          JOIN apps a ON a.sku = s.parent_identifier
         WHERE s.parent_identifier <> ''
         GROUP BY 1, 2, 3, 4
    ), bought AS (
        SELECT (t.purchase_date AT TIME ZONE 'America/Los_Angeles')::date AS day, t.bundle_id, t.product_id, t.storefront,
               o.quantity AS n
          FROM apple_transactions t JOIN orders o ON o.order_id = t.order_id
         WHERE coalesce(t.environment, 'Production') = 'Production'
           AND t.purchase_date >= (p_from::timestamp AT TIME ZONE 'America/Los_Angeles')
           AND t.purchase_date < ((p_to + 1)::timestamp AT TIME ZONE 'America/Los_Angeles')
        UNION ALL
        -- A renewal's storefront: its own transaction's, else its subscription's first.
        SELECT (p.purchase_date AT TIME ZONE 'America/Los_Angeles')::date, s.bundle_id, p.product_id,
               coalesce((SELECT x.storefront FROM apple_transactions x WHERE x.transaction_id = p.transaction_id),
                        (SELECT x.storefront FROM apple_transactions x WHERE x.transaction_id = p.original_transaction_id)),
               1
          FROM subscription_periods p JOIN subscriptions s ON s.original_transaction_id = p.original_transaction_id
         WHERE p.kind = 'subscription-renewal' AND NOT s.family_shared AND s.environment = 'Production'
           AND p.purchase_date >= (p_from::timestamp AT TIME ZONE 'America/Los_Angeles')
           AND p.purchase_date < ((p_to + 1)::timestamp AT TIME ZONE 'America/Los_Angeles')
    ), purchases AS (
        SELECT b.day, coalesce(b.bundle_id, '') AS bundle_id, b.product_id, coalesce(c.alpha2, '') AS country,
               sum(b.n)::integer AS ledger_purchases
          FROM bought b LEFT JOIN storefront_countries c ON c.alpha3 = b.storefront
         GROUP BY 1, 2, 3, 4
    ), refunds AS (
        SELECT ((e.data->>'revocationDate')::timestamptz AT TIME ZONE 'America/Los_Angeles')::date AS day,
               coalesce(o.bundle_id, '') AS bundle_id, o.product_id, coalesce(c.alpha2, '') AS country,
               sum(o.quantity)::integer AS ledger_refunds
          FROM events e
          JOIN orders o ON e.stream_id = 'order-' || o.order_id
          JOIN apple_transactions t ON t.transaction_id = o.transaction_id
          LEFT JOIN storefront_countries c ON c.alpha3 = t.storefront
         WHERE e.type = 'refunded' AND coalesce(t.environment, 'Production') = 'Production'
           AND coalesce(e.data->>'revocationType', '') <> 'FAMILY_REVOKE'
           AND ((e.data->>'revocationDate')::timestamptz AT TIME ZONE 'America/Los_Angeles')::date BETWEEN p_from AND p_to
         GROUP BY 1, 2, 3, 4
    ), together AS (
        SELECT day, bundle_id, product_id, country,
               coalesce(apple_purchases, 0) AS apple_purchases, coalesce(ledger_purchases, 0) AS ledger_purchases,
               coalesce(apple_refunds, 0) AS apple_refunds, coalesce(ledger_refunds, 0) AS ledger_refunds
          FROM apple FULL JOIN purchases USING (day, bundle_id, product_id, country)
                     FULL JOIN refunds USING (day, bundle_id, product_id, country)
    ), judged AS (
        -- Each row with its product's day: whether the ledger holds rows of it without a
        -- storefront, and whether the day agrees once those are counted.
        SELECT t.*, r.day IS NOT NULL AS reported,
               bool_or(t.country = '') OVER w AS unplaced,
               sum(t.apple_purchases) OVER w = sum(t.ledger_purchases) OVER w
                   AND sum(t.apple_refunds) OVER w = sum(t.ledger_refunds) OVER w AS day_agrees
          FROM together t LEFT JOIN reported r ON r.day = t.day
        WINDOW w AS (PARTITION BY t.day, t.bundle_id, t.product_id)
    )
    SELECT j.day, nullif(j.bundle_id, ''), j.product_id, nullif(j.country, ''), j.apple_purchases, j.ledger_purchases,
           j.apple_refunds, j.ledger_refunds,
           CASE WHEN NOT j.reported THEN 'no report of Apple''s for the day yet'
                WHEN j.country = '' THEN 'sales the ledger holds without a storefront (legacy receipts, imports)'
                WHEN j.apple_purchases = j.ledger_purchases AND j.apple_refunds = j.ledger_refunds THEN 'agrees'
                WHEN j.unplaced AND j.day_agrees THEN 'sales the ledger holds without a storefront account for it'
                WHEN j.apple_purchases > j.ledger_purchases THEN 'purchases Apple counted that the ledger never saw'
                WHEN j.ledger_purchases > j.apple_purchases THEN 'purchases the ledger holds that Apple did not count'
                WHEN j.apple_refunds > j.ledger_refunds THEN 'refunds Apple counted that the ledger did not record'
                ELSE 'refunds the ledger recorded that Apple did not count' END,
           CASE WHEN NOT j.reported THEN 'ledger sales fetch'
                WHEN j.country = '' AND j.day_agrees THEN ''
                WHEN j.country = '' THEN 'compare the product''s day across its storefronts'
                WHEN j.apple_purchases = j.ledger_purchases AND j.apple_refunds = j.ledger_refunds THEN ''
                WHEN j.unplaced AND j.day_agrees THEN ''
                WHEN j.apple_purchases > j.ledger_purchases THEN 'recover: a history sweep of the users with open orders of the product (run after each fetch; ledger sales sweep)'
                WHEN j.ledger_purchases > j.apple_purchases THEN 'check for sandbox or test purchases counted as production, or fraud'
                WHEN j.apple_refunds > j.ledger_refunds THEN 'refund catch-up (ledger backfill refunds)'
                ELSE 'check the refund''s date: Apple may count it on another day' END,
           CASE WHEN w.day IS NULL THEN ''
                ELSE format('swept %s user(s), %s Apple account(s) at %s: %s transaction(s) new to the ledger%s',
                            w.users, w.accounts, to_char(w.swept_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI"Z"'), w.found,
                            CASE WHEN w.failed > 0 THEN format(', %s account(s) not read', w.failed) ELSE '' END) END
      FROM judged j
      LEFT JOIN apple_sales_sweeps w ON w.day = j.day AND w.bundle_id = j.bundle_id AND w.product_id = j.product_id
     ORDER BY j.day, j.bundle_id, j.product_id, j.country = '', j.country
$fn$;
REVOKE EXECUTE ON FUNCTION ledger_apple_sales(date, date) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION ledger_apple_sales(date, date) TO ledger_reader, ledger_writer;

-- Every day the ledger has sales or Apple's reports for.
CREATE VIEW dashboards.apple_sales AS
    SELECT * FROM public.ledger_apple_sales('-infinity'::date, 'infinity'::date);
GRANT SELECT ON dashboards.apple_sales TO ledger_reader;
