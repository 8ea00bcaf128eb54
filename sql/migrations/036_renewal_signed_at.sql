-- When Apple signed the renewal info a subscription's renewal fields come from (`autoRenew`,
-- `autoRenewProductId`, `expirationIntent`, grace period, billing retry). Apple sends
-- notifications in no set order: a `DID_RENEW` signed before an `EXPIRED` or a
-- `DID_CHANGE_RENEWAL_STATUS` but arriving after it carried older renewal info, which replaced
-- the newer (an expired subscription showed `autoRenew: true`). Renewal info signed before the
-- one the subscription holds now changes none of them. NULL: none held, or none kept its signing
-- time (rows from before this migration, until `ledger projections rebuild`).
ALTER TABLE subscriptions ADD COLUMN renewal_signed_at timestamptz;
