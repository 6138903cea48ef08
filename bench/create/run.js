#!/usr/bin/env node
'use strict'
// Create-latency and idle-memory benchmark.
//
//   node bench/create/run.js [--samples N] [--concurrency 1,10,50] [--idle K]
//                            [--baseline N] [--runtime runc|runsc]
//                            [--cgroup-path '/sys/fs/cgroup/memory/cubicle/{id}']
//                            [--max-seconds S] [--no-volumes] [--pool N] [--json]
//                            [--trace] [--disk-size-mb N] [--serve-flag F]...
//
// It starts its own `cubicle serve` (like the JS test harness: temp data dir, free
// loopback port, own bridge and pool) and measures, with the unmodified e2b SDK, the
// time from Sandbox.create() to the end of the first commands.run('true'), at each
// concurrency level (max(N, c) samples, c in flight). Then, in the same invocation, the
// baseline: a bare `runc run` of the same rootfs (throwaway OCI bundle running
// /bin/true, own --root state dir), and the ratio. Finally the idle memory of K
// sandboxes: the sum of Pss (from /proc/<pid>/smaps_rollup) over each sandbox's
// processes, then serve's own RSS and PSS once they are gone. The processes come from
// the sandbox's cgroup (--cgroup-path, '{id}' is the sandbox ID), or, when that does
// not exist, from `runc --root <data>/run/<runtime> ps`.
// With --pool N (default off) it then sets the base template's warm pool to N, waits for
// N standbys and measures the same create→first command pooled at each concurrency
// level, in rounds of c creates each started on a full pool (a round bigger than N
// boots the rest), printing hits/misses and the ratio pooled/unpooled.
// With --trace it measures only the per-phase trace instead: raw creates (POST
// /v2/sandboxes, c in flight, levels from --concurrency, default 1,50) whose
// Server-Timing headers give each phase, then the first commands.run('true') through
// the SDK on the created sandbox, and prints p50/p95 per phase at each level
// (`make bench BENCH_FLAGS=--trace`); with --pool N too, the same again on a full
// pool (claims) at each level up to N. --disk-size-mb N is serve's (each sandbox's disk;
// 1024 by default): c=50 promises c × N MiB of sparse images, which serve refuses (507)
// beyond the data filesystem's free space less its reserve. --serve-flag passes one more
// argument to serve (repeat it: --serve-flag --max-concurrent-creates --serve-flag 64).
// Everything it starts is killed and removed before it exits.

const path = require('node:path')
const fs = require('node:fs')
const os = require('node:os')
const { spawnSync, execFileSync } = require('node:child_process')

const REPO = path.resolve(__dirname, '..', '..')
process.env.CUBICLE_LOG_NAME = process.env.CUBICLE_LOG_NAME || 'bench-create'
const E2B_DIR = path.join(REPO, 'test', 'e2b-js')
const { Server } = require(path.join(E2B_DIR, 'tests', 'harness.js'))
const { Sandbox, Volume } = require(require.resolve('e2b', { paths: [E2B_DIR] }))

function parseArgs(argv) {
  const o = {
    samples: 20,
    concurrency: [1, 10, 50],
    idle: 5,
    baseline: 20,
    runtime: process.env.CUBICLE_RUNTIME || 'runc',
    cgroupPath: '/sys/fs/cgroup/memory/cubicle/{id}',
    maxSeconds: 900,
    json: false,
    volumes: true,
    pool: 0,
    trace: false,
    diskSizeMB: 0,
    serveFlags: [],
  }
  let levelsGiven = false
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i]
    const next = () => {
      if (i + 1 >= argv.length) throw new Error(`${a} needs a value`)
      return argv[++i]
    }
    switch (a) {
      case '--samples': o.samples = Number(next()); break
      case '--concurrency': o.concurrency = next().split(',').map(Number).filter((n) => n > 0); levelsGiven = true; break
      case '--idle': o.idle = Number(next()); break
      case '--baseline': o.baseline = Number(next()); break
      case '--runtime': o.runtime = next(); break
      case '--cgroup-path': o.cgroupPath = next(); break
      case '--max-seconds': o.maxSeconds = Number(next()); break
      case '--json': o.json = true; break
      case '--no-volumes': o.volumes = false; break
      case '--pool': o.pool = Number(next()); break
      case '--trace': o.trace = true; break
      case '--disk-size-mb': o.diskSizeMB = Number(next()); break
      case '--serve-flag': o.serveFlags.push(next()); break
      case '-h': case '--help':
        console.log(fs.readFileSync(__filename, 'utf8').split('\n').slice(2, 32).map((l) => l.replace(/^\/\/ ?/, '')).join('\n'))
        process.exit(0)
      default: throw new Error(`unknown argument ${a}`)
    }
  }
  if (o.trace && !levelsGiven) o.concurrency = [1, 50]
  return o
}

const { summary, f1 } = require('../lib/stats')
const pool = require('../lib/pool')
function line(name, st) {
  return `${name.padEnd(28)} n=${String(st.n).padStart(3)}  p50=${f1(st.p50).padStart(8)} ms  p95=${f1(st.p95).padStart(8)} ms  p99=${f1(st.p99).padStart(8)} ms`
}

// runCreates runs one(…) total times from c concurrent workers until deadline; one
// returns a sample and may set sbx.current to the sandbox it made, which is killed
// after it (also when it fails). Errors are collected, not thrown.
async function runCreates(c, total, deadline, one) {
  const samples = []
  const errors = []
  let started = 0
  async function worker() {
    while (started < total && Date.now() < deadline) {
      started++
      const sbx = { current: null }
      try {
        samples.push(await one(sbx))
      } catch (e) {
        errors.push(String(e && e.message ? e.message : e).slice(0, 200))
      } finally {
        if (sbx.current) await sbx.current.kill({ requestTimeoutMs: 60000 }).catch(() => {})
      }
    }
  }
  await Promise.all(Array.from({ length: c }, worker))
  return { samples, errors }
}

// ---- SDK create → first command ------------------------------------------------------
function createLatency(srv, c, total, deadline, createOpts = {}) {
  return runCreates(c, total, deadline, async (sbx) => {
    const t0 = process.hrtime.bigint()
    sbx.current = await Sandbox.create('base', { timeoutMs: 120000, requestTimeoutMs: 120000, ...createOpts })
    await sbx.current.commands.run('true', { requestTimeoutMs: 60000 })
    return Number(process.hrtime.bigint() - t0) / 1e6
  })
}

// ---- per-phase trace (Server-Timing of raw creates) ----------------------------------
// parseServerTiming turns "network;dur=3.1, disk;dur=24.9" into { network: 3.1, disk: 24.9 }.
function parseServerTiming(h) {
  const out = {}
  for (const entry of (h || '').split(',')) {
    const m = /^\s*([A-Za-z0-9_]+)\s*;\s*dur=([0-9.]+)\s*$/.exec(entry)
    if (m) out[m[1]] = Number(m[2])
  }
  return out
}
// One sample: { phases, create, firstCommand, createToRun }.
function traceLatency(srv, c, total, deadline) {
  return runCreates(c, total, deadline, async (sbx) => {
    const t0 = process.hrtime.bigint()
    const res = await fetch(`${srv.url}/v2/sandboxes`, {
      method: 'POST',
      headers: { 'X-API-KEY': srv.apiKey, 'Content-Type': 'application/json' },
      body: JSON.stringify({ templateID: 'base', timeout: 120 }),
      signal: AbortSignal.timeout(120000),
    })
    const body = await res.json()
    if (res.status !== 201) throw new Error(`POST /v2/sandboxes: ${res.status} ${JSON.stringify(body)}`)
    const t1 = process.hrtime.bigint()
    // What Sandbox.create builds from the same answer (no extra round trip).
    sbx.current = new Sandbox({ sandboxId: body.sandboxID, sandboxDomain: body.domain || undefined, envdVersion: body.envdVersion,
      envdAccessToken: body.envdAccessToken, trafficAccessToken: body.trafficAccessToken, requestTimeoutMs: 120000 })
    await sbx.current.commands.run('true', { requestTimeoutMs: 60000 })
    const t2 = process.hrtime.bigint()
    return { phases: parseServerTiming(res.headers.get('server-timing')), create: Number(t1 - t0) / 1e6,
      firstCommand: Number(t2 - t1) / 1e6, createToRun: Number(t2 - t0) / 1e6 }
  })
}
// Phases in path order (internal/phase.Names); any other name a server sends is
// printed after them.
const PHASES = ['validate', 'store', 'schedule', 'lock_wait', 'network', 'network_wait', 'disk', 'rootfs', 'idmap',
  'oci_run', 'agent_ready', 'init', 'total']
// levels is keyed by the column's label ("c=1", "pool=10 c=1").
function traceTable(levels) {
  const cs = Object.keys(levels)
  const w = (c) => Math.max(11, c.length + 5)
  const names = [...PHASES]
  for (const c of cs) for (const s of levels[c].samples) for (const n of Object.keys(s.phases)) if (!names.includes(n)) names.push(n)
  const rows = names.map((n) => [n, (s) => s.phases[n]])
  rows.push(['create (client)', (s) => s.create], ['first command', (s) => s.firstCommand], ['create→first command', (s) => s.createToRun])
  const head = ['phase (ms)'.padEnd(22)]
  for (const c of cs) head.push(`${c} p50`.padStart(w(c)), `${c} p95`.padStart(w(c)))
  const out = [head.join(' ')]
  const table = {}
  for (const [name, get] of rows) {
    const cells = [name.padEnd(22)]
    table[name] = {}
    for (const c of cs) {
      const st = summary(levels[c].samples.map(get).filter((x) => Number.isFinite(x)))
      table[name][c] = { p50: st.p50, p95: st.p95, n: st.n }
      cells.push(f1(st.p50).padStart(w(c)), f1(st.p95).padStart(w(c)))
    }
    out.push(cells.join(' '))
  }
  return { text: out.join('\n'), table }
}

// ---- warm pool ----------------------------------------------------------------------------
async function claimCounts(srv) {
  const r = await fetch(srv.metricsUrl + '/metrics', { signal: AbortSignal.timeout(30000) })
  const text = await r.text()
  const get = (res) => Number((new RegExp(`^cubicle_pool_claims_total\\{result="${res}"\\} (\\S+)$`, 'm').exec(text) || [])[1] || 0)
  return { hit: get('hit'), miss: get('miss') }
}
// pooledLatency runs rounds of c concurrent creates, each round on a full pool.
async function pooledLatency(srv, c, total, size, deadline) {
  const samples = []
  const errors = []
  const before = await claimCounts(srv)
  for (let done = 0; done < total && Date.now() < deadline;) {
    await pool.waitPool(srv, 'base', size, deadline)
    const n = Math.min(c, total - done)
    const r = await createLatency(srv, n, n, deadline)
    samples.push(...r.samples)
    errors.push(...r.errors)
    done += n
  }
  const after = await claimCounts(srv)
  return { samples, errors, hits: after.hit - before.hit, misses: after.miss - before.miss }
}

// ---- bare runc baseline ------------------------------------------------------------------
function runcBaseline(rootfs, n) {
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'cubicle-bench-runc-'))
  const bundle = path.join(tmp, 'bundle')
  const state = path.join(tmp, 'state')
  fs.mkdirSync(bundle)
  fs.mkdirSync(state)
  const samples = []
  const errors = []
  try {
    execFileSync('runc', ['spec', '--bundle', bundle])
    const cfgPath = path.join(bundle, 'config.json')
    const cfg = JSON.parse(fs.readFileSync(cfgPath, 'utf8'))
    cfg.root = { path: rootfs, readonly: true }
    cfg.process.terminal = false
    cfg.process.args = ['/bin/true']
    cfg.hostname = 'bench'
    fs.writeFileSync(cfgPath, JSON.stringify(cfg))
    for (let i = 0; i < n; i++) {
      const id = `cubicle-bench-${process.pid}-${i}`
      const t0 = process.hrtime.bigint()
      const r = spawnSync('runc', ['--root', state, 'run', '--bundle', bundle, id], { stdio: ['ignore', 'ignore', 'pipe'], timeout: 30000 })
      const dt = Number(process.hrtime.bigint() - t0) / 1e6
      if (r.status === 0) samples.push(dt)
      else errors.push(`runc run: status ${r.status} ${r.stderr ? r.stderr.toString().slice(0, 200) : ''}`)
      spawnSync('runc', ['--root', state, 'delete', '--force', id], { stdio: 'ignore', timeout: 15000 })
    }
  } finally {
    const r = spawnSync('runc', ['--root', state, 'list', '-q'], { encoding: 'utf8' })
    for (const id of (r.stdout || '').split('\n').filter(Boolean)) {
      spawnSync('runc', ['--root', state, 'delete', '--force', id], { stdio: 'ignore', timeout: 15000 })
    }
    fs.rmSync(tmp, { recursive: true, force: true })
  }
  return { samples, errors }
}

// ---- idle memory -------------------------------------------------------------------------------
function readPids(file) {
  try {
    return fs.readFileSync(file, 'utf8').split('\n').filter(Boolean).map(Number)
  } catch {
    return null
  }
}
function sandboxPids(srv, runtime, cgroupTpl, id) {
  const cg = cgroupTpl.replaceAll('{id}', id)
  const fromCg = readPids(path.join(cg, 'cgroup.procs'))
  if (fromCg && fromCg.length) return { pids: fromCg, source: `cgroup ${cg}` }
  const root = path.join(srv.dataDir, 'run', runtime)
  const ls = spawnSync(runtime, ['--root', root, 'list', '-q'], { encoding: 'utf8', timeout: 15000 })
  const cids = (ls.stdout || '').split('\n').filter(Boolean)
  const cid = cids.find((c) => c === id) || cids.find((c) => c.includes(id))
  if (!cid) return { pids: [], source: 'not found' }
  const ps = spawnSync(runtime, ['--root', root, 'ps', '--format', 'json', cid], { encoding: 'utf8', timeout: 15000 })
  try {
    const pids = JSON.parse(ps.stdout)
    if (Array.isArray(pids) && pids.length) return { pids, source: `${runtime} ps` }
  } catch {}
  return { pids: [], source: `${runtime} ps failed: ${(ps.stderr || '').trim().slice(0, 200)}` }
}
function pssKiB(pid) {
  try {
    const m = /^Pss:\s+(\d+) kB/m.exec(fs.readFileSync(`/proc/${pid}/smaps_rollup`, 'utf8'))
    return m ? Number(m[1]) : 0
  } catch {
    return 0
  }
}
async function idleMemory(srv, o) {
  const sbxs = []
  const out = []
  try {
    for (let i = 0; i < o.idle; i++) {
      const s = await Sandbox.create('base', { timeoutMs: 300000, requestTimeoutMs: 120000 })
      sbxs.push(s)
      await s.commands.run('true')
    }
    await new Promise((r) => setTimeout(r, 3000))
    for (const s of sbxs) {
      const { pids, source } = sandboxPids(srv, o.runtime, o.cgroupPath, s.sandboxId)
      const kib = pids.reduce((acc, p) => acc + pssKiB(p), 0)
      out.push({ id: s.sandboxId, pids: pids.length, pssKiB: kib, source })
    }
  } finally {
    await Promise.allSettled(sbxs.map((s) => s.kill({ requestTimeoutMs: 60000 })))
  }
  return out
}

async function main() {
  const o = parseArgs(process.argv.slice(2))
  if (process.getuid && process.getuid() !== 0) throw new Error('run as root')
  const deadline = Date.now() + o.maxSeconds * 1000
  const srv = new Server({ runtime: o.runtime })
  const results = { runtime: o.runtime, levels: {}, baseline: null, idle: null }
  const cleanup = async () => {
    await srv.stop().catch((e) => console.error('cleanup:', e.message))
  }
  process.once('SIGINT', () => cleanup().then(() => process.exit(130)))
  process.once('SIGTERM', () => cleanup().then(() => process.exit(143)))
  try {
    await srv.start([...(o.diskSizeMB > 0 ? ['--disk-size-mb', String(o.diskSizeMB)] : []), ...o.serveFlags])
    console.log(`cubicle serve at ${srv.url} (runtime ${o.runtime}, data ${srv.dataDir})`)
    // Warm-up (first create pays one-off costs such as bridge/nftables setup).
    await createLatency(srv, 1, 1, deadline)

    if (o.trace) {
      const levels = {}
      for (const c of o.concurrency) {
        const total = Math.max(o.samples, c)
        const r = await traceLatency(srv, c, total, deadline)
        levels[`c=${c}`] = r
        console.log(`trace c=${c}: ${r.samples.length} creates` + (r.errors.length ? `  errors=${r.errors.length} (${r.errors[0]})` : ''))
      }
      // With --pool N, the same on a full pool: claims (rounds of c, each on a
      // full pool; levels above N would boot the rest, so they are left out).
      if (o.pool > 0) {
        await pool.setPool(srv, 'base', o.pool)
        try {
          for (const c of o.concurrency.filter((c) => c <= o.pool)) {
            const r = { samples: [], errors: [] }
            const total = Math.max(o.samples, c)
            while (r.samples.length + r.errors.length < total && Date.now() < deadline) {
              await pool.waitPool(srv, 'base', o.pool, deadline)
              const round = await traceLatency(srv, c, c, deadline)
              r.samples.push(...round.samples)
              r.errors.push(...round.errors)
            }
            levels[`pool=${o.pool} c=${c}`] = r
            console.log(`trace pool=${o.pool} c=${c}: ${r.samples.length} creates` + (r.errors.length ? `  errors=${r.errors.length} (${r.errors[0]})` : ''))
          }
        } finally {
          await pool.setPool(srv, 'base', 0).catch((e) => console.error('pool drain:', e.message))
          await pool.waitPool(srv, 'base', 0, Date.now() + 60000).catch((e) => console.error('pool drain:', e.message))
        }
      }
      const { text, table } = traceTable(levels)
      console.log(`per-phase trace (runtime ${o.runtime}${o.diskSizeMB > 0 ? `, ${o.diskSizeMB} MiB disks` : ''}${o.serveFlags.length ? `, serve ${o.serveFlags.join(' ')}` : ''}; phases overlap: lock_wait is inside the phase that waited, idmap inside rootfs)`)
      console.log(text)
      results.trace = table
      return
    }

    for (const c of o.concurrency) {
      const total = Math.max(o.samples, c)
      const t0 = Date.now()
      const { samples, errors } = await createLatency(srv, c, total, deadline)
      const st = summary(samples)
      results.levels[c] = { ...st, errors: errors.length, wallMs: Date.now() - t0, firstErrors: errors.slice(0, 3) }
      console.log(line(`create→run c=${c}`, st) + (errors.length ? `  errors=${errors.length} (${errors[0]})` : ''))
    }

    if (o.pool > 0) {
      await pool.setPool(srv, 'base', o.pool)
      try {
        results.pooled = {}
        for (const c of o.concurrency) {
          const total = Math.max(o.samples, c)
          const { samples, errors, hits, misses } = await pooledLatency(srv, c, total, o.pool, deadline)
          const st = summary(samples)
          const un = results.levels[c]
          results.pooled[c] = { ...st, hits, misses, errors: errors.length, firstErrors: errors.slice(0, 3) }
          console.log(line(`create→run pool=${o.pool} c=${c}`, st) + `  hits=${hits} misses=${misses}` +
            (errors.length ? `  errors=${errors.length} (${errors[0]})` : ''))
          if (un && un.n && st.n) {
            results.pooled[c].ratio = { p50: st.p50 / un.p50, p95: st.p95 / un.p95, p99: st.p99 / un.p99 }
            const r = results.pooled[c].ratio
            console.log(`ratio (pooled / unpooled, c=${c})  p50=${r.p50.toFixed(2)}x  p95=${r.p95.toFixed(2)}x  p99=${r.p99.toFixed(2)}x`)
          }
        }
      } finally {
        // Standbys are not listed, so drain them before anything else runs.
        await pool.setPool(srv, 'base', 0).catch((e) => console.error('pool drain:', e.message))
        await pool.waitPool(srv, 'base', 0, Date.now() + 60000).catch((e) => console.error('pool drain:', e.message))
      }
    }

    if (o.volumes) {
      // Same invocation, c=1: the cost of attaching a (local) volume, as the
      // only holder (Attach mounts) and while another sandbox holds it (reuse).
      const vol = await Volume.create(`bench-${Date.now()}`)
      const withVol = { volumeMounts: { '/data': vol } }
      const first = await createLatency(srv, 1, o.samples, deadline, withVol)
      const holder = await Sandbox.create('base', { timeoutMs: 600000, ...withVol })
      const shared = await createLatency(srv, 1, o.samples, deadline, withVol)
      await holder.kill()
      await Volume.destroy(vol.volumeId)
      const base = results.levels[1] || results.levels[o.concurrency[0]]
      results.volume = { first: summary(first.samples), shared: summary(shared.samples) }
      console.log(line('create→run +volume (mount)', results.volume.first) + (first.errors.length ? `  errors=${first.errors.length} (${first.errors[0]})` : ''))
      console.log(line('create→run +volume (shared)', results.volume.shared) + (shared.errors.length ? `  errors=${shared.errors.length} (${shared.errors[0]})` : ''))
      if (base) {
        console.log(`ratio (+volume mount / no volume, c=1)  p50=${(results.volume.first.p50 / base.p50).toFixed(2)}x  p95=${(results.volume.first.p95 / base.p95).toFixed(2)}x`)
      }
    }

    const rootfs = path.join(srv.imagesDir, 'base', 'rootfs')
    const b = runcBaseline(rootfs, o.baseline)
    results.baseline = { ...summary(b.samples), errors: b.errors.length, firstErrors: b.errors.slice(0, 3) }
    console.log(line('bare runc run /bin/true', results.baseline) + (b.errors.length ? `  errors=${b.errors.length} (${b.errors[0]})` : ''))
    const c1 = results.levels[o.concurrency[0]]
    if (c1 && results.baseline.n) {
      results.ratio = { p50: c1.p50 / results.baseline.p50, p95: c1.p95 / results.baseline.p95, p99: c1.p99 / results.baseline.p99 }
      console.log(`ratio (c=${o.concurrency[0]} / bare runc)   p50=${results.ratio.p50.toFixed(2)}x  p95=${results.ratio.p95.toFixed(2)}x  p99=${results.ratio.p99.toFixed(2)}x`)
    }

    if (o.idle > 0) {
      const mem = await idleMemory(srv, o)
      const measured = mem.filter((m) => m.pids > 0)
      const avg = measured.length ? measured.reduce((a, m) => a + m.pssKiB, 0) / measured.length : NaN
      results.idle = { sandboxes: mem, avgPssKiB: avg }
      console.log(`idle memory per sandbox (PSS) avg=${f1(avg / 1024)} MiB over ${measured.length}/${mem.length} sandboxes` +
        (mem[0] ? ` [pids via ${mem[0].source}]` : ''))
      for (const m of mem) console.log(`  ${m.id}  pids=${m.pids}  pss=${f1(m.pssKiB / 1024)} MiB`)
      // serve's own idle footprint, read after its sandboxes are gone and 2 s of quiet.
      await new Promise((resolve) => setTimeout(resolve, 2000))
      const st = fs.readFileSync(`/proc/${srv.proc.pid}/status`, 'utf8')
      const rssKiB = Number((/^VmRSS:\s+(\d+) kB/m.exec(st) || [])[1])
      const pss = /^Pss:\s+(\d+) kB/m.exec(fs.readFileSync(`/proc/${srv.proc.pid}/smaps_rollup`, 'utf8'))
      results.serveIdle = { rssKiB, pssKiB: pss ? Number(pss[1]) : NaN }
      console.log(`serve idle RSS=${f1(rssKiB / 1024)} MiB PSS=${f1(results.serveIdle.pssKiB / 1024)} MiB (pid ${srv.proc.pid}, after its sandboxes were killed)`)
    }
  } finally {
    await cleanup()
  }
  if (o.json) console.log(JSON.stringify(results, null, 2))
}

main().catch((e) => {
  console.error(e && e.stack ? e.stack : e)
  process.exit(1)
})
