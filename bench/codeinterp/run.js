#!/usr/bin/env node
'use strict'
// Code-interpreter and real-image benchmark.
//
//   node bench/codeinterp/run.js [--samples N] [--pool N] [--pool-settle-ms MS]
//                                [--runtime runc|runsc] [--no-mini] [--build]
//                                [--max-seconds S] [--json]
//
// It starts its own `cubicle serve` (the JS test harness's Server: temp data dir, free
// loopback port, own bridge, pool and cgroup parent; the host's CA bundle when present)
// and measures, in one invocation, with the unmodified SDKs:
//   - create → first runCode('1+1') on code-interpreter-v1, N samples one at a time
//     (a 404 "no code interpreter" while the port is not up yet is retried and counted):
//     unpooled, then pooled (the template's warm pool set to --pool, default 2, and
//     full before each create; once right when it reports full, once --pool-settle-ms,
//     default 5000, later, which shows what a standby's interpreter still does after
//     it counts as ready), with the ratios pooled/unpooled; targets: pooled p50
//     <= 150 ms, unpooled p50 <= 1.5 s;
//   - create → first commands.run('true') on base (the Debian image) and on `mini` (a
//     busybox image, built once with `scripts/build-rootfs --fast` into
//     <images>/mini/rootfs when absent; --no-mini skips it), with the ratio base/mini;
//   - the idle PSS of one code-interpreter sandbox with its warm kernel: after the
//     first runCode and 2 s of idle, Pss (/proc/<pid>/smaps_rollup) of every process in
//     the sandbox's cgroup, per process and in total; goal <= 60 MiB;
//   - image sizes (du -sb of base, the code-interpreter-v1 layer and mini). With
//     --build it also times scripts/build-code-interpreter into a temp dir (minutes);
//     otherwise build times are those in scripts/install's log.
// Everything it starts is killed and removed before it exits. Run as root.

const path = require('node:path')
const fs = require('node:fs')
const os = require('node:os')
const { spawnSync } = require('node:child_process')

const REPO = path.resolve(__dirname, '..', '..')
process.env.CUBICLE_LOG_NAME = process.env.CUBICLE_LOG_NAME || 'bench-codeinterp'
const E2B_DIR = path.join(REPO, 'test', 'e2b-js')
const { Server } = require(path.join(E2B_DIR, 'tests', 'harness.js'))
const { Sandbox, NotFoundError } = require(require.resolve('@e2b/code-interpreter', { paths: [E2B_DIR] }))

const CI = 'code-interpreter-v1'
const MINI = 'mini'
const TARGET = { pooledP50: 150, unpooledP50: 1500, idleMiB: 60 }

function parseArgs(argv) {
  const o = {
    samples: 10,
    pool: 2,
    poolSettle: 5000,
    runtime: process.env.CUBICLE_RUNTIME || 'runc',
    mini: true,
    build: false,
    maxSeconds: 1200,
    json: false,
  }
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i]
    const next = () => {
      if (i + 1 >= argv.length) throw new Error(`${a} needs a value`)
      return argv[++i]
    }
    switch (a) {
      case '--samples': o.samples = Number(next()); break
      case '--pool': o.pool = Number(next()); break
      case '--pool-settle-ms': o.poolSettle = Number(next()); break
      case '--runtime': o.runtime = next(); break
      case '--no-mini': o.mini = false; break
      case '--build': o.build = true; break
      case '--max-seconds': o.maxSeconds = Number(next()); break
      case '--json': o.json = true; break
      case '-h': case '--help':
        console.log(fs.readFileSync(__filename, 'utf8').split('\n').slice(2).filter((l, i, a) => a.slice(0, i + 1).every((x) => x.startsWith('//')))
          .map((l) => l.replace(/^\/\/ ?/, '')).join('\n'))
        process.exit(0)
      default: throw new Error(`unknown argument ${a}`)
    }
  }
  if (!(o.samples >= 1)) throw new Error('--samples must be >= 1')
  if (!(o.pool >= 1)) throw new Error('--pool must be >= 1')
  return o
}

// ---- statistics ----------------------------------------------------------------------
const { summary, f1 } = require('../lib/stats')
const pool = require('../lib/pool')
const mib = (kib) => kib / 1024
function row(name, st, target) {
  const t = target === undefined ? '' : `  target p50 <= ${target} ms: ${st.p50 <= target ? 'met' : 'MISSED'}`
  return `${name.padEnd(42)} n=${String(st.n).padStart(3)}  p50=${f1(st.p50).padStart(8)} ms  p95=${f1(st.p95).padStart(8)} ms  p99=${f1(st.p99).padStart(8)} ms${t}`
}
function ratioLine(name, a, b) {
  if (!a.n || !b.n) return `${name.padEnd(42)} n/a`
  return `${name.padEnd(42)} p50=${(a.p50 / b.p50).toFixed(2)}x  p95=${(a.p95 / b.p95).toFixed(2)}x  p99=${(a.p99 / b.p99).toFixed(2)}x`
}
const errTail = (errors) => (errors.length ? `  errors=${errors.length} (${errors[0]})` : '')
const elapsedMs = (t0) => Number(process.hrtime.bigint() - t0) / 1e6
const errText = (e) => String(e && e.message ? e.message : e).slice(0, 200)

// ---- measurements --------------------------------------------------------------------
// firstRun is the time from Sandbox.create(template) to the end of the first call of
// what(sbx) (which throws when the sandbox answered wrongly); the sandbox is killed.
async function firstRun(template, what, n, deadline) {
  const samples = []
  const errors = []
  for (let i = 0; i < n && Date.now() < deadline; i++) {
    const t0 = process.hrtime.bigint()
    let sbx
    try {
      sbx = await Sandbox.create(template, { timeoutMs: 300000, requestTimeoutMs: 120000 })
      await what(sbx)
      samples.push(elapsedMs(t0))
    } catch (e) {
      errors.push(errText(e))
    } finally {
      if (sbx) await sbx.kill({ requestTimeoutMs: 60000 }).catch(() => {})
    }
  }
  return { samples, errors }
}

// notReady counts the runCode calls refused because nothing listened on the code
// interpreter's port yet (the proxy's 404 right after create). Such a call is retried
// every 20 ms: the sample is the time until a user's retry loop would get the result.
let notReady = 0
async function runCodeOnePlusOne(sbx) {
  let ex
  for (const until = Date.now() + 60000; ;) {
    try {
      ex = await sbx.runCode('1+1', { timeoutMs: 120000, requestTimeoutMs: 120000 })
      break
    } catch (e) {
      if (!(e instanceof NotFoundError && /no code interpreter/.test(e.message)) || Date.now() > until) throw e
      notReady++
      await new Promise((r) => setTimeout(r, 20))
    }
  }
  if (ex.error) throw new Error(`runCode: ${ex.error.name}: ${ex.error.value}`)
  if (ex.text !== '2') throw new Error(`runCode('1+1') gave ${JSON.stringify(ex.text)}`)
}
async function runTrue(sbx) {
  const r = await sbx.commands.run('true', { requestTimeoutMs: 60000 })
  if (r.exitCode !== 0) throw new Error(`true exited ${r.exitCode}`)
}

// ---- warm pool -----------------------------------------------------------------------
async function claimCounts(srv) {
  const r = await fetch(srv.metricsUrl + '/metrics', { signal: AbortSignal.timeout(30000) })
  const text = await r.text()
  const get = (res) => Number((new RegExp(`^cubicle_pool_claims_total\\{result="${res}"\\} (\\S+)$`, 'm').exec(text) || [])[1] || 0)
  return { hit: get('hit'), miss: get('miss') }
}
// pooledFirstRun measures n pooled creates, each on a full pool: right after the pool
// reported full, then settleMs later (the standbys' interpreters warming up after boot).
async function pooledFirstRun(srv, o, settleMs, deadline) {
  const samples = []
  const errors = []
  const before = await claimCounts(srv)
  for (let i = 0; i < o.samples && Date.now() < deadline; i++) {
    await pool.waitPool(srv, CI, o.pool, deadline)
    if (settleMs) await new Promise((r) => setTimeout(r, settleMs))
    const r = await firstRun(CI, runCodeOnePlusOne, 1, deadline)
    samples.push(...r.samples)
    errors.push(...r.errors)
  }
  const after = await claimCounts(srv)
  return { samples, errors, hits: after.hit - before.hit, misses: after.miss - before.miss }
}
// drainPool sets the pool to 0 and waits until no sandbox of the server is left on the
// host: standbys are not listed, and one still booting when the size dropped is not
// counted as ready, so the pool's own count is not enough before the server stops.
async function drainPool(srv) {
  await pool.setPool(srv, CI, 0)
  const deadline = Date.now() + 120000
  await pool.waitPool(srv, CI, 0, deadline)
  const hier = fs.existsSync('/sys/fs/cgroup/cgroup.controllers') ? '/sys/fs/cgroup' : '/sys/fs/cgroup/memory'
  const parent = path.join(hier, srv.cgroupParent)
  let emptySince = 0
  while (Date.now() < deadline) {
    let n = 0
    try {
      n = fs.readdirSync(parent, { withFileTypes: true }).filter((e) => e.isDirectory()).length
    } catch {}
    if (n > 0) emptySince = 0
    else if (!emptySince) emptySince = Date.now()
    else if (Date.now() - emptySince > 1500) return
    await new Promise((r) => setTimeout(r, 100))
  }
  throw new Error(`sandboxes still under ${parent} after the pool drain`)
}

// ---- idle memory ---------------------------------------------------------------------
// sandboxCgroup is the sandbox's cgroup holding its processes: <parent>/<id> in the
// unified hierarchy, or in the v1 memory controller's.
function sandboxCgroup(srv, id) {
  if (fs.existsSync('/sys/fs/cgroup/cgroup.controllers')) return path.join('/sys/fs/cgroup', srv.cgroupParent, id)
  return path.join('/sys/fs/cgroup/memory', srv.cgroupParent, id)
}
// cgroupPids lists the PIDs of a cgroup and its descendants.
function cgroupPids(dir) {
  const pids = []
  const walk = (d) => {
    try {
      pids.push(...fs.readFileSync(path.join(d, 'cgroup.procs'), 'utf8').split('\n').filter(Boolean).map(Number))
    } catch {
      return
    }
    for (const e of fs.readdirSync(d, { withFileTypes: true })) if (e.isDirectory()) walk(path.join(d, e.name))
  }
  walk(dir)
  return [...new Set(pids)]
}
function readProc(pid, file) {
  try {
    return fs.readFileSync(`/proc/${pid}/${file}`, 'utf8')
  } catch {
    return ''
  }
}
function pssKiB(pid) {
  const m = /^Pss:\s+(\d+) kB/m.exec(readProc(pid, 'smaps_rollup'))
  return m ? Number(m[1]) : 0
}
// role names a sandbox process: the agent, a Jupyter kernel, or its command.
function role(pid) {
  const argv = readProc(pid, 'cmdline').split('\0').filter(Boolean)
  const cmd = argv.join(' ')
  const comm = readProc(pid, 'comm').trim()
  if (/cubicle-agent/.test(cmd) || comm === 'cubicle-agent') return 'agent'
  if (/ipykernel|ipykernel_launcher/.test(cmd)) return 'kernel (python)'
  if (/bash_kernel/.test(cmd)) return 'kernel (bash)'
  return comm || '?'
}
async function idleMemory(srv) {
  const sbx = await Sandbox.create(CI, { timeoutMs: 300000, requestTimeoutMs: 120000 })
  try {
    await runCodeOnePlusOne(sbx)
    await new Promise((r) => setTimeout(r, 2000))
    const cg = sandboxCgroup(srv, sbx.sandboxId)
    const procs = cgroupPids(cg).map((pid) => ({
      pid,
      role: role(pid),
      cmd: readProc(pid, 'cmdline').split('\0').filter(Boolean).join(' ').slice(0, 100),
      pssKiB: pssKiB(pid),
    }))
    const totalKiB = procs.reduce((a, p) => a + p.pssKiB, 0)
    return { id: sbx.sandboxId, cgroup: cg, procs, totalKiB }
  } finally {
    await sbx.kill({ requestTimeoutMs: 60000 }).catch(() => {})
  }
}

// ---- images --------------------------------------------------------------------------
function duBytes(dir) {
  const r = spawnSync('du', ['-sb', dir], { encoding: 'utf8', timeout: 600000 })
  if (r.status !== 0) return NaN
  return Number(r.stdout.split(/\s+/)[0])
}
function runTimed(cmd, args) {
  const t0 = process.hrtime.bigint()
  const r = spawnSync(cmd, args, { stdio: ['ignore', 'ignore', 'pipe'], timeout: 3600000 })
  if (r.status !== 0) throw new Error(`${cmd} ${args.join(' ')}: status ${r.status}: ${(r.stderr || '').toString().trim().slice(-500)}`)
  return elapsedMs(t0)
}
// ensureMini builds the mini image when absent and returns its build time (null when
// it already existed).
function ensureMini(imagesDir) {
  const rootfs = path.join(imagesDir, MINI, 'rootfs')
  if (fs.existsSync(path.join(rootfs, 'bin', 'sh'))) return null
  return runTimed(path.join(REPO, 'scripts', 'build-rootfs'), ['--fast', rootfs])
}
function buildCodeInterpreter(imagesDir) {
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'cubicle-bench-ci-'))
  const out = path.join(tmp, 'layer')
  try {
    const ms = runTimed(path.join(REPO, 'scripts', 'build-code-interpreter'), [path.join(imagesDir, 'base', 'rootfs'), out])
    return { ms, bytes: duBytes(out) }
  } finally {
    fs.rmSync(tmp, { recursive: true, force: true })
  }
}

async function main() {
  const o = parseArgs(process.argv.slice(2))
  if (process.getuid && process.getuid() !== 0) throw new Error('run as root')
  const deadline = Date.now() + o.maxSeconds * 1000
  const srv = new Server({ runtime: o.runtime })
  const res = { runtime: o.runtime, samples: o.samples, pool: o.pool, targets: TARGET }
  const cleanup = async () => {
    await srv.stop().catch((e) => console.error('cleanup:', e.message))
  }
  process.once('SIGINT', () => cleanup().then(() => process.exit(130)))
  process.once('SIGTERM', () => cleanup().then(() => process.exit(143)))

  if (o.mini) {
    const ms = ensureMini(srv.imagesDir)
    if (ms !== null) console.log(`built ${path.join(srv.imagesDir, MINI, 'rootfs')} in ${f1(ms / 1000)} s`)
    res.miniBuildMs = ms
  }
  try {
    await srv.start()
    console.log(`cubicle serve at ${srv.url} (runtime ${o.runtime}, data ${srv.dataDir})`)
    // Warm-up: the first create pays one-off costs (bridge, nftables, page cache).
    await firstRun(CI, runCodeOnePlusOne, 1, deadline)
    await firstRun('base', runTrue, 1, deadline)

    console.log('\ncreate → first result')
    notReady = 0
    const un = await firstRun(CI, runCodeOnePlusOne, o.samples, deadline)
    res.unpooled = { ...summary(un.samples), notReady, errors: un.errors.slice(0, 3), errorCount: un.errors.length }
    console.log(row(`${CI} runCode, unpooled`, res.unpooled, TARGET.unpooledP50) + `  not-ready 404s=${notReady}` + errTail(un.errors))

    await pool.setPool(srv, CI, o.pool)
    try {
      for (const [key, settle] of [['pooled', 0], ...(o.poolSettle > 0 ? [['pooledSettled', o.poolSettle]] : [])]) {
        notReady = 0
        const po = await pooledFirstRun(srv, o, settle, deadline)
        res[key] = { ...summary(po.samples), settleMs: settle, hits: po.hits, misses: po.misses, notReady, errors: po.errors.slice(0, 3), errorCount: po.errors.length }
        console.log(row(`${CI} runCode, pool=${o.pool}${settle ? ` +${settle / 1000}s` : ''}`, res[key], TARGET.pooledP50) +
          `  hits=${po.hits} misses=${po.misses} not-ready 404s=${notReady}` + errTail(po.errors))
      }
    } finally {
      await drainPool(srv).catch((e) => console.error('pool drain:', e.message))
    }
    console.log(ratioLine('ratio pooled / unpooled', res.pooled, res.unpooled))
    if (res.pooledSettled) console.log(ratioLine('ratio pooled +settle / unpooled', res.pooledSettled, res.unpooled))

    const base = await firstRun('base', runTrue, o.samples, deadline)
    res.base = { ...summary(base.samples), errors: base.errors.slice(0, 3), errorCount: base.errors.length }
    console.log(row('base commands.run(true)', res.base) + errTail(base.errors))
    if (o.mini) {
      const mini = await firstRun(MINI, runTrue, o.samples, deadline)
      res.mini = { ...summary(mini.samples), errors: mini.errors.slice(0, 3), errorCount: mini.errors.length }
      console.log(row('mini commands.run(true)', res.mini) + errTail(mini.errors))
      console.log(ratioLine('ratio base / mini', res.base, res.mini))
    }
    console.log(ratioLine(`ratio ${CI} unpooled / base`, res.unpooled, res.base))

    const mem = await idleMemory(srv)
    res.idle = mem
    console.log(`\nidle PSS of one ${CI} sandbox after its first runCode (+2 s), cgroup ${mem.cgroup}`)
    for (const p of mem.procs) console.log(`  ${String(p.pid).padStart(8)}  ${p.role.padEnd(16)} ${f1(mib(p.pssKiB)).padStart(7)} MiB  ${p.cmd}`)
    const byRole = {}
    for (const p of mem.procs) byRole[p.role] = (byRole[p.role] || 0) + p.pssKiB
    res.idle.byRoleKiB = byRole
    console.log('  ' + Object.entries(byRole).map(([r, k]) => `${r}=${f1(mib(k))} MiB`).join('  '))
    const total = mib(mem.totalKiB)
    console.log(`  total ${f1(total)} MiB over ${mem.procs.length} processes  goal <= ${TARGET.idleMiB} MiB: ${mem.procs.length && total <= TARGET.idleMiB ? 'met' : 'MISSED'}`)
  } finally {
    await cleanup()
  }

  console.log('\nimages (du -sb)')
  const sizes = {
    base: duBytes(path.join(srv.imagesDir, 'base', 'rootfs')),
    [`${CI} layer`]: duBytes(path.join(srv.imagesDir, CI, 'rootfs')),
  }
  if (o.mini) sizes.mini = duBytes(path.join(srv.imagesDir, MINI, 'rootfs'))
  res.imageBytes = sizes
  for (const [k, v] of Object.entries(sizes)) console.log(`  ${k.padEnd(26)} ${f1(v / 2 ** 20).padStart(8)} MiB`)
  if (o.mini && sizes.mini) console.log(`  ratio base / mini size     ${(sizes.base / sizes.mini).toFixed(1)}x`)
  if (o.build) {
    const b = buildCodeInterpreter(srv.imagesDir)
    res.ciBuild = b
    console.log(`  scripts/build-code-interpreter: ${f1(b.ms / 1000)} s, layer ${f1(b.bytes / 2 ** 20)} MiB`)
  } else {
    console.log('  build times: see scripts/install\'s log (or pass --build to time scripts/build-code-interpreter, minutes)')
  }
  if (o.json) console.log(JSON.stringify(res, null, 2))
}

main().catch((e) => {
  console.error(e && e.stack ? e.stack : e)
  process.exit(1)
})
