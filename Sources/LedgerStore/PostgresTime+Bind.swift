import Foundation
import NIOCore
import PostgresNIO

extension PostgresTime {
    /// A time bound to a query rounded to PostgreSQL's microsecond, as the writer and the rebuild's
    /// COPY store times (postgres-nio truncates a bound `Date`, so the same time decoded from the
    /// log could be stored a microsecond apart from the one the writer held).
    struct Bound: PostgresNonThrowingEncodable {
        let date: Date

        static var psqlType: PostgresDataType { .timestamptz }
        static var psqlFormat: PostgresFormat { .binary }

        func encode<JSONEncoder: PostgresJSONEncoder>(into byteBuffer: inout ByteBuffer, context: PostgresEncodingContext<JSONEncoder>) {
            byteBuffer.writeInteger(PostgresTime.microseconds(date))
        }
    }

    /// `date` to bind, rounded.
    static func bound(_ date: Date?) -> Bound? { date.map(Bound.init) }
}
