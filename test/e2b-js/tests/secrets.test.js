'use strict'
// Secrets through the unmodified SDK: Secret.create/list/getInfo/update/
// exists/destroy, pagination, 404s, bad input, and another team's key
// seeing nothing. Values are write-only: no response carries one.
const test = require('node:test')
const assert = require('node:assert/strict')
const { execFileSync } = require('node:child_process')
const path = require('node:path')
const { Secret, SecretError, SecretNotFoundError } = require('e2b')
const { setup, REPO } = require('./harness')

const srv = setup(test)
const CUBICLE = process.env.CUBICLE_BIN || path.join(REPO, 'bin', 'cubicle')
const VALUE = 'sk-canary-9d1e4b7a'

function cli(args) {
  return execFileSync(CUBICLE, [...args, '--data-dir', srv.dataDir], { encoding: 'utf8', timeout: 30000 }).trim()
}

test('Secret create, getInfo, update, list, exists, destroy', { timeout: 60000 }, async () => {
  const name = `db-password-${Date.now()}`
  const s = await Secret.create(name, VALUE, { metadata: { env: 'prod' } })
  assert.match(s.secretId, /^sec_[0-9a-f]+$/)
  assert.equal(s.name, name)
  assert.equal(s.version, 1)
  assert.deepEqual(s.metadata, { env: 'prod' })
  assert.ok(s.createdAt instanceof Date && !isNaN(s.createdAt))

  for (const ref of [s.secretId, name]) {
    const info = await Secret.getInfo(ref)
    assert.equal(info.secretId, s.secretId)
    assert.equal(info.version, 1)
  }
  const up = await Secret.update(name, VALUE + '-2')
  assert.equal(up.version, 2)
  assert.deepEqual(up.metadata, { env: 'prod' }, 'metadata kept when the update omits it')
  const up2 = await Secret.update(s.secretId, VALUE + '-3', { metadata: { env: 'staging' } })
  assert.equal(up2.version, 3)
  assert.deepEqual(up2.metadata, { env: 'staging' })

  // The value is never in any response.
  for (const [method, p] of [['GET', '/secrets'], ['GET', `/secrets/${s.secretId}`]]) {
    const res = await srv.api(method, p)
    const text = res.text
    assert.equal(res.status, 200)
    assert.ok(!text.includes('sk-canary'), `${method} ${p} leaked the value`)
    assert.ok(!/"value"/.test(text), `${method} ${p} has a value field`)
  }

  const plain = await Secret.create(`plain-${Date.now()}`, 'v')
  assert.deepEqual(plain.metadata, {}, 'metadata is {} when unset')

  assert.equal(await Secret.exists(name), true)
  assert.equal(await Secret.destroy(name), true)
  assert.equal(await Secret.destroy(name), false, 'second destroy reports not found')
  assert.equal(await Secret.exists(name), false)
  await assert.rejects(Secret.getInfo(name), SecretNotFoundError)
  await assert.rejects(Secret.update(name, 'x'), SecretNotFoundError)
  assert.equal(await Secret.destroy(plain.secretId), true)
})

test('Secret duplicates and bad input are refused naming the field', { timeout: 60000 }, async () => {
  const name = `dup-${Date.now()}`
  await Secret.create(name, 'v')
  await assert.rejects(Secret.create(name, 'v'), (e) => e instanceof SecretError && /409/.test(e.message) && /already exists/.test(e.message))
  const cases = [
    [{ name: 'a{b}', value: 'v' }, /name/],
    [{ name: 'a\u0007b', value: 'v' }, /name/],
    [{ name: '', value: 'v' }, /name/],
    [{ name: 'x'.repeat(129), value: 'v' }, /name/],
    [{ value: 'v' }, /name is required/],
    [{ name: 'ok' }, /value is required/],
    [{ name: 'ok', value: '' }, /value/],
    [{ name: 'ok', value: 'v'.repeat(32 * 1024 + 1) }, /value/],
    [{ name: 'ok', value: 'v', metadata: Object.fromEntries(Array.from({ length: 33 }, (_, i) => [`k${i}`, 'v'])) }, /metadata/],
    [{ name: 'ok', value: 'v', metadata: { k: 'v'.repeat(1025) } }, /metadata/],
    [{ name: 'ok', value: 'v', versions: 1 }, /versions/],
    [{ name: 'ok', value: 7 }, /value must be a string/],
    [{ name: 'ok', value: 'v', metadata: { k: 1 } }, /metadata/],
  ]
  for (const [body, field] of cases) {
    const res = await srv.api('POST', '/secrets', { body })
    const got = res.json
    assert.equal(res.status, 400, JSON.stringify(body).slice(0, 80))
    assert.equal(got.code, 400)
    assert.match(got.message, field)
    assert.ok(!got.message.includes('v'.repeat(64)), 'a message never echoes the value')
  }
  const syn = await srv.api('POST', '/secrets', { raw: '{"name":"ok","value":"sk-leak\\q"}', headers: { 'Content-Type': 'application/json' } })
  assert.equal(syn.status, 400)
  assert.ok(!syn.text.includes('sk-leak'), `a syntax error must not quote the body: ${syn.text}`)
  const upd = await srv.api('POST', `/secrets/${name}`, { body: { value: 'v', name: 'rename' } })
  assert.equal(upd.status, 400)
  assert.match(upd.json.message, /name/)
  const res = await srv.api('GET', '/secrets?limit=0')
  assert.equal(res.status, 400)
  const bad = await srv.api('GET', '/secrets?nextToken=bm9wZQ')
  assert.equal(bad.status, 400)
  assert.equal(await Secret.destroy(name), true)
})

test('Secret.list pages with nextToken', { timeout: 60000 }, async () => {
  const prefix = `page-${Date.now()}-`
  const made = []
  for (let i = 0; i < 5; i++) made.push((await Secret.create(prefix + i, 'v')).secretId)
  const p = Secret.list({ limit: 2 })
  const seen = []
  let pages = 0
  while (p.hasNext && pages < 20) {
    pages++
    const items = await p.nextItems()
    assert.ok(items.length <= 2)
    seen.push(...items.filter((s) => s.name.startsWith(prefix)).map((s) => s.secretId))
  }
  assert.deepEqual(seen, made, 'every secret once, oldest first')
  assert.ok(pages >= 3)
  for (const id of made) assert.equal(await Secret.destroy(id), true)
})

test("another team's key sees none of this team's secrets", { timeout: 60000 }, async () => {
  const name = `shared-name-${Date.now()}`
  const mine = await Secret.create(name, 'v')
  const team = `t-sec-${Date.now()}`
  cli(['team', 'create', team])
  const other = cli(['apikey', 'create', '--team', team, '--name', 'other'])
  const opts = { apiKey: other }

  assert.equal(await Secret.exists(mine.secretId, opts), false)
  assert.equal(await Secret.exists(name, opts), false)
  await assert.rejects(Secret.update(mine.secretId, 'stolen', opts), SecretNotFoundError)
  assert.equal(await Secret.destroy(mine.secretId, opts), false)
  const theirs = await Secret.list(opts).nextItems()
  assert.equal(theirs.some((s) => s.secretId === mine.secretId), false)

  // A 404 for another team's secret is byte-identical to a missing one's
  // (apart from the reference it echoes).
  const a = await srv.api('GET', `/secrets/${mine.secretId}`, { apiKey: other })
  const b = await srv.api('GET', `/secrets/sec_000000000000000000000000`, { apiKey: other })
  assert.equal(a.status, 404)
  assert.equal(b.status, 404)
  assert.equal(a.text.replace(mine.secretId, 'X'), b.text.replace('sec_000000000000000000000000', 'X'))

  // The same name is free in the other team.
  const twin = await Secret.create(name, 'v', opts)
  assert.notEqual(twin.secretId, mine.secretId)
  assert.equal((await Secret.getInfo(name)).secretId, mine.secretId)
  assert.equal(await Secret.destroy(twin.secretId, opts), true)
  assert.equal(await Secret.destroy(mine.secretId), true)
})

test('Secret names with / and reserved characters are reachable by name; names are lower-cased; sec_ is refused', { timeout: 60000 }, async () => {
  const ts = Date.now()
  // The SDK percent-encodes the ref (encodeURIComponent): '/' arrives as
  // %2F, '+ : @ ; , = & $ ? # %' as %XX.
  for (const name of [`team/db-${ts}/password`, `a b+c:d@e;f,g=h&i$-${ts}`, `q?f#x-${ts}`, `100%-${ts}`, `ünï-${ts}`, `../up-${ts}`]) {
    const s = await Secret.create(name, 'v')
    assert.equal(s.name, name)
    assert.equal((await Secret.getInfo(name)).secretId, s.secretId, name)
    assert.equal((await Secret.update(name, 'v2')).version, 2, name)
    assert.equal(await Secret.exists(name), true, name)
    assert.equal(await Secret.destroy(name), true, name)
    assert.equal(await Secret.exists(name), false, name)
  }

  // e2b's schema: "Names are lower-cased before storage and returned in that canonical form".
  const mixed = `Mixed/Case-${ts}`
  const m = await Secret.create(mixed, 'v')
  assert.equal(m.name, mixed.toLowerCase())
  for (const ref of [mixed, mixed.toLowerCase(), mixed.toUpperCase()]) assert.equal((await Secret.getInfo(ref)).secretId, m.secretId, ref)
  const lst = await Secret.list().nextItems()
  assert.ok(lst.some((x) => x.secretId === m.secretId && x.name === mixed.toLowerCase()))
  await assert.rejects(Secret.create(mixed.toUpperCase(), 'v'), (e) => e instanceof SecretError && /^409/.test(e.message))
  assert.equal(await Secret.destroy(mixed.toUpperCase()), true)

  // ...and "the sec_ prefix is reserved for secret identifiers"; '.' and
  // '..' cannot travel as a path segment.
  for (const name of [`sec_${ts}`, `SEC_${ts}`, '.', '..']) {
    await assert.rejects(Secret.create(name, 'v'), (e) => e instanceof SecretError && /^400: invalid secret: name must not/.test(e.message), name)
  }
})
