-- Cheaper group commits (docs/architecture.md, "The append transaction"). Measured with pgbench
-- CALLing append_batch_durably with 8 one-event appends: 554 µs -> 504 µs of execution, of which
-- the fast path's checks were 52 µs and the answer's six sorted aggregates most of the rest.
--
-- append_batch's set-wise path no longer checks that the batch's streams and event ids are
-- distinct and not yet stored, nor looks up the version of a stream expected not to exist: the
-- unique indexes on (stream_id, stream_version) and event_id refuse all three (a stream that
-- exists already has a version 0), and the batch then fails as a whole. Both callers (the event store's group commit
-- and the order group commit) write each append alone after a failed batch, where a retried
-- event id is answered as before. The streams are still locked first, in hash order.
--
-- append_batch_durably aggregates its answer without sorting it: the arrays come from one
-- aggregate over the same rows, so they stay parallel; the caller orders each append's rows.

CREATE OR REPLACE FUNCTION append_batch(
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

    -- Set-wise without checking first that the streams and event ids are distinct and new: the
    -- unique indexes refuse a stream version or an event id taken twice, and the batch then fails
    -- as a whole (both procedures' callers write each append alone after that).
    IF v_appends > 1 AND v_events <= 4096 THEN
        v_next := coalesce((SELECT max(e.global_position) + 1 FROM events e
                             WHERE e.global_position >= (v_xid << 12) AND e.global_position < ((v_xid + 1) << 12)),
                           v_xid << 12);
        IF v_next + v_events <= ((v_xid + 1) << 12) THEN
            RETURN QUERY
                WITH appends AS (
                    SELECT a.n::integer AS n, a.stream, a.expected, a.size,
                           (sum(a.size) OVER (ORDER BY a.n) - a.size)::integer AS offset_in_batch,
                           -- A new stream's version is not looked up: version 0 of a stream
                           -- that exists is a unique violation, and the batch goes alone.
                           CASE WHEN a.expected = -1 THEN -1
                                ELSE coalesce((SELECT max(e.stream_version) FROM events e WHERE e.stream_id = a.stream), -1)
                           END AS version
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

CREATE OR REPLACE PROCEDURE append_batch_durably(
    p_streams text[], p_expected bigint[], p_sizes integer[],
    p_event_ids uuid[], p_types text[], p_data jsonb[], p_metadata jsonb[],
    INOUT r_append integer[] DEFAULT NULL, INOUT r_status text[] DEFAULT NULL, INOUT r_detail text[] DEFAULT NULL,
    INOUT r_event_id uuid[] DEFAULT NULL, INOUT r_stream_version bigint[] DEFAULT NULL,
    INOUT r_global_position bigint[] DEFAULT NULL)
LANGUAGE plpgsql AS $fn$
BEGIN
    SELECT array_agg(b.r_append), array_agg(b.r_status),
           array_agg(coalesce(b.r_detail, '')),
           array_agg(coalesce(b.r_event_id, '00000000-0000-0000-0000-000000000000'::uuid)),
           array_agg(coalesce(b.r_stream_version, -1)), array_agg(coalesce(b.r_global_position, -1))
      INTO r_append, r_status, r_detail, r_event_id, r_stream_version, r_global_position
      FROM append_batch(p_streams, p_expected, p_sizes, p_event_ids, p_types, p_data, p_metadata)
 AS b;
    COMMIT;
END
$fn$;

