-- A reversed refund (REFUND_REVERSED) of a transaction waiting in the pool puts it back as its
-- pool entry left it (docs/architecture.md, "Projections"): held for support again after an
-- Apple-account conflict, and still refunded for a family member's transaction, which never pays
-- an order. Earlier ledgers set such a row back to `unmatched`: gone from the conflicts dashboard
-- and shown as free in the pool. Those rows are set as a rebuild of the log sets them now;
-- nothing else changes.
UPDATE apple_transactions t
   SET status = CASE WHEN t.verification->>'reason' = 'account-conflict'
                      AND coalesce(t.verification->'transaction'->>'inAppOwnershipType', '') <> 'FAMILY_SHARED'
                     THEN 'conflict' ELSE 'refunded' END
 WHERE t.order_id IS NULL AND t.status = 'unmatched'
   AND (t.verification->>'reason' IN ('account-conflict', 'family-share-revoked')
        OR t.verification->'transaction'->>'inAppOwnershipType' = 'FAMILY_SHARED')
   AND EXISTS (SELECT 1 FROM events e
                WHERE e.stream_id = 'transaction-' || t.transaction_id AND e.type = 'notification-received'
                  AND e.data->>'notificationType' = 'REFUND_REVERSED');
