-- The event log: one append-only table for every stream, and the function that appends to it.
--
-- Global positions are derived from the writing transaction's id: position = xid * 4096 + n,
-- where n counts the events that transaction appended (at most 4096). Ordering by position is
-- therefore ordering by (transaction id, order of appending), and a reader that only returns
-- events of transactions older than its snapshot's xmin can never pass a position that a
-- still-running transaction holds: every such transaction has an xid >= xmin, so all of its
-- positions are above everything the reader returned (docs/architecture.md, "The gap-safe feed").

CREATE TABLE events (
    global_position bigint      NOT NULL,
    stream_id       text        NOT NULL,
    stream_version  bigint      NOT NULL,
    event_id        uuid        NOT NULL,
    type            text        NOT NULL,
    data            jsonb       NOT NULL,
    metadata        jsonb       NOT NULL DEFAULT '{}'::jsonb,
    recorded_at     timestamptz NOT NULL DEFAULT now(),
    transaction_id  xid8        NOT NULL DEFAULT pg_current_xact_id(),
    CONSTRAINT events_pkey PRIMARY KEY (global_position),
    CONSTRAINT events_event_id_key UNIQUE (event_id),
    CONSTRAINT events_stream_version_key UNIQUE (stream_id, stream_version),
    CONSTRAINT events_stream_id_length CHECK (length(stream_id) BETWEEN 1 AND 256),
    CONSTRAINT events_type_length CHECK (length(type) BETWEEN 1 AND 128),
    CONSTRAINT events_stream_version_non_negative CHECK (stream_version >= 0),
    CONSTRAINT events_position_of_transaction
        CHECK ((global_position >> 12) = transaction_id::text::bigint)
);

COMMENT ON TABLE events IS 'Append-only event log of Order Ledger; never updated or deleted.';
COMMENT ON COLUMN events.global_position IS 'transaction id * 4096 + ordinal: increasing in commit-visible order for gap-safe readers';
COMMENT ON COLUMN events.transaction_id IS 'xid8 of the writing transaction, compared with pg_snapshot_xmin by readers';

-- Append-only, enforced for every role including the owner.
CREATE FUNCTION events_append_only() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    RAISE EXCEPTION 'the event log is append-only: % on % is not allowed', TG_OP, TG_TABLE_NAME
        USING ERRCODE = 'LE010', HINT = 'append a new event instead';
END
$fn$;

CREATE TRIGGER events_no_update_or_delete
    BEFORE UPDATE OR DELETE ON events
    FOR EACH STATEMENT EXECUTE FUNCTION events_append_only();

CREATE TRIGGER events_no_truncate
    BEFORE TRUNCATE ON events
    FOR EACH STATEMENT EXECUTE FUNCTION events_append_only();

-- Appends a batch of events to one stream in the caller's transaction.
--
-- p_expected_version: NULL = any version, -1 = the stream must not exist, n >= 0 = the stream's
-- last version must be n. The batch comes as parallel arrays (ids, types, bodies, metadata).
-- Errors (SQLSTATE): LE001 wrong expected version (DETAIL = current version, -1 for no stream),
-- LE002 an event id already used with a different body (DETAIL = that event id),
-- LE003 an invalid batch (empty, too large, arrays of unequal length, repeated event id).
-- A batch whose every event id is already stored with the same stream, type and data is a
-- replay: nothing is appended and the original versions and positions are returned.
--
-- The common case (new events) runs four statements: lock, one index probe per id, one query for
-- both the stream version and the transaction's next position, the insert.
CREATE FUNCTION append_events(
    p_stream_id text, p_expected_version bigint,
    p_event_ids uuid[], p_types text[], p_data jsonb[], p_metadata jsonb[])
RETURNS TABLE (r_event_id uuid, r_stream_version bigint, r_global_position bigint, r_replayed boolean)
LANGUAGE plpgsql AS $fn$
DECLARE
    -- Taking the xid before any position is what makes positions follow transaction ids.
    v_xid     bigint := pg_current_xact_id()::text::bigint;
    v_count   integer := coalesce(cardinality(p_event_ids), 0);
    v_current bigint;
    v_next    bigint;
BEGIN
    IF v_count = 0 OR v_count > 4096 THEN
        RAISE EXCEPTION 'a batch holds 1 to 4096 events, not %', v_count USING ERRCODE = 'LE003';
    END IF;
    IF coalesce(cardinality(p_types), 0) <> v_count OR coalesce(cardinality(p_data), 0) <> v_count
       OR coalesce(cardinality(p_metadata), 0) <> v_count THEN
        RAISE EXCEPTION 'ids, types, data and metadata must have one entry per event' USING ERRCODE = 'LE003';
    END IF;
    IF v_count > 1 AND (SELECT count(DISTINCT id) FROM unnest(p_event_ids) AS id) <> v_count THEN
        RAISE EXCEPTION 'an event id appears twice in one batch' USING ERRCODE = 'LE003';
    END IF;

    -- One writer per stream at a time; writers of other streams never wait.
    PERFORM pg_advisory_xact_lock(hashtextextended(p_stream_id, 0));

    IF EXISTS (SELECT 1 FROM events s WHERE s.event_id = ANY (p_event_ids)) THEN
        RETURN QUERY SELECT * FROM append_events_replay(p_stream_id, p_event_ids, p_types, p_data);
        RETURN;
    END IF;

    SELECT coalesce((SELECT max(s.stream_version) FROM events s WHERE s.stream_id = p_stream_id), -1),
           coalesce((SELECT max(s.global_position) + 1 FROM events s
                      WHERE s.global_position >= (v_xid << 12) AND s.global_position < ((v_xid + 1) << 12)),
                    v_xid << 12)
      INTO v_current, v_next;
    IF p_expected_version IS NOT NULL AND p_expected_version <> v_current THEN
        RAISE EXCEPTION 'stream % is at version %, not the expected %', p_stream_id, v_current, p_expected_version
            USING ERRCODE = 'LE001', DETAIL = v_current::text;
    END IF;
    IF v_next + v_count > ((v_xid + 1) << 12) THEN
        RAISE EXCEPTION 'one database transaction appends at most 4096 events' USING ERRCODE = 'LE003';
    END IF;

    RETURN QUERY
        INSERT INTO events (global_position, stream_id, stream_version, event_id, type, data, metadata, transaction_id)
        SELECT v_next + x.ord - 1, p_stream_id, v_current + x.ord, x.id, x.type, x.data,
               coalesce(x.metadata, '{}'::jsonb), v_xid::text::xid8
          FROM unnest(p_event_ids, p_types, p_data, p_metadata) WITH ORDINALITY AS x(id, type, data, metadata, ord)
        RETURNING event_id, stream_version, global_position, false;
END
$fn$;

-- The slow path of append_events when some event id is already stored: the original result when
-- the whole batch is stored unchanged in this stream (a retry), else LE002.
CREATE FUNCTION append_events_replay(p_stream_id text, p_event_ids uuid[], p_types text[], p_data jsonb[])
RETURNS TABLE (r_event_id uuid, r_stream_version bigint, r_global_position bigint, r_replayed boolean)
LANGUAGE plpgsql AS $fn$
DECLARE
    v_conflict uuid;
BEGIN
    SELECT x.id INTO v_conflict
      FROM unnest(p_event_ids, p_types, p_data) AS x(id, type, data)
      LEFT JOIN events s ON s.event_id = x.id
     WHERE s.event_id IS NULL OR s.stream_id <> p_stream_id OR s.type <> x.type OR s.data <> x.data
     ORDER BY s.event_id IS NULL  -- name a stored id that differs before a new one
     LIMIT 1;
    IF v_conflict IS NOT NULL THEN
        IF NOT EXISTS (SELECT 1 FROM events s WHERE s.event_id = v_conflict) THEN
            -- The batch mixes stored and new ids: name a stored one.
            SELECT s.event_id INTO v_conflict FROM events s WHERE s.event_id = ANY (p_event_ids) LIMIT 1;
        END IF;
        RAISE EXCEPTION 'event id % was already appended with a different body or batch', v_conflict
            USING ERRCODE = 'LE002', DETAIL = v_conflict::text;
    END IF;
    RETURN QUERY
        SELECT s.event_id, s.stream_version, s.global_position, true
          FROM events s WHERE s.event_id = ANY (p_event_ids)
         ORDER BY s.stream_version;
END
$fn$;

-- The highest position a gap-safe reader may return now: every event below it is final.
CREATE FUNCTION events_safe_position() RETURNS bigint
LANGUAGE sql STABLE AS $fn$
    SELECT (pg_snapshot_xmin(pg_current_snapshot())::text::bigint << 12) - 1
$fn$;

-- Roles. CREATE ROLE is cluster-wide, so another database's migration may have made them.
DO $roles$
BEGIN
    CREATE ROLE ledger_writer NOLOGIN;
EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL;
END
$roles$;

DO $roles$
BEGIN
    CREATE ROLE ledger_reader NOLOGIN;
EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL;
END
$roles$;

REVOKE ALL ON events FROM PUBLIC;
GRANT INSERT, SELECT ON events TO ledger_writer;
