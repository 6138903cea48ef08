'use strict'
// Domain egress rules through the unmodified SDK: a real sandbox, the node's
// egress proxy, and test/testnet (bin/cubicle-testnet, a netns on
// 198.18.128.0/17 answering every *.test name) as the internet.
const test = require('node:test')
const assert = require('node:assert/strict')
const path = require('node:path')
const readline = require('node:readline')
const { spawn } = require('node:child_process')
const { Sandbox, ALL_TRAFFIC } = require('e2b')
const { setup } = require('./harness')

const extra = []
let net = null
let fixture = null
// The server needs the fixture's DNS and CA on its command line, so its
// start waits for the fixture.
const ready = new Promise((resolve, reject) => {
  fixture = spawn(path.join(__dirname, '..', '..', '..', 'bin', 'cubicle-testnet'), [], { stdio: ['pipe', 'pipe', 'inherit'] })
  fixture.once('exit', (code) => reject(new Error(`cubicle-testnet exited ${code}`)))
  readline.createInterface({ input: fixture.stdout }).once('line', (line) => {
    net = JSON.parse(line)
    extra.push('--dns', net.dns, '--ca-certificates', net.caBundle)
    resolve()
  })
})
ready.catch(() => {})
const srv = setup({ before: (fn) => test.before(async () => { await ready; await fn() }), after: (fn) => test.after(fn) }, extra)
test.after(async () => {
  if (!fixture) return
  const exited = new Promise((resolve) => fixture.once('exit', resolve))
  fixture.stdin.end() // it removes its netns, veth and files
  await exited
})

// status of a GET from inside the sandbox; '000' when the connection failed.
async function get(sbx, url) {
  const r = await sbx.commands.run(`curl -sS -m 5 -o /dev/null -w '%{http_code}' ${url} || true`)
  return r.stdout.trim()
}

test('a domain allow-list with deny-all: allowed host 200, other host and IP literal blocked; updateNetwork switches to a wildcard', async () => {
  const sbx = await Sandbox.create('base', { network: { allowOut: ['allowed.test'], denyOut: [ALL_TRAFFIC] } })
  try {
    assert.equal(await get(sbx, 'https://allowed.test/'), '200')
    assert.equal(await get(sbx, 'http://allowed.test/'), '200')
    assert.equal(await get(sbx, 'https://other.test/'), '000')
    assert.equal(await get(sbx, `http://${net.addr}/`), '000')
    const info = await srv.api('GET', `/sandboxes/${sbx.sandboxId}`)
    assert.deepEqual(info.json.network.allowOut, ['allowed.test'], info.text)

    await sbx.updateNetwork({ allowOut: ['*.w.test'], denyOut: [ALL_TRAFFIC] })
    assert.equal(await get(sbx, 'https://a.w.test/'), '200')
    assert.equal(await get(sbx, 'https://b.a.w.test/'), '200')
    assert.equal(await get(sbx, 'https://w.test/'), '000')
    assert.equal(await get(sbx, 'https://allowed.test/'), '000')
  } finally {
    await sbx.kill()
  }
})
