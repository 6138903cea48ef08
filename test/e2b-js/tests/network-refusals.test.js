'use strict'
// Network and security options the server does not implement (iam tokens),
// and malformed ones, are refused by name (400), through the SDK and raw
// REST: never accepted and ignored.
const test = require('node:test')
const assert = require('node:assert/strict')
const { Sandbox, SandboxError, InvalidArgumentError } = require('e2b')
const { setup } = require('./harness')

const srv = setup(test)
const MISSING = 'zzzzzzzzzzzzzzzzzzzz'

function refused(field) {
  return (e) => {
    assert.ok(e instanceof SandboxError || e instanceof InvalidArgumentError, `got ${e}`)
    assert.ok(String(e.message).includes(field), `message ${e.message} names ${field}`)
    return true
  }
}

async function assert400(res, field) {
  assert.equal(res.status, 400, `status ${res.status}, body ${res.text}`)
  assert.equal(res.json.code, 400)
  assert.ok(res.json.message.includes(field), `message ${res.json.message} names ${field}`)
}

test('SDK create: malformed domain entries, egressProxy addresses, rules and iam tokens → 400 naming the field', async () => {
  await assert.rejects(Sandbox.create('base', { network: { allowOut: ['1.1.1.1', '*'] }, allowInternetAccess: false }), refused('network.allowOut[1]'))
  await assert.rejects(Sandbox.create('base', { network: { denyOut: ['ex!ample.test'] } }), refused('network.denyOut[0]'))
  await assert.rejects(Sandbox.create('base', { network: { allowOut: Array(1001).fill('1.1.1.1') } }), refused('network.allowOut: at most 1000'))
  await assert.rejects(Sandbox.create('base', { network: { denyOut: ['a.*.b'] } }), refused('network.denyOut[0]'))
  await assert.rejects(Sandbox.create('base', { network: { egressProxy: { address: 'socks4://198.18.0.1:1080' } } }), refused('network.egressProxy.address'))
  await assert.rejects(Sandbox.create('base', { network: { egressProxy: { address: '169.254.169.254:1080' } } }), refused('network.egressProxy.address'))
})

test('REST create (v1 and v2) and PUT /network: refused by name before anything is made', async () => {
  for (const path of ['/v2/sandboxes', '/sandboxes']) {
    await assert400(await srv.api('POST', path, { body: { templateID: 'base', timeout: 30, network: { allowOut: ['example..test'] } } }), 'network.allowOut[0]')
    await assert400(await srv.api('POST', path, { body: { templateID: 'base', timeout: 30, network: { rules: { '*': [{ transform: { headers: { A: 'b' } } }] } } } }), 'network.rules')
    await assert400(await srv.api('POST', path, { body: { templateID: 'base', timeout: 30, iam: { tokens: { aws: { audience: 'sts', tokenType: 'JWT-SVID' } } } } }), 'iam.tokens')
  }
  await assert400(await srv.api('PUT', `/sandboxes/${MISSING}/network`, { body: { denyOut: ['0.0.0.0/0', 'a.*.example.test'] } }), 'denyOut[1]')
  await assert400(await srv.api('PUT', `/sandboxes/${MISSING}/network`, { body: { egressProxy: { address: 'https://198.18.0.1:1080' } } }), 'network.egressProxy.address')
  await assert400(await srv.api('PUT', `/sandboxes/${MISSING}/network`, { body: { allowPublicTraffic: false } }), 'network.allowPublicTraffic')
  await assert.rejects(Sandbox.updateNetwork(MISSING, { allowOut: ['*.'] }), refused('allowOut[0]'))
  const list = await srv.api('GET', '/v2/sandboxes?limit=100')
  assert.equal(list.status, 200)
  assert.equal(list.json.length, 0, `refused creates left sandboxes: ${list.text}`)
})
