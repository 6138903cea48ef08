'use strict'
// The v1 create/connect routes older SDKs (JS <= 2.50, Python) use.
const test = require('node:test')
const assert = require('node:assert/strict')
const { Sandbox } = require('e2b')
const { setup } = require('./harness')

const srv = setup(test)
const created = []

test.after(async () => {
  for (const id of created) await srv.api('DELETE', `/sandboxes/${id}`).catch(() => {})
})

test('POST /sandboxes (v1 body, as JS 2.45 sends it) → 201, usable from the SDK', async () => {
  const res = await srv.api('POST', '/sandboxes', {
    body: {
      templateID: 'base',
      timeout: 120,
      secure: true,
      allow_internet_access: true,
      metadata: { route: 'v1' },
      envVars: { V1VAR: 'yes' },
    },
  })
  assert.equal(res.status, 201, res.text)
  const b = res.json
  created.push(b.sandboxID)
  assert.match(b.sandboxID, /^[a-z0-9]{20}$/)
  assert.equal(b.clientID, '6532622b')
  assert.ok(b.envdAccessToken, 'secure:true → envdAccessToken')
  assert.match(b.envdVersion, /^\d+\.\d+\.\d+$/)

  const det = await srv.api('GET', `/sandboxes/${b.sandboxID}`)
  assert.equal(det.status, 200)
  assert.deepEqual(det.json.metadata, { route: 'v1' })
  const ttl = Date.parse(det.json.endAt) - Date.parse(det.json.startedAt)
  assert.ok(ttl > 110000 && ttl < 130000, `ttl ${ttl}`)

  // The SDK can attach to it and the create-time envs are there.
  const sbx = await Sandbox.connect(b.sandboxID)
  const r = await sbx.commands.run('echo $V1VAR')
  assert.equal(r.stdout, 'yes\n')
})

test('POST /sandboxes/{id}/connect: 200 when running, 201 when resumed, TTL only extended', async () => {
  const res = await srv.api('POST', '/sandboxes', { body: { templateID: 'base', timeout: 600, secure: true } })
  assert.equal(res.status, 201, res.text)
  const id = res.json.sandboxID
  created.push(id)
  const end0 = Date.parse((await srv.api('GET', `/sandboxes/${id}`)).json.endAt)

  const c1 = await srv.api('POST', `/sandboxes/${id}/connect`, { body: { timeout: 30 } })
  assert.equal(c1.status, 200, c1.text)
  assert.equal(c1.json.sandboxID, id)
  assert.ok(c1.json.envdAccessToken)
  const end1 = Date.parse((await srv.api('GET', `/sandboxes/${id}`)).json.endAt)
  assert.ok(end1 >= end0 - 1000, 'connect with a shorter timeout does not shorten the TTL')

  assert.equal((await srv.api('POST', `/sandboxes/${id}/pause`, { body: { memory: true } })).status, 204)
  assert.equal((await srv.api('GET', `/sandboxes/${id}`)).json.state, 'paused')

  const c2 = await srv.api('POST', `/sandboxes/${id}/connect`, { body: { timeout: 120 } })
  assert.equal(c2.status, 201, c2.text)
  assert.equal((await srv.api('GET', `/sandboxes/${id}`)).json.state, 'running')

  // The token it returned works for envd.
  const sbx = await Sandbox.connect(id)
  assert.equal((await sbx.commands.run('echo back')).stdout, 'back\n')

  // Without a timeout (CubeSandbox's connect(id)) the sandbox keeps its own.
  const before = Date.parse((await srv.api('GET', `/sandboxes/${id}`)).json.endAt)
  const keep = await srv.api('POST', `/sandboxes/${id}/connect`, { body: {} })
  assert.equal(keep.status, 200, keep.text)
  assert.ok(Date.parse((await srv.api('GET', `/sandboxes/${id}`)).json.endAt) >= before - 1000, 'a connect without a timeout does not shorten the TTL')
  // A negative one is refused.
  const bad = await srv.api('POST', `/sandboxes/${id}/connect`, { body: { timeout: -5 } })
  assert.equal(bad.status, 400, bad.text)
  assert.equal(bad.json.code, 400)
})

test('POST /v2/sandboxes/{id}/connect without a body → 200', async () => {
  const res = await srv.api('POST', '/v2/sandboxes', { body: { templateID: 'base' } })
  assert.equal(res.status, 201, res.text)
  created.push(res.json.sandboxID)
  const c = await fetch(`${srv.url}/v2/sandboxes/${res.json.sandboxID}/connect`, { method: 'POST', headers: { 'X-API-KEY': srv.apiKey } })
  assert.equal(c.status, 200)
  const j = await c.json()
  assert.equal(j.sandboxID, res.json.sandboxID)
})
