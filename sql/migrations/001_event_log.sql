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

-- Appends events to one stream in the caller's transaction and answers with a status instead of
-- raising, so that a refused append does not abort a transaction shared with other appends.
--
-- p_expected_version: NULL = any version, -1 = the stream must not exist, n >= 0 = the stream's
-- last version must be n. The events come as parallel arrays (ids, types, bodies, metadata).
-- r_status, one row per event unless refused (then a single row):
--   appended / replayed: the event's version and position (replayed: every event id of the
--     batch was already stored with the same stream, type and data; nothing was appended);
--   wrong-expected-version: r_detail = the current version (-1: no stream);
--   event-id-conflict: r_event_id = an id already stored with another stream, type or body;
--   invalid: r_detail says why.
-- The common case runs four statements: lock, one index probe per id, one query for both the
-- stream version and the transaction's next position, and the insert.
CREATE FUNCTION append_to_stream(
    p_stream_id text, p_expected_version bigint,
    p_event_ids uuid[], p_types text[], p_data jsonb[], p_metadata jsonb[])
RETURNS TABLE (r_status text, r_detail text, r_event_id uuid, r_stream_version bigint, r_global_position bigint)
LANGUAGE plpgsql
-- PL/pgSQL caches generic plans per session: a session that starts on a small log would keep a
-- sequential scan for the event-id probe, and every append would then read the whole log.
SET enable_seqscan = off
AS $fn$
DECLARE
    v_xid      bigint := pg_current_xact_id()::text::bigint;
    v_count    integer := coalesce(cardinality(p_event_ids), 0);
    v_current  bigint;
    v_next     bigint;
    v_conflict uuid;
BEGIN
    IF v_count = 0 OR v_count > 4096 THEN
        RETURN QUERY SELECT 'invalid', format('a batch holds 1 to 4096 events, not %s', v_count), NULL::uuid, NULL::bigint, NULL::bigint;
        RETURN;
    END IF;
    IF coalesce(cardinality(p_types), 0) <> v_count OR coalesce(cardinality(p_data), 0) <> v_count
       OR coalesce(cardinality(p_metadata), 0) <> v_count THEN
        RETURN QUERY SELECT 'invalid', 'ids, types, data and metadata need one entry per event', NULL::uuid, NULL::bigint, NULL::bigint;
        RETURN;
    END IF;
    IF v_count > 1 AND (SELECT count(DISTINCT id) FROM unnest(p_event_ids) AS id) <> v_count THEN
        RETURN QUERY SELECT 'invalid', 'an event id appears twice in one batch', NULL::uuid, NULL::bigint, NULL::bigint;
        RETURN;
    END IF;

    -- One writer per stream at a time; writers of other streams never wait.
    PERFORM pg_advisory_xact_lock(hashtextextended(p_stream_id, 0));

    IF EXISTS (SELECT 1 FROM events s WHERE s.event_id = ANY (p_event_ids)) THEN
        -- A retry when the whole batch is stored unchanged in this stream; else a conflict.
        SELECT x.id INTO v_conflict
          FROM unnest(p_event_ids, p_types, p_data) AS x(id, type, data)
          LEFT JOIN events s ON s.event_id = x.id
         WHERE s.event_id IS NULL OR s.stream_id <> p_stream_id OR s.type <> x.type OR s.data <> x.data
         ORDER BY s.event_id IS NULL  -- name a stored id that differs before a new one
         LIMIT 1;
        IF v_conflict IS NULL THEN
            RETURN QUERY
                SELECT 'replayed', NULL::text, s.event_id, s.stream_version, s.global_position
                  FROM events s WHERE s.event_id = ANY (p_event_ids)
                 ORDER BY s.stream_version;
            RETURN;
        END IF;
        IF NOT EXISTS (SELECT 1 FROM events s WHERE s.event_id = v_conflict) THEN
            SELECT s.event_id INTO v_conflict FROM events s WHERE s.event_id = ANY (p_event_ids) LIMIT 1;
        END IF;
        RETURN QUERY SELECT 'event-id-conflict', NULL::text, v_conflict, NULL::bigint, NULL::bigint;
        RETURN;
    END IF;

    SELECT coalesce((SELECT max(s.stream_version) FROM events s WHERE s.stream_id = p_stream_id), -1),
           coalesce((SELECT max(s.global_position) + 1 FROM events s
                      WHERE s.global_position >= (v_xid << 12) AND s.global_position < ((v_xid + 1) << 12)),
                    v_xid << 12)
      INTO v_current, v_next;
    IF p_expected_version IS NOT NULL AND p_expected_version <> v_current THEN
        RETURN QUERY SELECT 'wrong-expected-version', v_current::text, NULL::uuid, NULL::bigint, NULL::bigint;
        RETURN;
    END IF;
    IF v_next + v_count > ((v_xid + 1) << 12) THEN
        RETURN QUERY SELECT 'invalid', 'one database transaction appends at most 4096 events', NULL::uuid, NULL::bigint, NULL::bigint;
        RETURN;
    END IF;

    RETURN QUERY
        INSERT INTO events (global_position, stream_id, stream_version, event_id, type, data, metadata, transaction_id)
        SELECT v_next + x.ord - 1, p_stream_id, v_current + x.ord, x.id, x.type, x.data,
               coalesce(x.metadata, '{}'::jsonb), v_xid::text::xid8
          FROM unnest(p_event_ids, p_types, p_data, p_metadata) WITH ORDINALITY AS x(id, type, data, metadata, ord)
        RETURNING 'appended'::text, NULL::text, event_id, stream_version, global_position;
END
$fn$;

-- Several appends in one transaction (the event store's group commit): appends[i] has
-- p_sizes[i] events, taken in order from the flat event arrays; p_expected[i] = -2 means any
-- version. Streams are locked in hash order first, so that batches never deadlock each other.
-- Answers append_to_stream's rows, each with the 1-based index of its append.
--
-- The usual batch of several appends (distinct streams, no event id stored or repeated) is written set-wise: one
-- query reads every stream's version, one INSERT writes every accepted event. Any other batch
-- is written one append at a time, in order, by append_to_stream.
CREATE FUNCTION append_batch(
    p_streams text[], p_expected bigint[], p_sizes integer[],
    p_event_ids uuid[], p_types text[], p_data jsonb[], p_metadata jsonb[])
RETURNS TABLE (r_append integer, r_status text, r_detail text, r_event_id uuid, r_stream_version bigint, r_global_position bigint)
LANGUAGE plpgsql
SET enable_seqscan = off
AS $fn$
DECLARE
    v_xid     bigint := pg_current_xact_id()::text::bigint;
    v_appends integer := coalesce(cardinality(p_streams), 0);
    v_events  integer := coalesce(cardinality(p_event_ids), 0);
    v_next    bigint;
    v_first   integer := 1;
    v_last    integer;
    v_valid   boolean;
    v_fast    boolean := false;
BEGIN
    -- One statement for the checks: PL/pgSQL pays per statement, and this runs for every batch.
    SELECT coalesce(sum(n), 0) = v_events AND coalesce(min(n), 1) >= 1
      INTO v_valid FROM unnest(p_sizes) AS n;
    IF NOT v_valid OR coalesce(cardinality(p_expected), 0) <> v_appends OR coalesce(cardinality(p_sizes), 0) <> v_appends THEN
        RAISE EXCEPTION 'streams, expected versions and sizes need one entry per append, sizes summing to the events'
            USING ERRCODE = 'LE003';
    END IF;
    -- Locks in hash order; OFFSET 0 keeps the sorted subquery whole, so they are taken in that order.
    PERFORM pg_advisory_xact_lock(h)
       FROM (SELECT DISTINCT hashtextextended(s, 0) AS h FROM unnest(p_streams) AS s ORDER BY 1 OFFSET 0) AS locks;

    IF v_appends > 1 AND v_events <= 4096 THEN
        SELECT (SELECT count(DISTINCT s) FROM unnest(p_streams) AS s) = v_appends
               AND (SELECT count(DISTINCT id) FROM unnest(p_event_ids) AS id) = v_events
               AND NOT EXISTS (SELECT 1 FROM events e WHERE e.event_id = ANY (p_event_ids))
          INTO v_fast;
    END IF;
    IF v_fast THEN
        v_next := coalesce((SELECT max(e.global_position) + 1 FROM events e
                             WHERE e.global_position >= (v_xid << 12) AND e.global_position < ((v_xid + 1) << 12)),
                           v_xid << 12);
        IF v_next + v_events <= ((v_xid + 1) << 12) THEN
            RETURN QUERY
                WITH appends AS (
                    SELECT a.n::integer AS n, a.stream, a.expected, a.size,
                           (sum(a.size) OVER (ORDER BY a.n) - a.size)::integer AS offset_in_batch,
                           coalesce((SELECT max(e.stream_version) FROM events e WHERE e.stream_id = a.stream), -1) AS version
                      FROM unnest(p_streams, p_expected, p_sizes) WITH ORDINALITY AS a(stream, expected, size, n)
                ), accepted AS (
                    SELECT ap.*, (sum(ap.size) OVER (ORDER BY ap.n) - ap.size)::bigint AS offset_in_log
                      FROM appends ap WHERE ap.expected = -2 OR ap.expected = ap.version
                ), inserted AS (
                    INSERT INTO events (global_position, stream_id, stream_version, event_id, type, data, metadata, transaction_id)
                    SELECT v_next + ac.offset_in_log + k - 1, ac.stream, ac.version + k, p_event_ids[ac.offset_in_batch + k],
                           p_types[ac.offset_in_batch + k], p_data[ac.offset_in_batch + k],
                           coalesce(p_metadata[ac.offset_in_batch + k], '{}'::jsonb), v_xid::text::xid8
                      FROM accepted ac, generate_series(1, ac.size) AS k
                    RETURNING stream_id, stream_version, event_id, global_position
                )
                SELECT ac.n, 'appended'::text, NULL::text, i.event_id, i.stream_version, i.global_position
                  FROM inserted i JOIN accepted ac ON ac.stream = i.stream_id
                UNION ALL
                SELECT ap.n, 'wrong-expected-version'::text, ap.version::text, NULL::uuid, NULL::bigint, NULL::bigint
                  FROM appends ap WHERE NOT (ap.expected = -2 OR ap.expected = ap.version)
                 ORDER BY 1, 5;
            RETURN;
        END IF;
    END IF;

    FOR i IN 1 .. v_appends LOOP
        v_last := v_first + p_sizes[i] - 1;
        RETURN QUERY
            SELECT i, a.* FROM append_to_stream(
                p_streams[i], nullif(p_expected[i], -2), p_event_ids[v_first:v_last], p_types[v_first:v_last],
                p_data[v_first:v_last], p_metadata[v_first:v_last]) AS a;
        v_first := v_last + 1;
    END LOOP;
END
$fn$;

-- append_batch, committed before it answers: a procedure CALLed outside a transaction block may
-- COMMIT, and its answer is sent only after that COMMIT has returned. One round trip gives a
-- durable acknowledgement (a plain autocommit statement's result arrives before its commit).
-- The answer is append_batch's rows as parallel arrays, without NULLs: '' for no detail,
-- the nil UUID for no event id, -1 for no version or position.
CREATE PROCEDURE append_batch_durably(
    p_streams text[], p_expected bigint[], p_sizes integer[],
    p_event_ids uuid[], p_types text[], p_data jsonb[], p_metadata jsonb[],
    INOUT r_append integer[] DEFAULT NULL, INOUT r_status text[] DEFAULT NULL, INOUT r_detail text[] DEFAULT NULL,
    INOUT r_event_id uuid[] DEFAULT NULL, INOUT r_stream_version bigint[] DEFAULT NULL,
    INOUT r_global_position bigint[] DEFAULT NULL)
LANGUAGE plpgsql AS $fn$
BEGIN
    SELECT array_agg(b.r_append ORDER BY b.n), array_agg(b.r_status ORDER BY b.n),
           array_agg(coalesce(b.r_detail, '') ORDER BY b.n),
           array_agg(coalesce(b.r_event_id, '00000000-0000-0000-0000-000000000000'::uuid) ORDER BY b.n),
           array_agg(coalesce(b.r_stream_version, -1) ORDER BY b.n), array_agg(coalesce(b.r_global_position, -1) ORDER BY b.n)
      INTO r_append, r_status, r_detail, r_event_id, r_stream_version, r_global_position
      FROM append_batch(p_streams, p_expected, p_sizes, p_event_ids, p_types, p_data, p_metadata)
           WITH ORDINALITY AS b(r_append, r_status, r_detail, r_event_id, r_stream_version, r_global_position, n);
    COMMIT;
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
