'use strict'
// Sandbox networking on a host whose iptables FORWARD policy is DROP (what Docker, ufw and
// firewalld leave behind), through the unmodified SDK. The machine's own firewall is never
// touched: a network namespace of the test's plays the host. It gets a veth to the root
// namespace (a /30 from 198.18.128.0/17; the SDK reaches serve's listen address on it),
// FORWARD policy DROP (and, in the second test, Docker's DOCKER-USER layout), and
// test/testnet attached to it (--attach-netns) as the internet. `cubicle serve` runs inside
// it (harness Server({ netns, listenAddr })); its --host-firewall=auto adds accept rules
// tagged cubicle:<bridge> (internal/network/hostfw_linux.go) and removes them at exit.
const test = require('node:test')
const assert = require('node:assert/strict')
const crypto = require('node:crypto')
const path = require('node:path')
const readline = require('node:readline')
const { spawn, spawnSync } = require('node:child_process')
const { Sandbox, ALL_TRAFFIC } = require('e2b')
const { Server } = require('./harness')

const TESTNET = path.join(__dirname, '..', '..', '..', 'bin', 'cubicle-testnet')

function run(cmd, args) {
  const r = spawnSync(cmd, args, { encoding: 'utf8', timeout: 30000 })
  if (r.status !== 0) throw new Error(`${cmd} ${args.join(' ')}: status ${r.status}: ${r.stderr || r.error}`)
  return r.stdout
}

function ipt(ns, ...args) {
  return run('ip', ['netns', 'exec', ns, 'iptables', '-w', '10', ...args])
}

const toInt = (ip) => ip.split('.').reduce((a, o) => a * 256 + Number(o), 0)
const toIP = (n) => [24, 16, 8, 0].map((s) => Math.floor(n / 2 ** s) % 256).join('.')

// freeSlash30 is a /30 in 198.18.128.0/17 overlapping no address of the root namespace.
function freeSlash30() {
  const used = []
  for (const m of run('ip', ['-4', '-o', 'addr', 'show']).matchAll(/inet (\d+\.\d+\.\d+\.\d+)\/(\d+)/g)) {
    const size = 2 ** (32 - Number(m[2]))
    const base = toInt(m[1]) - (toInt(m[1]) % size)
    used.push([base, base + size])
  }
  for (let i = 0; i < 64; i++) {
    const base = toInt('198.18.128.0') + crypto.randomInt(0, 2 ** 15 / 4) * 4
    if (!used.some(([lo, hi]) => base < hi && lo < base + 4)) return [toIP(base + 1), toIP(base + 2)]
  }
  throw new Error('no free /30 in 198.18.128.0/17')
}

// status of a GET from inside the sandbox; '000' when the connection failed.
async function get(sbx, url) {
  const r = await sbx.commands.run(`curl -sS -m 5 -o /dev/null -w '%{http_code}' ${url} || true`)
  return r.stdout.trim()
}

// withDroppingHost builds the host namespace, the fixture and the server, runs fn, and
// removes all of it (also when anything failed): serve first (its leak checks look into
// the namespace), then the fixture (it removes its own netns and veth), then ours.
async function withDroppingHost({ docker }, fn) {
  const ns = `cbfd${crypto.randomBytes(3).toString('hex')}`
  const [rootAddr, nsAddr] = freeSlash30()
  let fixture = null
  let srv = null
  const errors = []
  try {
    run('ip', ['netns', 'add', ns])
    run('ip', ['link', 'add', ns, 'type', 'veth', 'peer', 'name', 'up0', 'netns', ns])
    run('ip', ['addr', 'add', `${rootAddr}/30`, 'dev', ns])
    run('ip', ['link', 'set', ns, 'up'])
    run('ip', ['-n', ns, 'addr', 'add', `${nsAddr}/30`, 'dev', 'up0'])
    run('ip', ['-n', ns, 'link', 'set', 'up0', 'up'])
    run('ip', ['-n', ns, 'link', 'set', 'lo', 'up'])
    ipt(ns, '-P', 'FORWARD', 'DROP')
    if (docker) {
      // Docker's layout: FORWARD jumps to DOCKER-USER first, which returns.
      ipt(ns, '-N', 'DOCKER-USER')
      ipt(ns, '-A', 'DOCKER-USER', '-j', 'RETURN')
      ipt(ns, '-I', 'FORWARD', '-j', 'DOCKER-USER')
    }

    fixture = spawn(TESTNET, ['--attach-netns', ns], { stdio: ['pipe', 'pipe', 'inherit'] })
    const fixtureExited = new Promise((resolve) => fixture.once('exit', resolve))
    fixture.exited = fixtureExited
    const net = await new Promise((resolve, reject) => {
      fixtureExited.then((code) => reject(new Error(`cubicle-testnet exited ${code}`)))
      readline.createInterface({ input: fixture.stdout }).once('line', (line) => resolve(JSON.parse(line)))
    })
    assert.equal(net.attachNetns, ns)

    srv = new Server({ netns: ns, listenAddr: nsAddr })
    await srv.start(['--dns', net.dns, '--ca-certificates', net.caBundle])
    await fn({ ns, net, srv })

    await srv.stop()
    const saved = run('ip', ['netns', 'exec', ns, 'iptables-save'])
    assert.doesNotMatch(saved, /cubicle:/, `rules left after serve stopped:\n${saved}`)
    assert.match(saved, /^:FORWARD DROP/m, `FORWARD policy changed:\n${saved}`)
    if (docker) assert.match(saved, /^-A DOCKER-USER -j RETURN$/m, `Docker's own rule removed:\n${saved}`)
  } catch (e) {
    errors.push(e)
  } finally {
    if (srv) {
      try {
        await srv.stop() // a no-op when it already stopped
      } catch (e) {
        errors.push(e)
      }
    }
    if (fixture) {
      if (fixture.exitCode === null && fixture.signalCode === null) {
        fixture.stdin.end() // it removes its netns, veth and files
        let timer
        const t = await Promise.race([fixture.exited, new Promise((r) => (timer = setTimeout(() => r('timeout'), 30000)))])
        clearTimeout(timer)
        if (t === 'timeout') {
          fixture.kill('SIGKILL')
          errors.push(new Error('cubicle-testnet did not exit on stdin EOF'))
        }
      }
    }
    spawnSync('ip', ['link', 'del', ns], { stdio: 'ignore' })
    spawnSync('ip', ['netns', 'del', ns], { stdio: 'ignore' })
  }
  if (spawnSync('ip', ['link', 'show', ns], { stdio: 'ignore' }).status === 0) errors.push(new Error(`veth ${ns} left`))
  if (run('ip', ['netns', 'list']).split('\n').some((l) => l.split(' ')[0] === ns)) errors.push(new Error(`netns ${ns} left`))
  if (errors.length === 1) throw errors[0]
  if (errors.length) throw new AggregateError(errors, errors.map((e) => e.message).join('\n'))
}

// checkSandboxes: DNS and HTTP(S) egress from a default sandbox, and denyOut still blocks.
async function checkSandboxes({ net, srv }) {
  const sbx = srv.track(await Sandbox.create('base'))
  const hosts = await sbx.commands.run('getent hosts a.test || true')
  assert.match(hosts.stdout, new RegExp(`^${net.addr.replace(/\./g, '\\.')}\\s+a\\.test`), hosts.stdout)
  assert.equal(await get(sbx, 'http://a.test/'), '200')
  assert.equal(await get(sbx, 'https://a.test/'), '200')
  assert.equal(await get(sbx, `http://${net.addr}:8080/`), '200')

  const denied = srv.track(await Sandbox.create('base', { network: { denyOut: [ALL_TRAFFIC] } }))
  assert.equal(await get(denied, 'http://a.test/'), '000')
  assert.equal(await get(denied, `http://${net.addr}/`), '000')
  // ... while the first sandbox still gets out.
  assert.equal(await get(sbx, 'http://a.test/'), '200')
}

test('FORWARD policy DROP: accept rules at the top of FORWARD; DNS and HTTP egress work, denyOut still blocks; rules gone at exit', async () => {
  await withDroppingHost({ docker: false }, async ({ ns, net, srv }) => {
    const fwd = ipt(ns, '-S', 'FORWARD')
    const tag = `cubicle:${srv.bridge}`
    assert.equal(fwd.split(tag).length - 1, 2, `want two rules tagged ${tag} in FORWARD:\n${fwd}`)
    assert.match(fwd.split('\n')[1], new RegExp(tag), `the first FORWARD rule is not ours:\n${fwd}`)
    await checkSandboxes({ net, srv })
  })
})

test('Docker layout (DOCKER-USER exists): the accept rules land in DOCKER-USER, not FORWARD; egress works, denyOut blocks; rules gone at exit', async () => {
  await withDroppingHost({ docker: true }, async ({ ns, net, srv }) => {
    const tag = `cubicle:${srv.bridge}`
    const du = ipt(ns, '-S', 'DOCKER-USER')
    assert.equal(du.split(tag).length - 1, 2, `want two rules tagged ${tag} in DOCKER-USER:\n${du}`)
    const fwd = ipt(ns, '-S', 'FORWARD')
    assert.doesNotMatch(fwd, /cubicle:/, `rules in FORWARD too:\n${fwd}`)
    await checkSandboxes({ net, srv })
  })
})
