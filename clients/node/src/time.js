// Conversions between milliseconds and google.protobuf's Duration and
// Timestamp, whose seconds are 64-bit (strings here).

function split(ms) {
  const seconds = Math.floor(ms / 1000);
  const nanos = Math.min(999_999_999, Math.round((ms - seconds * 1000) * 1e6));
  return { seconds: String(seconds), nanos };
}

/** msDuration converts milliseconds to a Duration. */
export const msDuration = split;

/** msTimestamp converts milliseconds since the epoch to a Timestamp. */
export const msTimestamp = split;

/** durationMs converts a Duration to milliseconds (0 when unset). */
export function durationMs(d) {
  return d ? Number(d.seconds) * 1000 + Number(d.nanos) / 1e6 : 0;
}

/** timestampMs converts a Timestamp to milliseconds since the epoch (0 when unset). */
export const timestampMs = durationMs;
