'use strict'
// Sandbox lifecycle through the SDK: create (v2 route) + getInfo, list with metadata
// filter and pagination, setTimeout, kill.
const test = require('node:test')
const assert = require('node:assert/strict')
const { Sandbox, NotFoundError, SandboxNotFoundError } = require('e2b')
const { setup, waitFor } = require('./harness')

const srv = setup(test)

test('create returns a running sandbox and getInfo reports its fields', async () => {
  const before = Date.now()
  const sbx = srv.track(await Sandbox.create('base', { metadata: { suite: 'sandbox', n: '1' }, timeoutMs: 120000 }))
  assert.match(sbx.sandboxId, /^[a-z0-9]{20}$/)
  assert.equal(await sbx.isRunning(), true)

  const info = await sbx.getInfo()
  assert.equal(info.sandboxId, sbx.sandboxId)
  assert.equal(info.state, 'running')
  assert.deepEqual(info.metadata, { suite: 'sandbox', n: '1' })
  assert.ok(info.templateId, 'templateId set')
  assert.ok(info.startedAt instanceof Date && !isNaN(info.startedAt))
  assert.ok(info.endAt instanceof Date && !isNaN(info.endAt))
  assert.ok(info.startedAt.getTime() >= before - 5000 && info.startedAt.getTime() <= Date.now() + 5000)
  const ttl = info.endAt.getTime() - info.startedAt.getTime()
  assert.ok(ttl > 100000 && ttl < 140000, `endAt - startedAt = ${ttl} ms, want ~120 s`)
  assert.ok(info.cpuCount >= 1, 'cpuCount')
  assert.ok(info.memoryMB >= 128, 'memoryMB')
  assert.match(info.envdVersion, /^\d+\.\d+\.\d+/)

  // The sandbox works: a command runs inside it.
  const r = await sbx.commands.run('echo ready')
  assert.equal(r.stdout, 'ready\n')
})

test('aliases of base resolve (code-interpreter-v1)', async () => {
  const sbx = srv.track(await Sandbox.create('code-interpreter-v1', { timeoutMs: 60000 }))
  const r = await sbx.commands.run('echo alias-ok')
  assert.equal(r.stdout, 'alias-ok\n')
  await sbx.kill()
})

test('list filters by metadata (keys and values needing escaping) and paginates', async () => {
  const tag = `t${Date.now()}`
  const md = { 'user id': 'a&b=c', 'ünï/cödé?': '100% sure', grp: tag }
  const a = srv.track(await Sandbox.create('base', { metadata: md, timeoutMs: 120000 }))
  const b = srv.track(await Sandbox.create('base', { metadata: { ...md }, timeoutMs: 120000 }))
  const other = srv.track(await Sandbox.create('base', { metadata: { grp: tag, 'user id': 'someone else' }, timeoutMs: 120000 }))

  // Exact filter on the awkward keys.
  const p = Sandbox.list({ query: { metadata: { 'user id': 'a&b=c', grp: tag } } })
  const items = await p.nextItems()
  const ids = items.map((s) => s.sandboxId).sort()
  assert.deepEqual(ids, [a.sandboxId, b.sandboxId].sort())
  for (const it of items) {
    assert.deepEqual(it.metadata, md)
    assert.equal(it.state, 'running')
    assert.ok(it.startedAt instanceof Date && it.endAt instanceof Date)
  }
  assert.equal(p.hasNext, false)

  const p2 = Sandbox.list({ query: { metadata: { 'ünï/cödé?': '100% sure' } } })
  assert.deepEqual((await p2.nextItems()).map((s) => s.sandboxId).sort(), [a.sandboxId, b.sandboxId].sort())

  // Pagination with limit 1 over the three sandboxes of this group.
  const pg = Sandbox.list({ query: { metadata: { grp: tag } }, limit: 1 })
  const seen = []
  let pages = 0
  while (pg.hasNext && pages < 10) {
    const page = await pg.nextItems()
    pages++
    assert.ok(page.length <= 1, `page of ${page.length} with limit 1`)
    seen.push(...page.map((s) => s.sandboxId))
  }
  assert.equal(pg.hasNext, false, 'paginator terminates')
  assert.deepEqual(seen.sort(), [a.sandboxId, b.sandboxId, other.sandboxId].sort())
  assert.equal(new Set(seen).size, 3, 'no duplicates across pages')

  // State filter: none of them is paused.
  const paused = await Sandbox.list({ query: { metadata: { grp: tag }, state: ['paused'] } }).nextItems()
  assert.equal(paused.length, 0)

  await Promise.all([a.kill(), b.kill(), other.kill()])
  const after = await Sandbox.list({ query: { metadata: { grp: tag } } }).nextItems()
  assert.equal(after.length, 0, 'killed sandboxes are not listed')
})

test('setTimeout shortens the lifetime: sandbox is gone after it', async () => {
  const sbx = srv.track(await Sandbox.create('base', { timeoutMs: 300000 }))
  await sbx.setTimeout(3000)
  const info = await sbx.getInfo()
  const left = info.endAt.getTime() - Date.now()
  assert.ok(left < 10000, `endAt is ${left} ms away after setTimeout(3000)`)
  await waitFor(async () => !(await sbx.isRunning({ requestTimeoutMs: 5000 })), {
    timeoutMs: 30000,
    intervalMs: 500,
    what: 'sandbox to expire',
  })
  await assert.rejects(sbx.getInfo(), (e) => e instanceof NotFoundError || e instanceof SandboxNotFoundError)
})

test('setTimeout can extend the lifetime', async () => {
  const sbx = srv.track(await Sandbox.create('base', { timeoutMs: 30000 }))
  await sbx.setTimeout(600000)
  const info = await sbx.getInfo()
  const left = info.endAt.getTime() - Date.now()
  assert.ok(left > 500000, `endAt only ${left} ms away after setTimeout(600000)`)
  await sbx.kill()
})

test('kill: isRunning false, getInfo NotFound, second kill returns false', async () => {
  const sbx = srv.track(await Sandbox.create('base', { timeoutMs: 60000 }))
  assert.equal(await sbx.kill(), true)
  assert.equal(await sbx.isRunning(), false)
  await assert.rejects(sbx.getInfo(), (e) => e instanceof NotFoundError || e instanceof SandboxNotFoundError)
  assert.equal(await Sandbox.kill(sbx.sandboxId), false)
  const listed = await Sandbox.list().nextItems()
  assert.ok(!listed.some((s) => s.sandboxId === sbx.sandboxId), 'killed sandbox not listed')
})
