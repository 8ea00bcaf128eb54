-- Keys are scoped to apps (issue 39, "Keys are scoped to apps"): a key names the apps it may
-- reach (`ledger keys create --apps A,B`), or none, and then reaches every app, those added
-- later too. A key limited to some apps reads, appends to and lists only their orders and rows
-- (docs/operations.md, "API keys and apps"). The bundle ids are stored as the apps table spells
-- them, so queries compare them with `=`; apps are never deleted (only retired), so a key's apps
-- stay apps.
ALTER TABLE api_keys
    ADD COLUMN apps text[] CHECK (cardinality(apps) > 0 AND array_position(apps, NULL) IS NULL);
