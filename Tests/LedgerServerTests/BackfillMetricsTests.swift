import Testing

@testable import LedgerServer

/// The counter the notification backfill's restarts feed (docs/operations.md, "Metrics").
@Suite("Notification backfill metrics")
struct BackfillMetricsTests {
    @Test("each restart of the notification backfill is counted by Apple's reason")
    func restartsCounted() {
        let metrics = LedgerMetrics()
        metrics.notificationBackfillRestarted("PaginationTokenExpired")
        metrics.notificationBackfillRestarted("PaginationTokenExpired")
        metrics.notificationBackfillRestarted("StartDateTooFarInPast")
        let text = metrics.registry.emitToString()
        #expect(text.contains(#"ledger_notification_backfill_restarts_total{reason="PaginationTokenExpired"} 2"#), "\(text)")
        #expect(text.contains(#"ledger_notification_backfill_restarts_total{reason="StartDateTooFarInPast"} 1"#), "\(text)")
    }
}
