#!/usr/bin/env node
'use strict'
// Egress-proxy benchmark: a sandbox's HTTPS through the node's transparent egress
// proxy against the same request going out directly, and create latency with and
// without domain rules.
//
//   node bench/egress/run.js [--requests N] [--rounds R] [--burst M] [--parallel P]
//                            [--create-samples N] [--domains D] [--runtime runc|runsc]
//                            [--system-ca] [--max-seconds S] [--json]
//
// It starts test/testnet (bin/cubicle-testnet: a netns on 198.18.128.0/17 whose DNS
// answers every *.test name with its own address and whose HTTPS server holds a
// certificate from a CA of its own) and its own `cubicle serve --dns <testnet>
// --ca-certificates <testnet bundle>` (the JS test harness's Server: temp data dir,
// free loopback port, own bridge, pool and cgroup parent), then measures with the
// unmodified e2b SDK, in one invocation:
//   1. latency of a fresh HTTPS GET https://allowed.test/ from inside a sandbox, each
//      on a new connection (DNS lookup, TCP, TLS handshake, request, response), with
//      two clients, each run as ONE commands.run call so SDK overhead is excluded:
//      curl, a new process per request in a shell loop, timed by its own %{time_total}
//      (so process start-up is excluded too, but its per-handle TLS set-up is not);
//      and python3, one process with one TLS context making a fresh connection per
//      request, timed by perf_counter (the closer to the handshake alone). Two
//      sandboxes of the base template: "proxy" created with network {allowOut:
//      ['allowed.test'], denyOut: ['0.0.0.0/0']} (redirected to the egress proxy,
//      judged by SNI) and "direct" with no network options (the nftables chain only).
//      N requests per client and sandbox (default 200), in R rounds (default 4) that
//      alternate proxy and direct so drift hits both alike; p50/p95/p99 of each and
//      the ratio proxy/direct. The server's cubicle_egress_connections_total counter
//      checks that every proxied request, and no direct one, went through the proxy.
//      The clients trust the fixture's CA alone (written into the sandbox): with the
//      system bundle OpenSSL 3.0 spends ~50 ms of CPU parsing it per curl handshake;
//      --system-ca keeps the bundle;
//   2. connections per second: M (default 400) fresh HTTPS connections from one curl
//      process inside each sandbox, P (default 16) at a time (curl --parallel, HTTP/1.1
//      with Connection: close so every transfer opens its own connection, which
//      curl's %{num_connects} confirms), timed inside the sandbox; proxy and direct,
//      with the ratio;
//   3. create latency: Sandbox.create() → end of the first commands.run('true'),
//      (a) with no network options and (b) with allowOut of D (default 20) domains
//      plus denyOut 0.0.0.0/0, N samples each (default 10) interleaved a b b a ...,
//      each sandbox killed after its sample (not timed); p50/p95/p99 and (b)/(a).
// Everything it starts (sandboxes, server, fixture) is stopped and removed before it
// exits; the harness checks that nothing was left on the host. Run as root. Binaries:
// bin/cubicle (or $CUBICLE_BIN) and bin/cubicle-testnet (or $CUBICLE_TESTNET_BIN).

const path = require('node:path')
const fs = require('node:fs')
const readline = require('node:readline')
const { spawn } = require('node:child_process')

const REPO = path.resolve(__dirname, '..', '..')
process.env.CUBICLE_LOG_NAME = process.env.CUBICLE_LOG_NAME || 'bench-egress'
const E2B_DIR = path.join(REPO, 'test', 'e2b-js')
const { Server } = require(path.join(E2B_DIR, 'tests', 'harness.js'))
const { Sandbox } = require(require.resolve('e2b', { paths: [E2B_DIR] }))
const { summary, f1 } = require('../lib/stats')

const TESTNET = process.env.CUBICLE_TESTNET_BIN || path.join(REPO, 'bin', 'cubicle-testnet')
const HOST = 'allowed.test'
const URL = `https://${HOST}/`
// The fixture's CA alone, written into each sandbox (see the top: --system-ca).
const CA_IN_SANDBOX = '/tmp/bench-egress-ca.pem'
let curlCA = `--cacert ${CA_IN_SANDBOX}`
const DENY_ALL = '0.0.0.0/0'

function parseArgs(argv) {
  const o = {
    requests: 200,
    rounds: 4,
    burst: 400,
    parallel: 16,
    createSamples: 10,
    domains: 20,
    runtime: process.env.CUBICLE_RUNTIME || 'runc',
    maxSeconds: 900,
    systemCA: false,
    json: false,
  }
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i]
    const next = () => {
      if (i + 1 >= argv.length) throw new Error(`${a} needs a value`)
      return argv[++i]
    }
    const num = () => {
      const v = Number(next())
      if (!Number.isInteger(v) || v < 0) throw new Error(`${a}: want a whole number, got ${argv[i]}`)
      return v
    }
    switch (a) {
      case '--requests': o.requests = num(); break
      case '--rounds': o.rounds = Math.max(1, num()); break
      case '--burst': o.burst = num(); break
      case '--parallel': o.parallel = Math.max(1, num()); break
      case '--create-samples': o.createSamples = num(); break
      case '--domains': o.domains = Math.max(1, num()); break
      case '--runtime': o.runtime = next(); break
      case '--max-seconds': o.maxSeconds = num(); break
      case '--system-ca': o.systemCA = true; break
      case '--json': o.json = true; break
      case '-h': case '--help':
        console.log(fs.readFileSync(__filename, 'utf8').split('\n').slice(2).filter((l, i, arr) => arr.slice(0, i + 1).every((x) => x.startsWith('//')))
          .map((l) => l.replace(/^\/\/ ?/, '')).join('\n'))
        process.exit(0)
      default: throw new Error(`unknown argument ${a}`)
    }
  }
  return o
}

function line(name, st, unit = 'ms') {
  const w = (x) => f1(x).padStart(8)
  return `${name.padEnd(30)} n=${String(st.n).padStart(4)}  p50=${w(st.p50)} ${unit}  p95=${w(st.p95)} ${unit}  p99=${w(st.p99)} ${unit}`
}
function ratio(a, b) {
  return { p50: a.p50 / b.p50, p95: a.p95 / b.p95, p99: a.p99 / b.p99 }
}
function ratioLine(name, r) {
  return `${name.padEnd(30)}         p50=${r.p50.toFixed(2).padStart(7)}x    p95=${r.p95.toFixed(2).padStart(7)}x    p99=${r.p99.toFixed(2).padStart(7)}x`
}

// ---- test/testnet ------------------------------------------------------------------------
// startTestnet spawns the fixture and resolves with its ready line; stop() closes its
// stdin (it then removes its netns, veth and files) and waits for it to exit.
function startTestnet() {
  if (!fs.existsSync(TESTNET)) throw new Error(`${TESTNET} not found: run \`make build\` first`)
  const proc = spawn(TESTNET, [], { stdio: ['pipe', 'pipe', 'inherit'] })
  const exited = new Promise((resolve) => proc.once('exit', (code, sig) => resolve({ code, sig })))
  const ready = new Promise((resolve, reject) => {
    exited.then((r) => reject(new Error(`cubicle-testnet exited early: ${JSON.stringify(r)}`)))
    proc.once('error', reject)
    readline.createInterface({ input: proc.stdout }).once('line', (l) => {
      try {
        resolve(JSON.parse(l))
      } catch (e) {
        reject(new Error(`cubicle-testnet printed ${JSON.stringify(l)}: ${e.message}`))
      }
    })
  })
  let stopping = null
  const stop = () => {
    if (!stopping) {
      stopping = (async () => {
        if (proc.exitCode !== null || proc.signalCode !== null) return
        proc.stdin.end()
        const r = await Promise.race([exited, new Promise((res) => setTimeout(() => res(null), 15000))])
        if (r === null) {
          // It did not exit on EOF: SIGTERM runs the same clean-up.
          try { process.kill(proc.pid, 'SIGTERM') } catch {}
          await Promise.race([exited, new Promise((res) => setTimeout(res, 10000))])
        }
      })()
    }
    return stopping
  }
  return { ready, stop }
}

// ---- egress counter --------------------------------------------------------------------
async function egressCounts(srv) {
  const r = await fetch(srv.metricsUrl + '/metrics', { signal: AbortSignal.timeout(30000) })
  const text = await r.text()
  const out = {}
  for (const m of text.matchAll(/^cubicle_egress_connections_total\{verdict="([^"]+)"\} (\S+)$/gm)) out[m[1]] = Number(m[2])
  return out
}
function delta(after, before) {
  const out = {}
  for (const k of new Set([...Object.keys(after), ...Object.keys(before)])) {
    const d = (after[k] || 0) - (before[k] || 0)
    if (d) out[k] = d
  }
  return out
}
const sumOf = (o) => Object.values(o).reduce((a, b) => a + b, 0)

// ---- in-sandbox measurements --------------------------------------------------------------
async function run(sbx, cmd, timeoutMs) {
  const r = await sbx.commands.run(cmd, { timeoutMs, requestTimeoutMs: timeoutMs + 30000 })
  return r.stdout
}

// curlRequests runs n fresh curl GETs in one command; each prints its timings (s).
async function curlRequests(sbx, n) {
  const fmt = '%{http_code} %{time_namelookup} %{time_connect} %{time_appconnect} %{time_total}\\n'
  const cmd = `for i in $(seq ${n}); do curl ${curlCA} -s -m 10 -o /dev/null -w '${fmt}' ${URL}; done`
  const out = await run(sbx, cmd, 20000 + n * 10000)
  const rows = { total: [], dns: [], connect: [], tls: [], bad: [] }
  for (const l of out.split('\n').filter(Boolean)) {
    const [code, dns, conn, tls, total] = l.trim().split(/\s+/)
    if (code !== '200') {
      rows.bad.push(code)
      continue
    }
    rows.total.push(Number(total) * 1000)
    rows.dns.push(Number(dns) * 1000)
    rows.connect.push(Number(conn) * 1000)
    rows.tls.push(Number(tls) * 1000)
  }
  return rows
}

// PY is the one-process client: one TLS context (CA loaded once), then per request a
// fresh getaddrinfo, TCP connect, TLS handshake, GET with Connection: close, read to
// EOF (TCP_NODELAY, as curl sets it); the time of each from perf_counter.
const PY = `
import socket, ssl, sys, time
n, host, cafile = int(sys.argv[1]), sys.argv[2], sys.argv[3] or None
ctx = ssl.create_default_context(cafile=cafile)
req = ("GET / HTTP/1.1\\r\\nHost: %s\\r\\nConnection: close\\r\\n\\r\\n" % host).encode()
for _ in range(n):
    t = time.perf_counter()
    buf, code = b"", "000"
    try:
        addr = socket.getaddrinfo(host, 443, socket.AF_INET, socket.SOCK_STREAM)[0][4]
        with socket.create_connection(addr, timeout=10) as raw:
            raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # as curl does
            with ctx.wrap_socket(raw, server_hostname=host) as s:
                s.sendall(req)
                try:
                    while True:
                        d = s.recv(65536)
                        if not d:
                            break
                        buf += d
                except (ssl.SSLEOFError, ConnectionResetError):
                    pass
        code = buf.split(b" ", 2)[1].decode() if buf.startswith(b"HTTP/") else "000"
    except Exception as e:
        code = type(e).__name__
    print(code, (time.perf_counter() - t) * 1000, flush=True)
`
const PY_IN_SANDBOX = '/tmp/bench-egress.py'

async function pyRequests(sbx, n) {
  const out = await run(sbx, `python3 ${PY_IN_SANDBOX} ${n} ${HOST} '${curlCA ? CA_IN_SANDBOX : ''}'`, 20000 + n * 10000)
  const rows = { total: [], bad: [] }
  for (const l of out.split('\n').filter(Boolean)) {
    const [code, ms] = l.trim().split(/\s+/)
    if (code === '200') rows.total.push(Number(ms))
    else rows.bad.push(code)
  }
  return rows
}

// burst opens m fresh HTTPS connections, p at a time, from one curl process, and
// returns the wall time measured in the sandbox and the per-transfer results.
async function burst(sbx, m, p) {
  const cmd = [
    's=$(date +%s%N)',
    `curl ${curlCA} -s -m 30 -Z --parallel-immediate --parallel-max ${p} --http1.1 -H 'Connection: close' ` +
      `-w '%{http_code} %{num_connects}\\n' -o /dev/null '${URL}?[1-${m}]' > /tmp/burst.out`,
    'e=$(date +%s%N)',
    'echo wall $(( (e - s) / 1000 ))',
    'sort /tmp/burst.out | uniq -c',
    'rm -f /tmp/burst.out',
  ].join('; ')
  const out = await run(sbx, cmd, 120000)
  const wall = /^wall (\d+)$/m.exec(out)
  let ok = 0
  let fresh = 0
  const other = []
  for (const mm of out.matchAll(/^\s*(\d+) (\d{3}) (\d+)$/gm)) {
    const [count, code, conns] = [Number(mm[1]), mm[2], Number(mm[3])]
    if (code === '200') {
      ok += count
      if (conns === 1) fresh += count
    } else other.push(`${count}x${code}`)
  }
  const wallMs = wall ? Number(wall[1]) / 1000 : NaN
  return { wallMs, ok, fresh, other, perSec: ok / (wallMs / 1000) }
}

// ---- create latency -----------------------------------------------------------------------
async function createOnce(opts) {
  const t0 = process.hrtime.bigint()
  let sbx
  try {
    sbx = await Sandbox.create('base', { timeoutMs: 120000, requestTimeoutMs: 120000, ...opts })
    await sbx.commands.run('true', { requestTimeoutMs: 60000 })
    return { ms: Number(process.hrtime.bigint() - t0) / 1e6 }
  } catch (e) {
    return { err: String(e && e.message ? e.message : e).slice(0, 200) }
  } finally {
    if (sbx) await sbx.kill({ requestTimeoutMs: 60000 }).catch(() => {})
  }
}

async function main() {
  const o = parseArgs(process.argv.slice(2))
  if (process.getuid && process.getuid() !== 0) throw new Error('run as root')
  const deadline = Date.now() + o.maxSeconds * 1000
  const left = () => Date.now() < deadline
  const results = { runtime: o.runtime, options: o }

  const tn = startTestnet()
  const srv = new Server({ runtime: o.runtime })
  let cleaned = null
  const cleanup = () => {
    if (!cleaned) {
      cleaned = (async () => {
        let err = null
        await srv.stop().catch((e) => {
          err = e
          console.error('cleanup:', e.message)
        })
        await tn.stop().catch((e) => console.error('cleanup testnet:', e.message))
        if (err) throw err
      })()
    }
    return cleaned
  }
  process.once('SIGINT', () => cleanup().finally(() => process.exit(130)))
  process.once('SIGTERM', () => cleanup().finally(() => process.exit(143)))

  let failed = false
  try {
    const net = await tn.ready
    await srv.start(['--dns', net.dns, '--ca-certificates', net.caBundle])
    console.log(`cubicle serve at ${srv.url} (runtime ${o.runtime}, data ${srv.dataDir}); testnet ${net.addr} (netns ${net.netns})`)

    // ---- 1 & 2: proxy vs direct, in two long-lived sandboxes -------------------------------
    const proxy = srv.track(await Sandbox.create('base', {
      timeoutMs: 600000, requestTimeoutMs: 120000, network: { allowOut: [HOST], denyOut: [DENY_ALL] },
    }))
    const direct = srv.track(await Sandbox.create('base', { timeoutMs: 600000, requestTimeoutMs: 120000 }))
    const sbx = { proxy, direct }
    if (o.systemCA) curlCA = ''
    else {
      const pem = fs.readFileSync(net.caCert, 'utf8')
      for (const s of [proxy, direct]) await s.files.write(CA_IN_SANDBOX, pem)
    }
    for (const s of [proxy, direct]) await s.files.write(PY_IN_SANDBOX, PY)
    // Warm-up (first curl loads the binary and the CA bundle from disk), and the check
    // that the policy is what it claims: the proxy sandbox reaches allowed.test only.
    for (const k of ['proxy', 'direct']) {
      const w = await curlRequests(sbx[k], 3)
      if (w.total.length !== 3) throw new Error(`${k} sandbox: GET ${URL} with curl failed: ${w.bad.join(',')}`)
      const p = await pyRequests(sbx[k], 3)
      if (p.total.length !== 3) throw new Error(`${k} sandbox: GET ${URL} with python failed: ${p.bad.join(',')}`)
    }
    const other = (await run(proxy, `curl -s -m 5 -o /dev/null -w '%{http_code}' https://other.test/ || true`, 30000)).trim()
    if (other !== '000') throw new Error(`proxy sandbox reached https://other.test/ (${other}): the allow-list is not enforced`)

    const CLIENTS = ['curl', 'python']
    const empty = () => ({ total: [], dns: [], connect: [], tls: [], bad: [] })
    const lat = {}
    for (const c of CLIENTS) lat[c] = { proxy: empty(), direct: empty() }
    const through = { proxy: {}, direct: {} }
    const per = Math.ceil(o.requests / o.rounds)
    for (let r = 0, done = 0; r < o.rounds && done < o.requests && left(); r++) {
      const n = Math.min(per, o.requests - done)
      const order = r % 2 === 0 ? ['proxy', 'direct'] : ['direct', 'proxy']
      for (const k of order) {
        for (const c of CLIENTS) {
          const before = await egressCounts(srv)
          const rows = c === 'curl' ? await curlRequests(sbx[k], n) : await pyRequests(sbx[k], n)
          const d = delta(await egressCounts(srv), before)
          for (const [v, cnt] of Object.entries(d)) through[k][v] = (through[k][v] || 0) + cnt
          for (const f of Object.keys(rows)) lat[c][k][f].push(...rows[f])
        }
      }
      done += n
    }
    results.latency = {}
    console.log(`\nfresh HTTPS GET ${URL} from inside a sandbox, ${o.rounds} rounds alternating the sandboxes, ` +
      `${o.systemCA ? 'system CA bundle' : 'CA: the fixture\'s alone'}`)
    const label = {
      curl: 'curl (new process each)',
      python: 'python (one process)',
    }
    let proxied = 0
    for (const c of CLIENTS) {
      results.latency[c] = {}
      for (const k of ['proxy', 'direct']) {
        const L = lat[c][k]
        const st = summary(L.total)
        const res = (results.latency[c][k] = {
          ...st,
          errors: L.bad.length,
          firstErrors: L.bad.slice(0, 3),
          sequentialPerSec: L.total.length / (L.total.reduce((a, b) => a + b, 0) / 1000),
        })
        if (k === 'proxy') proxied += L.total.length
        let extra = ''
        if (L.tls.length) {
          res.p50Phases = { dns: summary(L.dns).p50, connect: summary(L.connect).p50, tls: summary(L.tls).p50 }
          extra = `  (p50 to dns ${f1(res.p50Phases.dns)}, tcp ${f1(res.p50Phases.connect)}, tls ${f1(res.p50Phases.tls)})`
        }
        console.log(line(`${label[c]} ${k}`, st) + extra + (L.bad.length ? `  errors=${L.bad.length} (${L.bad.slice(0, 3).join(', ')})` : ''))
      }
      results.latency[c].ratio = ratio(results.latency[c].proxy, results.latency[c].direct)
      console.log(ratioLine(`${label[c]} proxy/direct`, results.latency[c].ratio))
    }
    for (const c of CLIENTS) {
      console.log(`sequential ${c} (1 / mean latency): proxy ${results.latency[c].proxy.sequentialPerSec.toFixed(0)}/s, ` +
        `direct ${results.latency[c].direct.sequentialPerSec.toFixed(0)}/s`)
    }
    console.log(`egress proxy verdicts while measuring: proxy sandbox ${JSON.stringify(through.proxy)}, direct sandbox ${JSON.stringify(through.direct)}`)
    if ((through.proxy.allowed_name || 0) !== proxied || sumOf(through.direct) !== 0) {
      failed = true
      console.error(`unexpected: ${proxied} proxied requests but verdicts ${JSON.stringify(through.proxy)}; direct sandbox ${JSON.stringify(through.direct)}`)
    }
    for (const c of CLIENTS) for (const k of ['proxy', 'direct']) if (lat[c][k].bad.length) failed = true

    if (o.burst > 0 && left()) {
      console.log(`\nconnections per second: ${o.burst} fresh HTTPS connections, ${o.parallel} at a time, one curl process in the sandbox`)
      results.burst = {}
      for (const k of ['proxy', 'direct']) {
        const before = await egressCounts(srv)
        const b = await burst(sbx[k], o.burst, o.parallel)
        b.proxyConnections = delta(await egressCounts(srv), before)
        results.burst[k] = b
        console.log(`${k.padEnd(30)} ${b.perSec.toFixed(0).padStart(6)} conn/s  (${b.ok}/${o.burst} ok, ${b.fresh} on a new connection, wall ${f1(b.wallMs)} ms` +
          `${b.other.length ? `, other: ${b.other.join(' ')}` : ''}; proxy verdicts ${JSON.stringify(b.proxyConnections)})`)
        if (b.ok !== o.burst || b.fresh !== b.ok) failed = true
      }
      results.burst.ratio = results.burst.proxy.perSec / results.burst.direct.perSec
      console.log(`${'ratio proxy/direct'.padEnd(30)} ${results.burst.ratio.toFixed(2).padStart(6)}x`)
    }
    await Promise.allSettled([proxy.kill(), direct.kill()])

    // ---- 3: create latency with and without domain rules ------------------------------------
    if (o.createSamples > 0 && left()) {
      const domains = [HOST, ...Array.from({ length: o.domains - 1 }, (_, i) => `d${String(i + 1).padStart(2, '0')}.bench.test`)]
      const variants = {
        none: {},
        domains: { network: { allowOut: domains, denyOut: [DENY_ALL] } },
      }
      const samples = { none: [], domains: [] }
      const errors = { none: [], domains: [] }
      // Warm-up of each kind (first create pays one-off costs).
      for (const k of ['none', 'domains']) await createOnce(variants[k])
      for (let i = 0; i < o.createSamples && left(); i++) {
        const order = i % 2 === 0 ? ['none', 'domains'] : ['domains', 'none']
        for (const k of order) {
          const r = await createOnce(variants[k])
          if (r.err) errors[k].push(r.err)
          else samples[k].push(r.ms)
        }
      }
      results.create = {}
      console.log(`\ncreate → first commands.run('true') (interleaved, sequential)`)
      const label = { none: '(a) no network options', domains: `(b) ${o.domains} domains + deny all` }
      for (const k of ['none', 'domains']) {
        results.create[k] = { ...summary(samples[k]), errors: errors[k].length, firstErrors: errors[k].slice(0, 3) }
        console.log(line(label[k], results.create[k]) + (errors[k].length ? `  errors=${errors[k].length} (${errors[k][0]})` : ''))
        if (errors[k].length) failed = true
      }
      results.create.ratio = ratio(results.create.domains, results.create.none)
      console.log(ratioLine('ratio (b)/(a)', results.create.ratio))
    }
    if (!left()) console.log(`(stopped early: --max-seconds ${o.maxSeconds} reached)`)
  } finally {
    await cleanup()
  }
  if (o.json) console.log(JSON.stringify(results, null, 2))
  if (failed) process.exit(1)
}

main().catch((e) => {
  console.error(e && e.stack ? e.stack : e)
  process.exit(1)
})
