'use strict'
// Percentiles for the benchmarks' latency tables.

// pct is the nearest-rank percentile p (0-100) of an ascending array.
function pct(sorted, p) {
  if (!sorted.length) return NaN
  const idx = Math.min(sorted.length - 1, Math.max(0, Math.ceil((p / 100) * sorted.length) - 1))
  return sorted[idx]
}

// summary is n, p50, p95, p99, min and max of a list of milliseconds.
function summary(ms) {
  const s = [...ms].sort((a, b) => a - b)
  return { n: s.length, p50: pct(s, 50), p95: pct(s, 95), p99: pct(s, 99), min: s[0], max: s[s.length - 1] }
}

// f1 formats a number with one decimal ("n/a" for none).
const f1 = (x) => (Number.isFinite(x) ? x.toFixed(1) : 'n/a')

module.exports = { pct, summary, f1 }
