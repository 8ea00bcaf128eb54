-- Imported history (issue 41; docs/import.md). An imported event is recorded when it is
-- imported, but happened long before: its metadata says when (`importedFrom.at`). The reports
-- date an event by this time, so finance's report shows a history on its own days, not on the
-- day it was imported.
CREATE FUNCTION event_time(p_recorded_at timestamptz, p_metadata jsonb) RETURNS timestamptz
LANGUAGE sql STABLE PARALLEL SAFE AS $fn$
    SELECT coalesce((p_metadata->'importedFrom'->>'at')::timestamptz, p_recorded_at)
$fn$;
