'use strict'
// Test harness: starts a real `cubicle serve` (../../bin/cubicle, built by `make build`)
// on a free loopback port with its own data dir, bridge and address pool, creates an API
// key, and points the unmodified e2b SDK at it through the documented env vars.
// Everything it starts is stopped (by PID) and everything it creates is removed in stop().
//
// new Server({ netns, listenAddr }) runs serve inside an existing network namespace
// (/run/netns/<netns>, made by the test, e.g. a "host" whose firewall drops forwarding)
// listening on listenAddr (an address of that namespace the test's process can reach); the
// SDK env then points there, and the leak checks look for links and nft tables in it.
//
// CUBICLE_CLUSTER=1 starts a cluster instead of one serve: ../../bin/cubicle-testcluster
// (test/testcluster) runs a throwaway PostgreSQL, a pure control plane and two `cubicle
// node run` on loopback, and prints the control plane's URL and an API key; the SDKs talk
// to that URL as to a single serve. stop() kills the sandboxes through the API as usual,
// then closes the helper's stdin: it stops every process and removes every bridge, nft
// table, cgroup, mount and dir, and exits non-zero naming whatever was left behind.

const { spawn, execFileSync, spawnSync } = require('node:child_process')
const crypto = require('node:crypto')
const fs = require('node:fs')
const net = require('node:net')
const os = require('node:os')
const path = require('node:path')

const REPO = path.resolve(__dirname, '..', '..', '..')
const CUBICLE = process.env.CUBICLE_BIN || path.join(REPO, 'bin', 'cubicle')
const IMAGES_DIR = process.env.CUBICLE_IMAGES_DIR || '/var/lib/cubicle/images'
const RUNTIME = process.env.CUBICLE_RUNTIME || 'runc'
const LOG_DIR = path.join(__dirname, '..', '.logs')
// Behind a TLS-intercepting proxy the sandboxes need the host's CAs to reach https
// registries (pip, npm); passed when the file exists.
const CA_CERTS = process.env.CUBICLE_CA_CERTIFICATES || '/etc/ssl/certs/ca-certificates.crt'
const DOMAIN = 'cubicle.local'
const CLUSTER = process.env.CUBICLE_CLUSTER === '1'
const TESTCLUSTER = process.env.CUBICLE_TESTCLUSTER_BIN || path.join(REPO, 'bin', 'cubicle-testcluster')

function sleep(ms) {
  return new Promise((r) => setTimeout(r, ms))
}

function canListen(port) {
  return new Promise((resolve) => {
    const s = net.createServer()
    s.unref()
    s.on('error', () => resolve(false))
    s.listen(port, '127.0.0.1', () => s.close(() => resolve(true)))
  })
}

// freePort picks a free loopback port below the kernel's ephemeral range: a port
// from that range (what listen(0) hands out) can be taken by any outgoing
// connection between this check and serve's own bind, which made serve fail with
// "address already in use" under load.
async function freePort() {
  let low = 32768
  try {
    low = parseInt(fs.readFileSync('/proc/sys/net/ipv4/ip_local_port_range', 'utf8').trim().split(/\s+/)[0], 10) || low
  } catch {}
  const from = Math.max(1024, low - 12000)
  for (let i = 0; i < 100; i++) {
    const port = from + crypto.randomInt(0, low - from)
    if (await canListen(port)) return port
  }
  throw new Error(`no free loopback port in ${from}-${low - 1}`)
}

// waitFor polls fn until it returns a truthy value or the deadline passes.
async function waitFor(fn, { timeoutMs = 10000, intervalMs = 100, what = 'condition' } = {}) {
  const deadline = Date.now() + timeoutMs
  let last
  for (;;) {
    try {
      const v = await fn()
      if (v) return v
    } catch (e) {
      last = e
    }
    if (Date.now() > deadline) {
      throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}${last ? `: ${last.message}` : ''}`)
    }
    await sleep(intervalMs)
  }
}

function mountsUnder(dir) {
  // /proc/self/mountinfo field 5 is the mount point (octal-escaped).
  const out = []
  for (const line of fs.readFileSync('/proc/self/mountinfo', 'utf8').split('\n')) {
    const f = line.split(' ')
    if (f.length < 5) continue
    const mp = f[4].replace(/\\([0-7]{3})/g, (_, o) => String.fromCharCode(parseInt(o, 8)))
    if (mp === dir || mp.startsWith(dir + '/')) out.push(mp)
  }
  return out.sort((a, b) => b.length - a.length)
}

function quiet(cmd, args) {
  return spawnSync(cmd, args, { stdio: 'ignore', timeout: 15000 })
}

// containers lists the container IDs under an OCI runtime's state root. runc takes -q
// or --quiet; runsc only -quiet or --quiet (it rejects -q, which once made this list
// silently empty and left gVisor sandboxes running). A failing list is an error.
function containers(bin, rootDir) {
  if (!fs.existsSync(rootDir)) return []
  const r = spawnSync(bin, ['--root', rootDir, 'list', '--quiet'], { encoding: 'utf8', timeout: 15000 })
  if (r.status !== 0) {
    throw new Error(`${bin} --root ${rootDir} list --quiet: status ${r.status}: ${(r.stderr || r.error || '').toString().trim()}`)
  }
  return r.stdout.split('\n').filter(Boolean)
}

// cgroupHierarchies are the cgroup mounts a cgroup parent can live in (v2: one; v1: one
// per controller, symlinks such as cpu -> cpu,cpuacct skipped).
function cgroupHierarchies() {
  if (fs.existsSync('/sys/fs/cgroup/cgroup.controllers')) return ['/sys/fs/cgroup']
  try {
    return fs
      .readdirSync('/sys/fs/cgroup', { withFileTypes: true })
      .filter((e) => e.isDirectory())
      .map((e) => path.join('/sys/fs/cgroup', e.name))
  } catch {
    return []
  }
}

function subdirs(dir) {
  try {
    return fs.readdirSync(dir, { withFileTypes: true }).filter((e) => e.isDirectory()).map((e) => path.join(dir, e.name))
  } catch {
    return []
  }
}

// vethOf is the host veth name of a sandbox: prefix cbv + 8 hex of sha256(id).
function vethOf(id) {
  return 'cbv' + crypto.createHash('sha256').update(id).digest('hex').slice(0, 8)
}

// inNetns is [cmd, args] running cmd in network namespace netns (none: as it is). nsenter
// --net changes only the network namespace: `ip netns exec` also remounts /sys, which hides
// /sys/fs/cgroup from serve and its runtime.
function inNetns(netns, cmd, args) {
  return netns ? ['nsenter', [`--net=/run/netns/${netns}`, cmd, ...args]] : [cmd, args]
}

function linkExists(name, netns = null) {
  return spawnSync(...inNetns(netns, 'ip', ['link', 'show', name]), { stdio: 'ignore', timeout: 15000 }).status === 0
}

function nftTablesOf(bridge, netns = null) {
  const nft = spawnSync(...inNetns(netns, 'nft', ['list', 'tables']), { encoding: 'utf8', timeout: 15000 })
  const out = []
  for (const line of (nft.stdout || '').split('\n')) {
    const m = /^table (\S+) (\S+)$/.exec(line.trim())
    if (m && m[2].endsWith(`_${bridge}`)) out.push([m[1], m[2]])
  }
  return out
}

// pruneLogs removes logs (and cluster log dirs) older than a day.
function pruneLogs() {
  for (const f of fs.readdirSync(LOG_DIR)) {
    const fp = path.join(LOG_DIR, f)
    try {
      if (Date.now() - fs.statSync(fp).mtimeMs > 24 * 3600 * 1000) fs.rmSync(fp, { recursive: true, force: true })
    } catch {}
  }
}

class Server {
  constructor({ runtime = RUNTIME, imagesDir = IMAGES_DIR, netns = null, listenAddr = '127.0.0.1' } = {}) {
    if (netns && listenAddr === '127.0.0.1') {
      throw new Error('Server({ netns }) needs a listenAddr of that namespace reachable from here')
    }
    this.runtime = runtime
    this.imagesDir = imagesDir
    this.netns = netns
    this.listenAddr = listenAddr
    this.proc = null
    this.stderrTail = ''
    this.sandboxes = []
    // Every sandbox ID this server had (tracked, or listed at stop), for the leak check.
    this.seen = new Set()
  }

  // track registers an SDK sandbox so stop() kills it even when a test failed midway.
  track(sbx) {
    this.sandboxes.push(sbx)
    if (sbx && sbx.sandboxId) this.seen.add(sbx.sandboxId)
    return sbx
  }

  // ensure starts the server once; every caller gets the same promise. Test files call
  // it at the top of their own before() hooks.
  ensure(extraArgs = []) {
    if (!this._started) this._started = this.start(extraArgs)
    return this._started
  }

  async start(extraArgs = []) {
    if (CLUSTER) return this.startCluster(extraArgs)
    if (!fs.existsSync(CUBICLE)) {
      throw new Error(`${CUBICLE} not found: run \`make build\` first`)
    }
    if (!fs.existsSync(path.join(this.imagesDir, 'base', 'rootfs'))) {
      throw new Error(`${this.imagesDir}/base/rootfs not found: run \`scripts/install\` (or scripts/build-rootfs)`)
    }
    this.dataDir = fs.mkdtempSync(path.join(os.tmpdir(), 'cubicle-e2e-'))
    this.port = await freePort()
    // /metrics has a listener of its own (serve --metrics-listen), never the API's.
    this.metricsPort = await freePort()
    while (this.metricsPort === this.port) this.metricsPort = await freePort()
    const rand = crypto.randomBytes(3).toString('hex')
    this.bridge = `cbe${rand}`
    this.cgroupParent = `cubicle-e2e-${rand}`
    this.pool = `10.212.${crypto.randomInt(0, 256)}.0/24`
    this.url = `http://${this.listenAddr}:${this.port}`
    this.metricsUrl = `http://${this.listenAddr}:${this.metricsPort}`

    this.apiKey = execFileSync(CUBICLE, ['apikey', 'create', '--data-dir', this.dataDir, '--name', 'e2e'], {
      encoding: 'utf8',
      timeout: 30000,
    }).trim()
    if (!/^e2b_[0-9a-f]+$/.test(this.apiKey)) {
      throw new Error(`cubicle apikey create printed ${JSON.stringify(this.apiKey)}, want e2b_<hex>`)
    }

    fs.mkdirSync(LOG_DIR, { recursive: true })
    const testName = process.env.CUBICLE_LOG_NAME || path.basename(process.argv[1] || 'test', '.js')
    // One log per server (concurrent suites must not share a file); prune old ones.
    pruneLogs()
    this.logPath = path.join(LOG_DIR, `${testName}.${process.pid}.log`)
    const logFd = fs.openSync(this.logPath, 'w')
    const args = [
      'serve',
      '--data-dir', this.dataDir,
      '--listen', `${this.listenAddr}:${this.port}`,
      '--metrics-listen', `${this.listenAddr}:${this.metricsPort}`,
      '--images-dir', this.imagesDir,
      '--runtime', this.runtime,
      '--domain', DOMAIN,
      '--bridge', this.bridge,
      '--pool', this.pool,
      '--cgroup-parent', this.cgroupParent,
      ...(fs.existsSync(CA_CERTS) ? ['--ca-certificates', CA_CERTS] : []),
      ...extraArgs,
    ]
    // nsenter execs serve in place, so this.proc.pid is serve's.
    this.proc = spawn(...inNetns(this.netns, CUBICLE, args), { stdio: ['ignore', 'pipe', 'pipe'] })
    this.exited = new Promise((resolve) => this.proc.once('exit', (code, sig) => resolve({ code, sig })))
    const onData = (chunk) => {
      fs.writeSync(logFd, chunk)
      this.stderrTail = (this.stderrTail + chunk.toString()).slice(-20000)
    }
    this.proc.stdout.on('data', onData)
    this.proc.stderr.on('data', onData)
    this.exited.then(() => fs.closeSync(logFd))
    let dead = null
    this.exited.then((r) => (dead = r))

    await waitFor(
      async () => {
        if (dead) throw new Error(`cubicle serve exited early (${JSON.stringify(dead)}):\n${this.stderrTail}`)
        const res = await fetch(`${this.url}/health`, { signal: AbortSignal.timeout(1000) })
        return res.status === 200 || res.status === 204
      },
      { timeoutMs: 30000, intervalMs: 100, what: `GET ${this.url}/health` },
    ).catch((e) => {
      if (dead) throw new Error(`cubicle serve exited early (${JSON.stringify(dead)}):\n${this.stderrTail}`)
      throw e
    })

    process.env.E2B_API_URL = this.url
    process.env.E2B_SANDBOX_URL = this.url
    process.env.E2B_API_KEY = this.apiKey
    process.env.E2B_DOMAIN = DOMAIN
    // The volume-content API is served by the same listener.
    process.env.E2B_VOLUME_API_URL = this.url
    delete process.env.E2B_DEBUG
    return this
  }

  // startCluster starts cubicle-testcluster and points the SDK env at its control plane.
  async startCluster(extraArgs) {
    if (extraArgs.length || this.netns) {
      throw new Error(`CUBICLE_CLUSTER=1: this test file starts serve with its own flags (${JSON.stringify(extraArgs)}${this.netns ? `, netns ${this.netns}` : ''}), which the cluster harness does not take: run it without CUBICLE_CLUSTER`)
    }
    if (!fs.existsSync(TESTCLUSTER)) throw new Error(`${TESTCLUSTER} not found: run \`make build\` first`)
    fs.mkdirSync(LOG_DIR, { recursive: true })
    pruneLogs()
    const testName = process.env.CUBICLE_LOG_NAME || path.basename(process.argv[1] || 'test', '.js')
    const logDir = path.join(LOG_DIR, `cluster.${testName}.${process.pid}`)
    const args = ['--cubicle', CUBICLE, '--images-dir', this.imagesDir, '--runtime', this.runtime, '--domain', DOMAIN, '--log-dir', logDir]
    if (fs.existsSync(CA_CERTS)) args.push('--ca-certificates', CA_CERTS)
    this.proc = spawn(TESTCLUSTER, args, { stdio: ['pipe', 'pipe', 'pipe'] })
    this.exited = new Promise((resolve) => this.proc.once('exit', (code, sig) => resolve({ code, sig })))
    this.proc.stderr.on('data', (chunk) => {
      this.stderrTail = (this.stderrTail + chunk.toString()).slice(-20000)
    })
    let out = ''
    const ready = await new Promise((resolve, reject) => {
      this.proc.stdout.on('data', (chunk) => {
        out += chunk.toString()
        const nl = out.indexOf('\n')
        if (nl >= 0) {
          try {
            resolve(JSON.parse(out.slice(0, nl)))
          } catch (e) {
            reject(new Error(`cubicle-testcluster printed ${JSON.stringify(out.slice(0, nl))}: ${e.message}`))
          }
        }
      })
      this.exited.then((r) => reject(new Error(`cubicle-testcluster exited early (${JSON.stringify(r)}):\n${this.stderrTail}`)))
    })
    this.cluster = ready
    this.url = ready.url
    this.apiKey = ready.apiKey
    this.logPath = logDir
    process.env.E2B_API_URL = this.url
    process.env.E2B_SANDBOX_URL = this.url
    process.env.E2B_API_KEY = this.apiKey
    process.env.E2B_DOMAIN = DOMAIN
    process.env.E2B_VOLUME_API_URL = this.url
    delete process.env.E2B_DEBUG
    return this
  }

  // stopCluster kills every sandbox through the API, then has cubicle-testcluster tear
  // the cluster down and check the nodes for leftovers.
  async stopCluster() {
    const alive = () => this.proc && this.proc.exitCode === null && this.proc.signalCode === null
    if (alive()) {
      await this.killAll()
      this.proc.stdin.end()
    }
    let timer
    const r = await Promise.race([this.exited, new Promise((resolve) => (timer = setTimeout(resolve, 90000, null)))])
    clearTimeout(timer)
    if (r === null) {
      try {
        process.kill(this.proc.pid, 'SIGKILL')
      } catch {}
      throw new Error(`cubicle-testcluster did not stop within 90 s:\n${this.stderrTail}`)
    }
    if (r.code !== 0) throw new Error(`cubicle-testcluster (${this.runtime}) ${JSON.stringify(r)}; logs in ${this.logPath}:\n${this.stderrTail}`)
    // Start and stop times and where the sandboxes ran, as test diagnostics.
    for (const m of this.stderrTail.matchAll(/^cubicle-testcluster: ((ready in|sandboxes per node|stopped in).*)$/gm)) console.log(m[1])
  }

  // killAll kills tracked sandboxes through the SDK, then whatever the server still lists.
  async killAll() {
    if (this.sandboxes.length) {
      await Promise.allSettled(this.sandboxes.map((s) => s.kill({ requestTimeoutMs: 20000 })))
    }
    // Sandboxes a test created without track() (or whose kill failed), paused ones too.
    for (let page = 0; page < 20; page++) {
      let r
      try {
        r = await this.api('GET', '/v2/sandboxes?limit=100')
      } catch {
        break
      }
      if (r.status !== 200 || !Array.isArray(r.json) || r.json.length === 0) break
      for (const sb of r.json) {
        this.seen.add(sb.sandboxID)
        await this.api('DELETE', `/sandboxes/${sb.sandboxID}`).catch(() => {})
      }
    }
  }

  // api is a raw-fetch helper for the control plane.
  async api(method, p, { body, headers = {}, apiKey = this.apiKey, raw } = {}) {
    const h = { ...headers }
    if (apiKey !== null) h['X-API-KEY'] = apiKey
    let payload
    if (raw !== undefined) payload = raw
    else if (body !== undefined) {
      payload = JSON.stringify(body)
      h['Content-Type'] = 'application/json'
    }
    const res = await fetch(this.url + p, { method, headers: h, body: payload, signal: AbortSignal.timeout(60000) })
    const text = await res.text()
    let json
    try {
      json = text ? JSON.parse(text) : undefined
    } catch {
      json = undefined
    }
    return { status: res.status, headers: res.headers, text, json }
  }

  tail(n = 4000) {
    return this.stderrTail.slice(-n)
  }

  // stateRoot is the --root of the server's OCI driver (<data>/run/<runtime>).
  stateRoot() {
    return path.join(this.dataDir, 'run', this.runtime)
  }

  // sandboxLeftovers lists what the server's sandboxes left on the host once every
  // sandbox was killed and the server stopped: containers in its state root, netns
  // files, host veths (on its bridge or named for a sandbox it had), cgroups under its
  // cgroup parent, sandbox dirs and mounts.
  sandboxLeftovers() {
    const left = []
    try {
      const ids = containers(this.runtime, this.stateRoot())
      if (ids.length) left.push(`containers in ${this.stateRoot()}: ${ids.join(' ')}`)
    } catch (e) {
      left.push(e.message)
    }
    const nsDir = path.join('/run/cubicle', this.bridge, 'netns')
    try {
      for (const e of fs.readdirSync(nsDir, { withFileTypes: true })) {
        if (e.isFile()) left.push(`netns file ${path.join(nsDir, e.name)}`)
      }
    } catch {}
    try {
      for (const f of fs.readdirSync(path.join(nsDir, '.addr'))) left.push(`netns address record ${f}`)
    } catch {}
    const links = spawnSync(...inNetns(this.netns, 'ip', ['-o', 'link', 'show', 'master', this.bridge]), { encoding: 'utf8', timeout: 15000 })
    for (const l of (links.stdout || '').split('\n').filter(Boolean)) left.push(`link on bridge ${this.bridge}: ${l}`)
    for (const id of this.seen) {
      if (linkExists(vethOf(id), this.netns)) left.push(`host veth ${vethOf(id)} of sandbox ${id}`)
    }
    for (const h of cgroupHierarchies()) {
      for (const d of subdirs(path.join(h, this.cgroupParent))) left.push(`cgroup ${d}`)
    }
    // Each sandbox's own dir, its root-only state dir (sandboxes/.private/<id>) and its
    // disk image in the reflink disk store (disk-store/disks/<id>.img).
    const dirs = [path.join(this.dataDir, 'sandboxes'), path.join(this.dataDir, 'sandboxes', '.private'), path.join(this.dataDir, 'disk-store', 'disks')]
    for (const dir of dirs) {
      try {
        for (const f of fs.readdirSync(dir)) if (f !== '.private') left.push(`sandbox dir ${path.join(path.basename(dir), f)}`)
      } catch {}
    }
    // runsc keeps one null-netns bind mount per state root; it is the runtime's. The
    // disk store stays mounted after serve stops, as the data dir's filesystem would, and
    // so does a kept snapshot's layer that is a clone of a disk.
    const runRoot = path.join(this.dataDir, 'run')
    const store = path.join(this.dataDir, 'disk-store')
    for (const mp of [...mountsUnder(path.join('/run/cubicle', this.bridge)), ...mountsUnder(this.dataDir)]) {
      if (!mp.startsWith(runRoot + '/') && mp !== store && !this.snapshotLayerMount(mp)) left.push(`mount ${mp}`)
    }
    return left
  }

  // snapshotLayerMount: mp is snapshots/<id>/rootfs of a kept snapshot whose layer is a
  // clone of a disk (marked by snapshots/<id>/layer-disk).
  snapshotLayerMount(mp) {
    const snap = path.dirname(mp)
    return path.basename(mp) === 'rootfs' && path.dirname(snap) === path.join(this.dataDir, 'snapshots') &&
      fs.existsSync(path.join(snap, 'layer-disk'))
  }

  // infraLeftovers lists what survived the clean-up: the bridge, nft tables, cgroup
  // parent, netns dir and data dir must all be gone.
  infraLeftovers() {
    const left = []
    if (linkExists(this.bridge, this.netns)) left.push(`bridge ${this.bridge}`)
    for (const [fam, name] of nftTablesOf(this.bridge, this.netns)) left.push(`nft table ${fam} ${name}`)
    for (const h of cgroupHierarchies()) {
      if (fs.existsSync(path.join(h, this.cgroupParent))) left.push(`cgroup parent ${path.join(h, this.cgroupParent)}`)
    }
    for (const d of [path.join('/run/cubicle', this.bridge), this.dataDir]) {
      if (fs.existsSync(d)) left.push(`dir ${d}`)
    }
    return left
  }

  // stop kills every sandbox (tracked ones through the SDK, then whatever the server
  // still lists), stops the server, removes everything it created and throws (failing
  // the test file) if the sandboxes left anything behind or the clean-up missed anything.
  async stop() {
    if (this.cluster || (CLUSTER && this.proc)) return this.stopCluster()
    const alive = () => this.proc && this.proc.exitCode === null && this.proc.signalCode === null
    let leaks = []
    const wasAlive = alive()
    if (wasAlive) await this.killAll()
    if (alive()) {
      try {
        process.kill(this.proc.pid, 'SIGTERM')
      } catch {}
      const t = await Promise.race([this.exited, sleep(15000).then(() => null)])
      if (t === null) {
        try {
          process.kill(this.proc.pid, 'SIGKILL')
        } catch {}
        await Promise.race([this.exited, sleep(5000)])
      }
    }
    if (!this.dataDir) return
    if (wasAlive) leaks = this.sandboxLeftovers()
    // Remove whatever is left: containers first, by the runtime with the server's own
    // state roots (<data>/run/<driver>), so no sandbox keeps running once its state dir
    // is gone; then veths, the bridge, cgroups, mounts, nft tables and the data dir.
    for (const drv of ['runc', 'runsc']) {
      const rootDir = path.join(this.dataDir, 'run', drv)
      let ids = []
      try {
        ids = containers(drv, rootDir)
      } catch (e) {
        leaks.push(e.message)
      }
      for (const id of ids) {
        quiet(drv, ['--root', rootDir, 'kill', id, 'KILL'])
        quiet(drv, ['--root', rootDir, 'delete', '--force', id])
      }
      try {
        const still = containers(drv, rootDir)
        if (still.length) leaks.push(`containers survived delete --force in ${rootDir}: ${still.join(' ')}`)
      } catch {}
    }
    for (const id of this.seen) quiet(...inNetns(this.netns, 'ip', ['link', 'del', vethOf(id)]))
    quiet(...inNetns(this.netns, 'ip', ['link', 'del', this.bridge]))
    for (const h of cgroupHierarchies()) {
      for (const d of subdirs(path.join(h, this.cgroupParent))) {
        try {
          fs.rmdirSync(d)
        } catch {}
      }
      try {
        fs.rmdirSync(path.join(h, this.cgroupParent))
      } catch {}
    }
    // netns bind mounts (default --netns-dir /run/cubicle/<bridge>/netns) and our data dir.
    const runDir = path.join('/run/cubicle', this.bridge)
    for (const mp of [...mountsUnder(runDir), ...mountsUnder(this.dataDir)]) quiet('umount', ['-l', mp])
    fs.rmSync(runDir, { recursive: true, force: true })
    // nftables tables this server created for its bridge (named cubicle_<bridge>).
    for (const [fam, name] of nftTablesOf(this.bridge, this.netns)) quiet(...inNetns(this.netns, 'nft', ['delete', 'table', fam, name]))
    fs.rmSync(this.dataDir, { recursive: true, force: true, maxRetries: 3 })
    leaks.push(...this.infraLeftovers())
    this.dataDir = null
    if (leaks.length) {
      throw new Error(`cubicle server ${this.bridge} (${this.runtime}) left host state behind:\n  ${leaks.join('\n  ')}`)
    }
  }
}

// setup() registers before/after hooks on the calling test file and returns the server
// (opts: Server's, e.g. { netns, listenAddr }).
function setup(t = require('node:test'), extraArgs = [], opts = {}) {
  const srv = new Server(opts)
  t.before(async () => {
    await srv.ensure(extraArgs)
  })
  t.after(async () => {
    await srv.stop()
  })
  return srv
}

module.exports = { Server, setup, waitFor, sleep, freePort, inNetns, REPO, IMAGES_DIR, DOMAIN, CLUSTER }
