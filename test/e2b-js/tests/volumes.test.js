'use strict'
// Persistent volumes through the unmodified SDK: Volume.create/list/getInfo/
// connect/destroy, volumeMounts on create, sharing between sandboxes, data
// surviving every sandbox, the delete guard, and the volume-content API.
const test = require('node:test')
const assert = require('node:assert/strict')
const { AuthenticationError, Sandbox, Volume, VolumeError, VolumeNotFoundError, VolumePathNotFoundError } = require('e2b')
const { setup } = require('./harness')

const srv = setup(test)

test('Volume create, list, getInfo, connect, destroy', { timeout: 60000 }, async () => {
  const name = `vol-${Date.now()}`
  const vol = await Volume.create(name)
  assert.equal(vol.name, name)
  assert.equal(vol.volumeId, name)
  assert.ok(vol.token, 'a token for the volume-content API')

  const listed = await Volume.list()
  const mine = listed.find((v) => v.volumeId === name)
  assert.deepEqual(mine, { volumeId: name, name })

  const info = await Volume.getInfo(name)
  assert.equal(info.volumeId, name)
  assert.equal(info.token, vol.token)
  const again = await Volume.connect(name)
  assert.equal(again.token, vol.token)

  await assert.rejects(Volume.getInfo('no-such-volume'), VolumeNotFoundError)
  await assert.rejects(Volume.create(name), (e) => e instanceof VolumeError && /409/.test(e.message))
  await assert.rejects(Volume.create('not a valid name'), (e) => e instanceof VolumeError && /400/.test(e.message))

  assert.equal(await Volume.destroy(name), true)
  assert.equal(await Volume.destroy(name), false, 'second destroy reports not found')
  assert.equal((await Volume.list()).some((v) => v.volumeId === name), false)
})

test('volumeMounts: write in A, read in B, data outlives both, delete guard', { timeout: 180000 }, async () => {
  const vol = await Volume.create(`shared-${Date.now()}`)
  const a = srv.track(await Sandbox.create('base', { volumeMounts: { '/workspace': vol } }))
  // A string names the volume as well as a Volume instance does.
  const b = srv.track(await Sandbox.create('base', { volumeMounts: { '/mnt/data': vol.name } }))

  await a.files.write('/workspace/hello.txt', 'from A\n')
  assert.equal(await b.files.read('/mnt/data/hello.txt'), 'from A\n')
  const r = await b.commands.run('echo from B >> /mnt/data/hello.txt && id -un')
  assert.equal(r.stdout.trim(), 'user', 'the default user writes to the volume')
  assert.equal(await a.files.read('/workspace/hello.txt'), 'from A\nfrom B\n')

  const info = await a.getInfo()
  assert.deepEqual(info.volumeMounts, [{ name: vol.name, path: '/workspace' }])

  // Destroy while mounted: 409, and the volume stays.
  await assert.rejects(Volume.destroy(vol.volumeId), (e) => e instanceof VolumeError && /409/.test(e.message))
  await a.kill()
  await assert.rejects(Volume.destroy(vol.volumeId), (e) => e instanceof VolumeError && /409/.test(e.message))
  await b.kill()

  const c = srv.track(await Sandbox.create('base', { volumeMounts: { '/data': vol } }))
  assert.equal(await c.files.read('/data/hello.txt'), 'from A\nfrom B\n')
  // A paused sandbox keeps its attachment; after resume it sees current data.
  assert.equal(await c.pause(), true)
  await assert.rejects(Volume.destroy(vol.volumeId), (e) => e instanceof VolumeError && /409/.test(e.message))
  await vol.writeFile('/while-paused.txt', 'written while paused')
  const resumed = srv.track(await Sandbox.connect(c.sandboxId))
  assert.equal(await resumed.files.read('/data/while-paused.txt'), 'written while paused')
  await resumed.kill()

  assert.equal(await Volume.destroy(vol.volumeId), true)
  assert.equal(await Volume.destroy(vol.volumeId), false)
  await assert.rejects(Sandbox.create('base', { volumeMounts: { '/data': vol } }), /400|not found/)
})

test('volume-content API on an unmounted volume', { timeout: 120000 }, async () => {
  const vol = await Volume.create(`files-${Date.now()}`)
  const st = await vol.writeFile('/docs/readme.md', '# hi', { force: true })
  assert.equal(st.type, 'file')
  assert.equal(st.size, 4)
  assert.equal(st.path, '/docs/readme.md')
  assert.equal(await vol.readFile('/docs/readme.md'), '# hi')
  assert.deepEqual(await vol.readFile('/docs/readme.md', { format: 'bytes' }), new TextEncoder().encode('# hi'))
  const dir = await vol.makeDir('/docs/sub')
  assert.equal(dir.type, 'directory')
  const entries = await vol.list('/docs')
  assert.deepEqual(entries.map((e) => e.name).sort(), ['readme.md', 'sub'])
  assert.ok((await vol.getInfo('/docs/readme.md')).mtime instanceof Date)
  assert.equal(await vol.exists('/docs/readme.md'), true)
  assert.equal(await vol.exists('/docs/nope'), false)
  const upd = await vol.updateMetadata('/docs/readme.md', { mode: 0o600, uid: 1000, gid: 1000 })
  assert.equal(upd.mode, 0o600)
  assert.equal(upd.uid, 1000)
  await assert.rejects(vol.readFile('/missing'), VolumePathNotFoundError)

  // A sandbox sees the files, and the API sees what the sandbox writes.
  const sbx = srv.track(await Sandbox.create('base', { volumeMounts: { '/v': vol } }))
  assert.equal(await sbx.files.read('/v/docs/readme.md', { user: 'root' }), '# hi')
  await sbx.files.write('/v/out.txt', 'written in the sandbox')
  assert.equal(await vol.readFile('/out.txt'), 'written in the sandbox')
  await sbx.kill()

  await vol.remove('/docs')
  assert.equal(await vol.exists('/docs'), false)
  // A wrong token is refused (401).
  const wrong = new Volume(vol.volumeId, vol.name, 'not-the-token', vol.domain)
  await assert.rejects(wrong.readFile('/out.txt'), AuthenticationError)
  assert.equal(await Volume.destroy(vol.volumeId), true)
})
