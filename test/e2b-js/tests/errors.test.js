'use strict'
// Error mapping through the SDK.
const test = require('node:test')
const assert = require('node:assert/strict')
const { Sandbox, NotFoundError, SandboxNotFoundError, AuthenticationError, SandboxError, InvalidArgumentError, TimeoutError } = require('e2b')
const { setup } = require('./harness')

const srv = setup(test)
const MISSING = 'zzzzzzzzzzzzzzzzzzzz'

function isNotFound(e) {
  return e instanceof SandboxNotFoundError || e instanceof NotFoundError
}

test('unknown sandbox: getInfo / connect / setTimeout / pause are NotFound, kill is false', async () => {
  await assert.rejects(Sandbox.getInfo(MISSING), isNotFound)
  await assert.rejects(Sandbox.connect(MISSING), isNotFound)
  await assert.rejects(Sandbox.setTimeout(MISSING, 10000), isNotFound)
  await assert.rejects(Sandbox.pause(MISSING), isNotFound)
  assert.equal(await Sandbox.kill(MISSING), false)
})

test('bad API key: AuthenticationError on create, list and getInfo', async () => {
  const opts = { apiKey: 'e2b_00000000000000000000000000000000' }
  await assert.rejects(Sandbox.create('base', opts), AuthenticationError)
  await assert.rejects(Sandbox.list(opts).nextItems(), AuthenticationError)
  await assert.rejects(Sandbox.getInfo(MISSING, opts), AuthenticationError)
  await assert.rejects(Sandbox.create('base', { apiKey: 'not-a-key-at-all' }), AuthenticationError)
})

test('unknown template: create fails with a 404-ish error', async () => {
  await assert.rejects(Sandbox.create('no-such-template-xyz'), (e) => {
    assert.ok(e instanceof SandboxError || e instanceof NotFoundError, `got ${e}`)
    assert.match(String(e.message), /404|not found/i)
    return true
  })
})

test('negative timeout is rejected with 400', async () => {
  await assert.rejects(Sandbox.create('base', { timeoutMs: -5000 }), (e) => {
    assert.ok(e instanceof SandboxError || e instanceof InvalidArgumentError, `got ${e}`)
    assert.match(String(e.message), /400|invalid|timeout/i)
    return true
  })
})

test('envd calls with a wrong access token are rejected', async () => {
  const sbx = srv.track(await Sandbox.create('base', { timeoutMs: 60000 }))
  const bad = await fetch(`${srv.url}/process.Process/List`, {
    method: 'POST',
    headers: {
      'Content-Type': 'application/json',
      'Connect-Protocol-Version': '1',
      'E2b-Sandbox-Id': sbx.sandboxId,
      'E2b-Sandbox-Port': '49983',
      'X-Access-Token': 'wrong-token',
    },
    body: '{}',
  })
  assert.equal(bad.status, 401)
  const none = await fetch(`${srv.url}/process.Process/List`, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json', 'E2b-Sandbox-Id': sbx.sandboxId, 'E2b-Sandbox-Port': '49983' },
    body: '{}',
  })
  assert.equal(none.status, 401)
  // envd traffic for a sandbox that doesn't exist.
  const gone = await fetch(`${srv.url}/process.Process/List`, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json', 'E2b-Sandbox-Id': MISSING, 'E2b-Sandbox-Port': '49983' },
    body: '{}',
  })
  assert.ok([404, 502].includes(gone.status), `envd call for an unknown sandbox: ${gone.status}`)
  await sbx.kill()
})

test('commands against a killed sandbox fail', async () => {
  const sbx = srv.track(await Sandbox.create('base', { timeoutMs: 60000 }))
  await sbx.kill()
  await assert.rejects(sbx.commands.run('echo hi', { requestTimeoutMs: 10000 }), SandboxError)
  await assert.rejects(sbx.files.read('/etc/hostname', { requestTimeoutMs: 10000 }), SandboxError)
})

test('a command whose sandbox is killed under it fails as a sandbox that ended', async () => {
  // The proxy drops the transport of the cut Connect stream (undici:
  // "terminated"); the SDK then asks /health, hears "The sandbox was not
  // found" and says why. An unavailable end-stream would read as a timeout.
  const sbx = srv.track(await Sandbox.create('base', { timeoutMs: 120000 }))
  const h = await sbx.commands.run('echo started; sleep 60', { background: true })
  await Sandbox.kill(sbx.sandboxId)
  await assert.rejects(h.wait(), (e) => e instanceof TimeoutError && /sandbox was killed or reached its end of life/.test(e.message))
})
