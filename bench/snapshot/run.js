#!/usr/bin/env node
'use strict'
// Snapshot, create-from-snapshot and fork benchmark.
//
//   node bench/snapshot/run.js [--runtime runc,runsc] [--iterations N] [--fork-reps N]
//                              [--fork-count N] [--dirty 1M,100M,1G] [--fork-dirty 500M]
//                              [--disk-size-mb MiB] [--max-seconds S] [--json]
//
// For each runtime in turn it starts its own `cubicle serve` (the JS test harness's
// Server: temp data dir, free loopback port, own bridge, pool and cgroup parent; log in
// test/e2b-js/.logs/bench-snapshot-<runtime>.<pid>.log) and measures, with the
// unmodified e2b SDK:
//   1. create → first commands.run('true'): from the base template (the baseline) and
//      from a snapshot of an idle base sandbox, N samples each, interleaved one at a
//      time; p50/p95/p99 and the ratio snapshot/template (goal: p50 <= 1.2x);
//   2. sbx.createSnapshot() (POST /sandboxes/{id}/snapshots) of an idle sandbox, N
//      samples, each snapshot deleted after (goals: p50 runc <= 50 ms, runsc <= 200 ms);
//   3. one snapshot after `head -c SIZE /dev/urandom` into /home/user (per --dirty
//      size, each replacing the last, `sync`ed), deleted after; the server is given a
//      --disk-size-mb big enough for the largest size when its default is not; beside
//      it, how long the sandbox was held still (the longest gap of a 5 ms ticker in it);
//   4. sbx.fork({count}) wall time (goal: p50 <= 1 s with runc), --fork-reps times, and
//      until every fork answered commands.run('true'); the server-side split (its
//      internal snapshot vs the creates) from /metrics' operation histograms;
//   5. disk: a sandbox writes --fork-dirty (default 500M), then forks --fork-count; du
//      (allocated blocks, one file system, hard links once) of the data dir's
//      snapshots/ and sandboxes/ entries before and after, against the naive
//      count × size copy.
// Everything it creates (sandboxes, snapshots) is deleted; the harness then checks that
// nothing was left on the host. Sizes take head(1)'s suffixes (K, M, G = powers of 1024).
// Run as root.

const path = require('node:path')
const fs = require('node:fs')
const { spawnSync } = require('node:child_process')

const REPO = path.resolve(__dirname, '..', '..')
const E2B_DIR = path.join(REPO, 'test', 'e2b-js')
const { Server } = require(path.join(E2B_DIR, 'tests', 'harness.js'))
const { Sandbox } = require(require.resolve('e2b', { paths: [E2B_DIR] }))

const GOAL = { ratioP50: 1.2, snapshotP50: { runc: 50, runsc: 200 }, forkP50: { runc: 1000 } }
const MiB = 2 ** 20

function parseSize(s) {
  const m = /^(\d+)([KMG]?)$/.exec(String(s).trim())
  if (!m) throw new Error(`bad size ${s} (want e.g. 1M, 100M, 1G)`)
  return Number(m[1]) * { '': 1, K: 2 ** 10, M: 2 ** 20, G: 2 ** 30 }[m[2]]
}

function parseArgs(argv) {
  const o = {
    runtimes: ['runc', 'runsc'],
    iterations: 10,
    forkReps: 3,
    forkCount: 10,
    dirty: ['1M', '100M', '1G'],
    forkDirty: '500M',
    diskSizeMB: 0,
    maxSeconds: 1800,
    json: false,
  }
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i]
    const next = () => {
      if (i + 1 >= argv.length) throw new Error(`${a} needs a value`)
      return argv[++i]
    }
    switch (a) {
      case '--runtime': o.runtimes = next().split(',').map((s) => s.trim()).filter(Boolean); break
      case '--iterations': o.iterations = Number(next()); break
      case '--fork-reps': o.forkReps = Number(next()); break
      case '--fork-count': o.forkCount = Number(next()); break
      case '--dirty': o.dirty = next().split(',').map((s) => s.trim()).filter(Boolean); break
      case '--fork-dirty': o.forkDirty = next(); break
      case '--disk-size-mb': o.diskSizeMB = Number(next()); break
      case '--max-seconds': o.maxSeconds = Number(next()); break
      case '--json': o.json = true; break
      case '-h': case '--help':
        console.log(fs.readFileSync(__filename, 'utf8').split('\n').slice(2).filter((l, i, a) => a.slice(0, i + 1).every((x) => x.startsWith('//')))
          .map((l) => l.replace(/^\/\/ ?/, '')).join('\n'))
        process.exit(0)
      default: throw new Error(`unknown argument ${a}`)
    }
  }
  for (const r of o.runtimes) if (!['runc', 'runsc'].includes(r)) throw new Error(`--runtime: unknown runtime ${r}`)
  if (!o.runtimes.length) throw new Error('--runtime: none given')
  if (!(o.iterations >= 1)) throw new Error('--iterations must be >= 1')
  if (!(o.forkReps >= 0)) throw new Error('--fork-reps must be >= 0')
  if (!(o.forkCount >= 1 && o.forkCount <= 100)) throw new Error('--fork-count must be 1..100')
  o.dirtyBytes = o.dirty.map(parseSize)
  o.forkDirtyBytes = o.forkDirty === '0' ? 0 : parseSize(o.forkDirty)
  return o
}

// ---- statistics ----------------------------------------------------------------------
const { summary, f1 } = require('../lib/stats')
const elapsedMs = (t0) => Number(process.hrtime.bigint() - t0) / 1e6
const errText = (e) => String(e && e.message ? e.message : e).slice(0, 200)
const errTail = (errors) => (errors.length ? `  errors=${errors.length} (${errors[0]})` : '')
const fmiB = (b) => `${f1(b / MiB)} MiB`
function row(name, st, goal) {
  const g = goal === undefined ? '' : `  goal p50 <= ${goal} ms: ${st.n && st.p50 <= goal ? 'met' : 'MISSED'}`
  return `${name.padEnd(34)} n=${String(st.n).padStart(3)}  p50=${f1(st.p50).padStart(8)} ms  p95=${f1(st.p95).padStart(8)} ms  p99=${f1(st.p99).padStart(8)} ms${g}`
}
function ratio(a, b) {
  if (!a.n || !b.n) return null
  return { p50: a.p50 / b.p50, p95: a.p95 / b.p95, p99: a.p99 / b.p99 }
}

// ---- SDK helpers ---------------------------------------------------------------------
const OPTS = { timeoutMs: 900000, requestTimeoutMs: 120000 }
async function runTrue(sbx) {
  const r = await sbx.commands.run('true', { requestTimeoutMs: 60000 })
  if (r.exitCode !== 0) throw new Error(`true exited ${r.exitCode}`)
}
async function sh(sbx, cmd, timeoutMs = 600000) {
  const r = await sbx.commands.run(cmd, { timeoutMs, requestTimeoutMs: timeoutMs })
  if (r.exitCode !== 0) throw new Error(`${cmd}: exit ${r.exitCode}: ${r.stderr.slice(0, 200)}`)
  return r.stdout
}
// createSample is the time from Sandbox.create(template) to the end of the first
// commands.run('true'), and the server's own create time (from /metrics); the sandbox
// is killed after (not timed).
async function createSample(srv, template) {
  const m0 = await opMetrics(srv)
  const t0 = process.hrtime.bigint()
  let sbx
  try {
    sbx = await Sandbox.create(template, OPTS)
    await runTrue(sbx)
    const ms = elapsedMs(t0)
    return { ms, serverMs: opDelta(m0, await opMetrics(srv), 'create').meanMs }
  } finally {
    if (sbx) await sbx.kill({ requestTimeoutMs: 60000 }).catch(() => {})
  }
}
async function deleteSnapshot(id, left) {
  try {
    if (!(await Sandbox.deleteSnapshot(id, { requestTimeoutMs: 60000 }))) left.push(`${id}: already gone`)
  } catch (e) {
    left.push(`${id}: ${errText(e)}`)
  }
}
async function snapshotInfo(srv, id) {
  const r = await srv.api('GET', `/snapshots/${id}`)
  return r.status === 200 ? r.json : {}
}

// ---- server-side operation metrics ----------------------------------------------------
async function opMetrics(srv) {
  const r = await fetch(srv.metricsUrl + '/metrics', { signal: AbortSignal.timeout(30000) })
  const text = await r.text()
  const get = (op, what) =>
    Number((new RegExp(`^cubicle_sandbox_operation_duration_seconds_${what}\\{op="${op}"\\} (\\S+)$`, 'm').exec(text) || [])[1] || 0)
  const out = {}
  for (const op of ['snapshot', 'create']) out[op] = { sum: get(op, 'sum'), count: get(op, 'count') }
  return out
}
function opDelta(a, b, op) {
  const n = b[op].count - a[op].count
  return { n, sumMs: (b[op].sum - a[op].sum) * 1000, meanMs: n ? ((b[op].sum - a[op].sum) * 1000) / n : NaN }
}

// ---- disk ----------------------------------------------------------------------------
// mountsUnder lists the mount points under dir (/proc/self/mountinfo field 5,
// octal-escaped).
function mountsUnder(dir) {
  const out = []
  for (const line of fs.readFileSync('/proc/self/mountinfo', 'utf8').split('\n')) {
    const f = line.split(' ')
    if (f.length < 5) continue
    const mp = f[4].replace(/\\([0-7]{3})/g, (_, o) => String.fromCharCode(parseInt(o, 8)))
    if (mp.startsWith(dir + '/')) out.push(mp)
  }
  return out
}
// heldMs is the longest gap between a ticker's stamps (ns, one per line) that
// overlaps [from, to] (ns): how long the sandbox stood still meanwhile.
function heldMs(ticks, from, to) {
  const ts = ticks.trim().split('\n').filter(Boolean).map(BigInt)
  let max = 0n
  for (let i = 1; i < ts.length; i++) {
    if (ts[i] < from || ts[i - 1] > to) continue
    if (ts[i] - ts[i - 1] > max) max = ts[i] - ts[i - 1]
  }
  return Number(max) / 1e6
}

// du returns the allocated bytes (not apparent sizes: disk images are sparse) of each
// path and their total, hard links counted once, for the first path holding them. Every
// mount point under the data dir is left out: a sandbox's rootfs overlay and its mounted
// disk image (the image file itself counts), and the bind mounts of its lower layers
// (the template's rootfs, a snapshot's layer) and of the agent binary, which are on the
// same file system (du -x would walk them) but are not the sandbox's own.
function du(paths, dataDir) {
  if (!paths.length) return { each: {}, total: 0 }
  const excl = mountsUnder(dataDir).map((m) => `--exclude=${m}`)
  const r = spawnSync('du', ['-x', '-s', '-c', '--block-size=1', ...excl, ...paths], { encoding: 'utf8', timeout: 600000 })
  const each = {}
  let total = NaN
  for (const l of (r.stdout || '').split('\n').filter(Boolean)) {
    const [n, p] = l.split('\t')
    if (p === 'total') total = Number(n)
    else each[p] = Number(n)
  }
  return { each, total }
}
function entries(dir) {
  try {
    return fs.readdirSync(dir).map((f) => path.join(dir, f))
  } catch {
    return []
  }
}
function hostSync() {
  spawnSync('sync', [], { stdio: 'ignore', timeout: 600000 })
}

// otherServers counts `cubicle serve` processes other than ours (another suite or
// benchmark on the host skews every number here), for the header.
function otherServers(own) {
  let n = 0
  for (const pid of fs.readdirSync('/proc').filter((f) => /^\d+$/.test(f))) {
    if (Number(pid) === own) continue
    try {
      const argv = fs.readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0')
      if (/cubicle$/.test(argv[0]) && argv[1] === 'serve') n++
    } catch {}
  }
  return n
}
const load = () => fs.readFileSync('/proc/loadavg', 'utf8').split(' ').slice(0, 3).join(' ')

// serveDefaultDiskMB is `cubicle serve`'s --disk-size-mb default, from its --help.
function serveDefaultDiskMB() {
  const bin = process.env.CUBICLE_BIN || path.join(REPO, 'bin', 'cubicle')
  const r = spawnSync(bin, ['serve', '--help'], { encoding: 'utf8', timeout: 30000 })
  const m = /--disk-size-mb int\s.*\(default (\d+)\)/.exec((r.stdout || '') + (r.stderr || ''))
  return m ? Number(m[1]) : 1024
}

// ---- one runtime ---------------------------------------------------------------------
async function benchRuntime(o, runtime, deadline, setCurrent) {
  const res = { runtime, errors: [] }
  const needMB = Math.ceil((Math.max(0, ...o.dirtyBytes, o.forkDirtyBytes) / MiB + 512) / 256) * 256
  const defMB = serveDefaultDiskMB()
  const diskMB = o.diskSizeMB || (needMB > defMB ? needMB : 0)
  process.env.CUBICLE_LOG_NAME = `bench-snapshot-${runtime}`
  const srv = new Server({ runtime })
  setCurrent(srv)
  const live = new Set() // sandboxes to kill at the end (besides what the harness lists)
  const snaps = new Set()
  const left = []
  try {
    await srv.start(diskMB ? ['--disk-size-mb', String(diskMB)] : [])
    res.log = srv.logPath
    const tpl = await srv.api('GET', '/templates')
    const base = Array.isArray(tpl.json) ? tpl.json.find((t) => t.templateID === 'base' || (t.aliases || []).includes('base') || (t.names || []).includes('base')) : null
    res.baseDiskSizeMB = base ? base.diskSizeMB : null
    console.log(`\n== ${runtime}: cubicle serve at ${srv.url} (data ${srv.dataDir}, log ${srv.logPath})`)
    console.log(`   serve --disk-size-mb default ${defMB} MiB, largest write + 512 MiB needs ${needMB} MiB: ` +
      (diskMB ? `started with --disk-size-mb ${diskMB}` : 'default kept') + `; base template diskSizeMB=${res.baseDiskSizeMB}`)
    res.hostAtStart = { load: load(), otherServers: otherServers(srv.proc.pid) }
    console.log(`   host: load average ${res.hostAtStart.load}, other cubicle serve processes: ${res.hostAtStart.otherServers}`)

    // Source: an idle base sandbox with a marker file, and one snapshot of it.
    const src = await Sandbox.create('base', OPTS)
    live.add(src)
    await sh(src, 'echo from-source > /home/user/marker.txt')
    const snap = await src.createSnapshot({ requestTimeoutMs: 120000 })
    snaps.add(snap.snapshotId)
    res.snapshotKind = (await snapshotInfo(srv, snap.snapshotId)).kind
    // Warm-up both paths (one-off costs: bridge, nftables, page cache), and check the
    // snapshot's child sees the source's file.
    await createSample(srv, 'base')
    {
      const c = await Sandbox.create(snap.snapshotId, OPTS)
      try {
        const got = (await c.files.read('/home/user/marker.txt')).trim()
        if (got !== 'from-source') throw new Error(`sandbox from snapshot read marker ${JSON.stringify(got)}`)
      } finally {
        await c.kill().catch(() => {})
      }
    }

    // 1. create from template vs from snapshot, interleaved.
    {
      const fromTpl = []
      const fromSnap = []
      const srvTpl = []
      const srvSnap = []
      const errs = []
      for (let i = 0; i < o.iterations && Date.now() < deadline; i++) {
        for (const [tmpl, out, srvOut] of [['base', fromTpl, srvTpl], [snap.snapshotId, fromSnap, srvSnap]]) {
          try {
            const r = await createSample(srv, tmpl)
            out.push(r.ms)
            srvOut.push(r.serverMs)
          } catch (e) {
            errs.push(`${tmpl}: ${errText(e)}`)
          }
        }
      }
      res.createTemplate = summary(fromTpl)
      res.createSnapshot = summary(fromSnap)
      res.createRatio = ratio(res.createSnapshot, res.createTemplate)
      res.createErrors = errs
      res.serverCreateTemplate = summary(srvTpl)
      res.serverCreateSnapshot = summary(srvSnap)
      console.log(row('create→run, from template', res.createTemplate) + errTail(errs))
      console.log(row(`create→run, from ${res.snapshotKind} snapshot`, res.createSnapshot))
      console.log(`   server side (POST /v2/sandboxes): from template p50 ${f1(res.serverCreateTemplate.p50)} ms, ` +
        `from snapshot p50 ${f1(res.serverCreateSnapshot.p50)} ms`)
      if (res.createRatio) {
        const r = res.createRatio
        console.log(`${'ratio snapshot / template'.padEnd(34)} p50=${r.p50.toFixed(2)}x  p95=${r.p95.toFixed(2)}x  p99=${r.p99.toFixed(2)}x` +
          `  goal p50 <= ${GOAL.ratioP50}x: ${r.p50 <= GOAL.ratioP50 ? 'met' : 'MISSED'}`)
      }
    }

    // 2. snapshot of an idle sandbox.
    {
      const samples = []
      const sizes = []
      const errs = []
      for (let i = 0; i < o.iterations && Date.now() < deadline; i++) {
        try {
          const t0 = process.hrtime.bigint()
          const s = await src.createSnapshot({ requestTimeoutMs: 120000 })
          samples.push(elapsedMs(t0))
          snaps.add(s.snapshotId)
          sizes.push((await snapshotInfo(srv, s.snapshotId)).sizeBytes)
          await deleteSnapshot(s.snapshotId, left)
          snaps.delete(s.snapshotId)
        } catch (e) {
          errs.push(errText(e))
        }
      }
      res.snapshotIdle = { ...summary(samples), sizeBytes: sizes[0], errors: errs }
      console.log(row(`snapshot, idle (${res.snapshotKind})`, res.snapshotIdle, GOAL.snapshotP50[runtime]) +
        `  size=${fmiB(sizes[0])}` + errTail(errs))
    }

    // 3. snapshot vs dirty size.
    res.dirty = []
    if (o.dirty.length) {
      const d = await Sandbox.create('base', OPTS)
      live.add(d)
      try {
        for (let i = 0; i < o.dirty.length && Date.now() < deadline; i++) {
          const label = o.dirty[i]
          const bytes = o.dirtyBytes[i]
          const e = { size: label, bytes }
          res.dirty.push(e)
          if (res.baseDiskSizeMB && bytes / MiB + 64 > res.baseDiskSizeMB) {
            e.error = `does not fit the ${res.baseDiskSizeMB} MiB disk`
            console.log(`${`snapshot, ${label} dirty`.padEnd(34)} skipped: ${e.error}`)
            continue
          }
          try {
            const tw = process.hrtime.bigint()
            await sh(d, `rm -f /home/user/dirty.bin && head -c ${label} /dev/urandom > /home/user/dirty.bin && sync`)
            e.writeMs = elapsedMs(tw)
            // A ticker in the sandbox stamps the clock every 5 ms: the longest gap
            // while the snapshot runs is how long the sandbox was held still.
            const ticker = await d.commands.run('rm -f /tmp/ticks; while :; do date +%s%N >> /tmp/ticks; sleep 0.005; done', { background: true })
            await new Promise((r) => setTimeout(r, 100))
            const wall0 = BigInt(Date.now()) * 1000000n
            const t0 = process.hrtime.bigint()
            const s = await d.createSnapshot({ requestTimeoutMs: 600000 })
            e.ms = elapsedMs(t0)
            const wall1 = BigInt(Date.now()) * 1000000n
            await new Promise((r) => setTimeout(r, 100))
            await ticker.kill()
            e.heldMs = heldMs(await d.files.read('/tmp/ticks'), wall0, wall1)
            snaps.add(s.snapshotId)
            e.sizeBytes = (await snapshotInfo(srv, s.snapshotId)).sizeBytes
            await deleteSnapshot(s.snapshotId, left)
            snaps.delete(s.snapshotId)
            console.log(`${`snapshot, ${label} dirty`.padEnd(34)} ${f1(e.ms).padStart(8)} ms  size=${fmiB(e.sizeBytes)}  ` +
              `(${f1(bytes / MiB / (e.ms / 1000))} MiB/s; sandbox held ${f1(e.heldMs)} ms; write+sync in sandbox ${f1(e.writeMs)} ms)`)
          } catch (err) {
            e.error = errText(err)
            console.log(`${`snapshot, ${label} dirty`.padEnd(34)} error: ${e.error}`)
          }
        }
      } finally {
        await d.kill().catch(() => {})
        live.delete(d)
      }
    }

    // 4. fork wall time.
    if (o.forkReps > 0) {
      const wall = []
      const ready = []
      const errs = []
      const split = []
      for (let i = 0; i < o.forkReps && Date.now() < deadline; i++) {
        let forks = []
        try {
          const m0 = await opMetrics(srv)
          const t0 = process.hrtime.bigint()
          forks = await src.fork({ count: o.forkCount, timeoutMs: 900000, requestTimeoutMs: 300000 })
          const w = elapsedMs(t0)
          const m1 = await opMetrics(srv)
          const ok = forks.filter((f) => f instanceof Sandbox)
          for (const f of forks) if (!(f instanceof Sandbox)) errs.push(errText(f))
          await Promise.all(ok.map(runTrue))
          const r = elapsedMs(t0)
          if (ok.length === o.forkCount) {
            wall.push(w)
            ready.push(r)
          }
          split.push({ snapshot: opDelta(m0, m1, 'snapshot'), create: opDelta(m0, m1, 'create'), ok: ok.length })
        } catch (e) {
          errs.push(errText(e))
        } finally {
          await Promise.allSettled(forks.filter((f) => f instanceof Sandbox).map((f) => f.kill({ requestTimeoutMs: 60000 })))
        }
      }
      res.fork = { wall: summary(wall), ready: summary(ready), split, errors: errs }
      console.log(row(`fork count=${o.forkCount}`, res.fork.wall, GOAL.forkP50[runtime]) + errTail(errs))
      console.log(row(`fork count=${o.forkCount} → all run('true')`, res.fork.ready))
      for (const s of split) {
        console.log(`   server side: internal snapshot ${f1(s.snapshot.sumMs)} ms, ${s.create.n} creates mean ${f1(s.create.meanMs)} ms` +
          ` (sum ${f1(s.create.sumMs)} ms), ${s.ok}/${o.forkCount} ok`)
      }
    }

    // 5. disk of count forks of a sandbox that wrote forkDirty.
    if (o.forkDirtyBytes > 0 && Date.now() < deadline) {
      const snapDir = path.join(srv.dataDir, 'snapshots')
      const sbxDir = path.join(srv.dataDir, 'sandboxes')
      // With a reflink disk store (serve --disk-store) each disk image lives there;
      // du counts a clone's extents shared with its blank in full (an upper bound).
      const diskDir = path.join(srv.dataDir, 'disk-store', 'disks')
      const own = (id) => [path.join(sbxDir, id), path.join(diskDir, `${id}.img`)].filter((f) => fs.existsSync(f))
      // A snapshot whose layer is a clone of the disk keeps it in disk-store/layers
      // (its rootfs is then a mount, left out of du); du counts the clone's extents
      // shared with the source in full, so the store's used bytes say what is new.
      const layerDir = path.join(srv.dataDir, 'disk-store', 'layers')
      const snapFiles = (e) => [e, path.join(layerDir, `${path.basename(e)}.img`)].filter((f) => fs.existsSync(f))
      const storeUsed = () => {
        try {
          const st = fs.statfsSync(path.join(srv.dataDir, 'disk-store'))
          return (st.blocks - st.bfree) * st.bsize
        } catch {
          return NaN
        }
      }
      const p = await Sandbox.create('base', OPTS)
      live.add(p)
      let forks = []
      const disk = { size: o.forkDirty, bytes: o.forkDirtyBytes, count: o.forkCount }
      res.forkDisk = disk
      try {
        await sh(p, `head -c ${o.forkDirty} /dev/urandom > /home/user/big.bin && sync`)
        hostSync()
        const snapsBefore = new Set(entries(snapDir))
        const before = du([...snapsBefore, ...entries(sbxDir), ...entries(diskDir), ...entries(layerDir)], srv.dataDir)
        disk.storeUsedBefore = storeUsed()
        disk.beforeBytes = before.total
        disk.sourceBytes = own(p.sandboxId).reduce((a, f) => a + (before.each[f] || 0), 0)
        const t0 = process.hrtime.bigint()
        forks = await p.fork({ count: o.forkCount, timeoutMs: 900000, requestTimeoutMs: 300000 })
        disk.forkMs = elapsedMs(t0)
        const ok = forks.filter((f) => f instanceof Sandbox)
        disk.ok = ok.length
        for (const f of forks) if (!(f instanceof Sandbox)) res.errors.push(`fork disk: ${errText(f)}`)
        await Promise.all(ok.map(runTrue))
        hostSync()
        const newSnaps = entries(snapDir).filter((e) => !snapsBefore.has(e))
        const forkFiles = ok.map((f) => own(f.sandboxId))
        // Snapshot dirs first: a file hard-linked into a fork counts for the snapshot.
        const after = du([...newSnaps.flatMap(snapFiles), ...forkFiles.flat()], srv.dataDir)
        disk.storeUsedAfter = storeUsed()
        disk.snapshotBytes = newSnaps.flatMap(snapFiles).reduce((a, e) => a + (after.each[e] || 0), 0)
        disk.perFork = forkFiles.map((files) => files.reduce((a, e) => a + (after.each[e] || 0), 0))
        disk.forksBytes = disk.perFork.reduce((a, n) => a + n, 0)
        const all = du([...entries(snapDir), ...entries(sbxDir), ...entries(diskDir), ...entries(layerDir)], srv.dataDir)
        disk.afterBytes = all.total
        disk.naiveBytes = o.forkCount * o.forkDirtyBytes
        const pf = summary(disk.perFork)
        console.log(`fork disk: ${o.forkCount} forks of a sandbox that wrote ${o.forkDirty} (fork took ${f1(disk.forkMs)} ms, ${ok.length} ok)`)
        console.log(`   source sandbox dir ${fmiB(disk.sourceBytes)}; new snapshot dir(s) ${newSnaps.length}: ${fmiB(disk.snapshotBytes)}`)
        console.log(`   ${ok.length} forks' dirs ${fmiB(disk.forksBytes)} (per fork p50 ${fmiB(pf.p50)}, max ${fmiB(pf.max)})`)
        console.log(`   snapshots/+sandboxes/ ${fmiB(disk.beforeBytes)} → ${fmiB(disk.afterBytes)} (+${fmiB(disk.afterBytes - disk.beforeBytes)})` +
          `; naive ${o.forkCount}×${o.forkDirty} = ${fmiB(disk.naiveBytes)}, ratio (snapshot + forks) / naive ${((disk.snapshotBytes + disk.forksBytes) / disk.naiveBytes).toFixed(3)}`)
        console.log(`   disk store's used bytes (shared extents once): +${fmiB(disk.storeUsedAfter - disk.storeUsedBefore)}`)
      } catch (e) {
        disk.error = errText(e)
        console.log(`fork disk: error: ${disk.error}`)
      } finally {
        await Promise.allSettled(forks.filter((f) => f instanceof Sandbox).map((f) => f.kill({ requestTimeoutMs: 60000 })))
        await p.kill().catch(() => {})
        live.delete(p)
      }
      // The internal snapshot goes once no fork uses it.
      const until = Date.now() + 30000
      let remaining = []
      const snapsNow = () => entries(snapDir).filter((e) => ![...snaps].some((s) => e.endsWith(s)))
      while (Date.now() < until && (remaining = snapsNow()).length) await new Promise((r) => setTimeout(r, 250))
      disk.internalSnapshotLeft = remaining
      if (remaining.length) res.errors.push(`fork's internal snapshot still on disk 30 s after its forks were killed: ${remaining.join(' ')}`)
    }
    res.hostAtEnd = { load: load(), otherServers: otherServers(srv.proc.pid) }
    console.log(`   host at the end: load average ${res.hostAtEnd.load}, other cubicle serve processes: ${res.hostAtEnd.otherServers}`)
  } catch (e) {
    res.errors.push(errText(e))
    console.log(`${runtime}: error: ${e && e.stack ? e.stack : e}`)
  } finally {
    for (const s of live) await s.kill().catch(() => {})
    for (const id of snaps) await deleteSnapshot(id, left)
    try {
      const r = await srv.api('GET', '/snapshots')
      if (r.status === 200 && r.json.length) left.push(`still listed: ${r.json.map((s) => s.snapshotID).join(' ')}`)
    } catch {}
    if (left.length) res.errors.push(`snapshot clean-up: ${left.join('; ')}`)
    try {
      await srv.stop()
    } catch (e) {
      res.errors.push(errText(e))
    }
    setCurrent(null)
  }
  return res
}

// ---- table ---------------------------------------------------------------------------
function table(all, o) {
  const lines = []
  const ms = (x) => (Number.isFinite(x) ? f1(x) : 'n/a')
  const head = ['runtime', 'measure', 'n', 'p50', 'p95', 'p99', 'goal']
  const rows = []
  const st = (rt, name, s, goal = '') => rows.push([rt, name, String(s.n), ms(s.p50), ms(s.p95), ms(s.p99), goal])
  for (const r of all) {
    const rt = r.runtime
    if (r.createTemplate) {
      st(rt, 'create→run from template (ms)', r.createTemplate)
      st(rt, `create→run from snapshot (ms)`, r.createSnapshot)
      const q = r.createRatio
      if (q) rows.push([rt, 'ratio snapshot/template', '', `${q.p50.toFixed(2)}x`, `${q.p95.toFixed(2)}x`, `${q.p99.toFixed(2)}x`,
        `<= ${GOAL.ratioP50}x ${q.p50 <= GOAL.ratioP50 ? 'met' : 'MISSED'}`])
    }
    if (r.snapshotIdle) {
      const g = GOAL.snapshotP50[rt]
      st(rt, `snapshot idle (ms)`, r.snapshotIdle, g ? `<= ${g} ms ${r.snapshotIdle.p50 <= g ? 'met' : 'MISSED'}` : '')
    }
    for (const d of r.dirty || []) {
      rows.push([rt, `snapshot ${d.size} dirty (ms)`, d.ms ? '1' : '0', d.ms ? ms(d.ms) : 'n/a', '', '',
        d.error ? d.error.slice(0, 40) : `size ${f1(d.sizeBytes / MiB)} MiB`])
    }
    if (r.fork) {
      const g = GOAL.forkP50[rt]
      st(rt, `fork count=${o.forkCount} (ms)`, r.fork.wall, g ? `<= ${g} ms ${r.fork.wall.n && r.fork.wall.p50 <= g ? 'met' : 'MISSED'}` : '')
      st(rt, `fork + all run(true) (ms)`, r.fork.ready)
    }
    const fd = r.forkDisk
    if (fd && fd.snapshotBytes !== undefined) {
      rows.push([rt, `fork disk: snapshot (MiB)`, '', f1(fd.snapshotBytes / MiB), '', '', ''])
      rows.push([rt, `fork disk: ${fd.ok} forks (MiB)`, '', f1(fd.forksBytes / MiB), '', '',
        `naive ${f1(fd.naiveBytes / MiB)} MiB, ${((fd.snapshotBytes + fd.forksBytes) / fd.naiveBytes).toFixed(3)}x`])
    } else if (fd && fd.error) rows.push([rt, 'fork disk', '', 'n/a', '', '', fd.error.slice(0, 40)])
  }
  const w = head.map((h, i) => Math.max(h.length, ...rows.map((r) => r[i].length)))
  const fmt = (r) => r.map((c, i) => (i >= 2 && i <= 5 ? c.padStart(w[i]) : c.padEnd(w[i]))).join('  ').trimEnd()
  lines.push(fmt(head), w.map((n) => '-'.repeat(n)).join('  '), ...rows.map(fmt))
  return lines.join('\n')
}

async function main() {
  const o = parseArgs(process.argv.slice(2))
  if (process.getuid && process.getuid() !== 0) throw new Error('run as root')
  const t0 = Date.now()
  const deadline = t0 + o.maxSeconds * 1000
  let current = null
  const cleanup = async () => {
    if (current) await current.stop().catch((e) => console.error('cleanup:', e.message))
  }
  process.once('SIGINT', () => cleanup().then(() => process.exit(130)))
  process.once('SIGTERM', () => cleanup().then(() => process.exit(143)))
  const all = []
  for (const rt of o.runtimes) {
    all.push(await benchRuntime(o, rt, deadline, (s) => (current = s)))
  }
  console.log(`\nsummary (iterations=${o.iterations}, fork reps=${o.forkReps}, ${((Date.now() - t0) / 1000).toFixed(0)} s)`)
  console.log(table(all, o))
  const busy = all.filter((r) => (r.hostAtStart && r.hostAtStart.otherServers) || (r.hostAtEnd && r.hostAtEnd.otherServers))
  if (busy.length) console.log(`note: other cubicle servers ran during ${busy.map((r) => r.runtime).join(', ')}: the numbers are skewed`)
  let failed = false
  for (const r of all) {
    for (const e of r.errors) {
      failed = true
      console.log(`${r.runtime}: ${e}`)
    }
  }
  if (o.json) console.log(JSON.stringify(all, null, 2))
  if (failed) process.exitCode = 1
}

// Exit when done: the harness's stop() leaves a 15 s timer behind.
main().then(
  () => process.exit(process.exitCode || 0),
  (e) => {
    console.error(e && e.stack ? e.stack : e)
    process.exit(1)
  },
)
