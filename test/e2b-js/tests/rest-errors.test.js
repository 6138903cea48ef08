'use strict'
// Raw REST: error shapes ({code,message}, code == HTTP status) and validation.
const test = require('node:test')
const assert = require('node:assert/strict')
const { setup } = require('./harness')

const srv = setup(test)
const created = []

test.after(async () => {
  for (const id of created) await srv.api('DELETE', `/sandboxes/${id}`).catch(() => {})
})

function assertError(res, status) {
  assert.equal(res.status, status, `status ${res.status}, body ${res.text}`)
  assert.ok(res.json && typeof res.json === 'object', `JSON error body, got ${JSON.stringify(res.text)}`)
  assert.equal(res.json.code, status, `body code ${res.json.code} == status ${status}`)
  assert.equal(typeof res.json.message, 'string')
  assert.ok(res.json.message.length > 0, 'non-empty message')
  assert.match(res.headers.get('content-type') || '', /application\/json/)
}

test('no API key / wrong API key → 401', async () => {
  assertError(await srv.api('GET', '/v2/sandboxes', { apiKey: null }), 401)
  assertError(await srv.api('GET', '/v2/sandboxes', { apiKey: 'e2b_deadbeef' }), 401)
  assertError(await srv.api('POST', '/v2/sandboxes', { apiKey: 'e2b_deadbeef', body: { templateID: 'base' } }), 401)
  assertError(await srv.api('GET', '/sandboxes/abc', { apiKey: '' }), 401)
})

test('malformed JSON → 400', async () => {
  assertError(await srv.api('POST', '/v2/sandboxes', { raw: '{"templateID":', headers: { 'Content-Type': 'application/json' } }), 400)
  assertError(await srv.api('POST', '/sandboxes', { raw: 'not json', headers: { 'Content-Type': 'application/json' } }), 400)
  assertError(await srv.api('POST', '/v2/sandboxes', { raw: '[1,2]', headers: { 'Content-Type': 'application/json' } }), 400)
})

test('wrong field types and invalid values → 400', async () => {
  assertError(await srv.api('POST', '/v2/sandboxes', { body: { templateID: 'base', timeout: 'soon' } }), 400)
  assertError(await srv.api('POST', '/v2/sandboxes', { body: { templateID: 'base', timeout: -1 } }), 400)
  assertError(await srv.api('POST', '/v2/sandboxes', { body: { templateID: 'base', metadata: { a: 1 } } }), 400)
  assertError(await srv.api('POST', '/v2/sandboxes', { body: { templateID: 'base', envVars: 'x' } }), 400)
})

test('oversized metadata → 400 (or 413)', async () => {
  const metadata = {}
  for (let i = 0; i < 2000; i++) metadata[`key${i}`] = 'v'.repeat(1000)
  const res = await srv.api('POST', '/v2/sandboxes', { body: { templateID: 'base', metadata } })
  assert.ok([400, 413].includes(res.status), `status ${res.status}`)
  assertError(res, res.status)
  const one = await srv.api('POST', '/v2/sandboxes', { body: { templateID: 'base', metadata: { big: 'x'.repeat(100000) } } })
  assert.ok([400, 413].includes(one.status), `single huge value: status ${one.status}`)
  assertError(one, one.status)
})

test('unknown template → 404 (either route)', async () => {
  assertError(await srv.api('POST', '/v2/sandboxes', { body: { templateID: 'nope-nope' } }), 404)
  assertError(await srv.api('POST', '/sandboxes', { body: { templateID: 'nope-nope', timeout: 10 } }), 404)
})

test('missing templateID on v1 → 400', async () => {
  assertError(await srv.api('POST', '/sandboxes', { body: { timeout: 10 } }), 400)
})

test('unknown sandbox → 404 on get, delete, timeout, pause, connect', async () => {
  const id = 'zzzzzzzzzzzzzzzzzzzz'
  assertError(await srv.api('GET', `/sandboxes/${id}`), 404)
  assertError(await srv.api('DELETE', `/sandboxes/${id}`), 404)
  assertError(await srv.api('POST', `/sandboxes/${id}/timeout`, { body: { timeout: 30 } }), 404)
  assertError(await srv.api('POST', `/sandboxes/${id}/pause`, { body: {} }), 404)
  assertError(await srv.api('POST', `/v2/sandboxes/${id}/connect`, { body: {} }), 404)
  assertError(await srv.api('POST', `/sandboxes/${id}/connect`, { body: { timeout: 30 } }), 404)
})

test('list: bad limit / state / order → 400', async () => {
  assertError(await srv.api('GET', '/v2/sandboxes?limit=0'), 400)
  assertError(await srv.api('GET', '/v2/sandboxes?limit=1000'), 400)
  assertError(await srv.api('GET', '/v2/sandboxes?limit=abc'), 400)
  assertError(await srv.api('GET', '/v2/sandboxes?state=sleeping'), 400)
})

test('successful create body shape (v2, minimal body) and list headers', async () => {
  const res = await srv.api('POST', '/v2/sandboxes', { body: { templateID: 'base' } })
  assert.equal(res.status, 201, res.text)
  created.push(res.json.sandboxID)
  const b = res.json
  assert.match(b.sandboxID, /^[a-z0-9]{20}$/)
  assert.equal(b.clientID, '6532622b')
  assert.ok(b.templateID)
  assert.match(b.envdVersion, /^0\.6\.\d+/)
  assert.equal(typeof b.envdAccessToken, 'string')
  assert.ok(b.envdAccessToken.length >= 16)

  const det = await srv.api('GET', `/sandboxes/${b.sandboxID}`)
  assert.equal(det.status, 200)
  for (const k of ['templateID', 'sandboxID', 'clientID', 'startedAt', 'endAt', 'cpuCount', 'memoryMB', 'diskSizeMB', 'state', 'envdVersion']) {
    assert.ok(det.json[k] !== undefined && det.json[k] !== null, `SandboxDetail.${k}`)
  }
  // Default v2 timeout is 300 s.
  const ttl = Date.parse(det.json.endAt) - Date.parse(det.json.startedAt)
  assert.ok(ttl > 290000 && ttl < 310000, `default ttl ${ttl} ms`)

  const list = await srv.api('GET', '/v2/sandboxes?limit=100')
  assert.equal(list.status, 200)
  assert.ok(Array.isArray(list.json))
  assert.equal(list.headers.get('x-next-token'), null)

  // Timeout body validation on an existing sandbox.
  assertError(await srv.api('POST', `/sandboxes/${b.sandboxID}/timeout`, { raw: '{', headers: { 'Content-Type': 'application/json' } }), 400)
  assertError(await srv.api('POST', `/sandboxes/${b.sandboxID}/timeout`, { body: { timeout: -3 } }), 400)
  const ok = await srv.api('POST', `/sandboxes/${b.sandboxID}/timeout`, { body: { timeout: 60 } })
  assert.equal(ok.status, 204, ok.text)

  // Pause twice: 204 then 409 with {code:409}.
  assert.equal((await srv.api('POST', `/sandboxes/${b.sandboxID}/pause`, { body: {} })).status, 204)
  assertError(await srv.api('POST', `/sandboxes/${b.sandboxID}/pause`, { body: {} }), 409)

  const del = await srv.api('DELETE', `/sandboxes/${b.sandboxID}`)
  assert.equal(del.status, 204, del.text)
  assertError(await srv.api('GET', `/sandboxes/${b.sandboxID}`), 404)
})

test('health is unauthenticated', async () => {
  const res = await fetch(`${srv.url}/health`)
  assert.ok([200, 204].includes(res.status))
})
