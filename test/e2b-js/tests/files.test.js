'use strict'
// files.*: write/read/list/exists/remove/rename/makeDir/getInfo/watchDir, multi-file
// writes, users and path handling.
const test = require('node:test')
const assert = require('node:assert/strict')
const { Sandbox, FileNotFoundError, NotFoundError, SandboxError, FileType } = require('e2b')
const { setup, waitFor, sleep } = require('./harness')

const srv = setup(test)
let sbx

test.before(async () => {
  await srv.ensure()
  sbx = srv.track(await Sandbox.create('base', { timeoutMs: 300000 }))
})

test('write then read text, bytes and blob', async () => {
  const info = await sbx.files.write('/home/user/hello.txt', 'hi there\n')
  assert.equal(info.path, '/home/user/hello.txt')
  assert.equal(info.name, 'hello.txt')
  assert.equal(await sbx.files.read('/home/user/hello.txt'), 'hi there\n')
  const bytes = await sbx.files.read('/home/user/hello.txt', { format: 'bytes' })
  assert.deepEqual(Buffer.from(bytes), Buffer.from('hi there\n'))
  const blob = await sbx.files.read('/home/user/hello.txt', { format: 'blob' })
  assert.equal(await blob.text(), 'hi there\n')
  // The command side sees the same file, owned by the default user.
  const r = await sbx.commands.run('cat /home/user/hello.txt; stat -c %u /home/user/hello.txt')
  assert.equal(r.stdout, 'hi there\n1000\n')
})

test('binary content round-trips and empty files work', async () => {
  const data = Buffer.alloc(256)
  for (let i = 0; i < 256; i++) data[i] = i
  await sbx.files.write('/tmp/bin.dat', data.buffer.slice(data.byteOffset, data.byteOffset + data.length))
  assert.deepEqual(Buffer.from(await sbx.files.read('/tmp/bin.dat', { format: 'bytes' })), data)
  await sbx.files.write('/tmp/empty', '')
  assert.equal(await sbx.files.read('/tmp/empty'), '')
  assert.equal((await sbx.commands.run('stat -c %s /tmp/empty')).stdout, '0\n')
})

test('relative paths resolve against the home dir and parents are created', async () => {
  await sbx.files.write('rel/deep/er/f.txt', 'rel')
  assert.equal((await sbx.commands.run('cat /home/user/rel/deep/er/f.txt')).stdout, 'rel')
  assert.equal(await sbx.files.read('/home/user/rel/deep/er/f.txt'), 'rel')
})

test('multi-file write', async () => {
  const infos = await sbx.files.write([
    { path: '/home/user/multi/a.txt', data: 'A' },
    { path: '/home/user/multi/b.txt', data: 'BB' },
    { path: 'multi/c.txt', data: new Blob(['CCC']) },
  ])
  assert.equal(infos.length, 3)
  assert.deepEqual(infos.map((i) => i.path).sort(), ['/home/user/multi/a.txt', '/home/user/multi/b.txt', '/home/user/multi/c.txt'])
  const r = await sbx.commands.run('cat /home/user/multi/a.txt /home/user/multi/b.txt /home/user/multi/c.txt')
  assert.equal(r.stdout, 'ABBCCC')
})

test('write as root and read permissions', async () => {
  await sbx.files.write('/root/secret.txt', 'root only', { user: 'root' })
  assert.equal(await sbx.files.read('/root/secret.txt', { user: 'root' }), 'root only')
  const r = await sbx.commands.run('stat -c %u /root/secret.txt', { user: 'root' })
  assert.equal(r.stdout, '0\n')
  // The default user can't read root's home.
  await assert.rejects(sbx.files.read('/root/secret.txt'), SandboxError)
})

test('read of a missing file is FileNotFoundError', async () => {
  await assert.rejects(sbx.files.read('/home/user/does-not-exist'), (e) => e instanceof FileNotFoundError || e instanceof NotFoundError)
})

test('exists, getInfo, list, makeDir, rename, remove', async () => {
  assert.equal(await sbx.files.makeDir('/home/user/d1/sub'), true)
  assert.equal(await sbx.files.makeDir('/home/user/d1/sub'), false, 'makeDir on an existing dir returns false')
  assert.equal(await sbx.files.exists('/home/user/d1/sub'), true)
  assert.equal(await sbx.files.exists('/home/user/d1/nope'), false)

  await sbx.files.write('/home/user/d1/x.txt', '12345')
  const st = await sbx.files.getInfo('/home/user/d1/x.txt')
  assert.equal(st.type, FileType.FILE)
  assert.equal(st.size, 5)
  assert.equal(st.name, 'x.txt')
  assert.equal(st.path, '/home/user/d1/x.txt')
  assert.equal(st.owner, 'user')
  assert.ok(st.modifiedTime instanceof Date)

  const entries = await sbx.files.list('/home/user/d1')
  const names = entries.map((e) => `${e.name}:${e.type}`).sort()
  assert.deepEqual(names, [`sub:${FileType.DIR}`, `x.txt:${FileType.FILE}`])

  const deep = await sbx.files.list('/home/user/d1', { depth: 2 })
  assert.ok(deep.length >= 2)

  const moved = await sbx.files.rename('/home/user/d1/x.txt', '/home/user/d1/sub/y.txt')
  assert.equal(moved.path, '/home/user/d1/sub/y.txt')
  assert.equal(await sbx.files.exists('/home/user/d1/x.txt'), false)
  assert.equal(await sbx.files.read('/home/user/d1/sub/y.txt'), '12345')
  await assert.rejects(sbx.files.rename('/home/user/d1/nope', '/home/user/d1/z'), (e) => e instanceof NotFoundError)

  await sbx.files.remove('/home/user/d1/sub/y.txt')
  assert.equal(await sbx.files.exists('/home/user/d1/sub/y.txt'), false)
  await sbx.files.remove('/home/user/d1')
  assert.equal(await sbx.files.exists('/home/user/d1'), false)
  await assert.rejects(sbx.files.list('/home/user/d1'), (e) => e instanceof NotFoundError)
})

test('watchDir delivers create/write/remove events', async () => {
  await sbx.files.makeDir('/home/user/watched')
  const events = []
  const h = await sbx.files.watchDir('/home/user/watched', (e) => events.push(e), { timeoutMs: 30000 })
  try {
    await sleep(200)
    await sbx.files.write('/home/user/watched/new.txt', 'v1')
    await sbx.commands.run('echo more >> /home/user/watched/new.txt; rm /home/user/watched/new.txt')
    await waitFor(() => events.some((e) => e.name === 'new.txt' && e.type === 'remove'), {
      timeoutMs: 10000,
      what: `remove event; got ${JSON.stringify(events)}`,
    })
    const types = new Set(events.filter((e) => e.name === 'new.txt').map((e) => e.type))
    assert.ok(types.has('create'), `create event in ${JSON.stringify(events)}`)
    assert.ok(types.has('write'), `write event in ${JSON.stringify(events)}`)
  } finally {
    await h.stop()
  }
})

test('watchDir recursive sees nested changes', async () => {
  await sbx.files.makeDir('/home/user/rw/a/b')
  const events = []
  const h = await sbx.files.watchDir('/home/user/rw', (e) => events.push(e), { recursive: true, timeoutMs: 30000 })
  try {
    await sleep(200)
    await sbx.commands.run('echo x > /home/user/rw/a/b/n.txt')
    await waitFor(() => events.some((e) => e.name.endsWith('n.txt')), { timeoutMs: 10000, what: `nested event; got ${JSON.stringify(events)}` })
    assert.ok(events.some((e) => e.name === 'a/b/n.txt'), `relative name a/b/n.txt in ${JSON.stringify(events)}`)
  } finally {
    await h.stop()
  }
})

test('watchDir on a missing dir fails', async () => {
  await assert.rejects(sbx.files.watchDir('/home/user/no-such-dir', () => {}), SandboxError)
})

test('path traversal stays inside the sandbox', async () => {
  // "/../../etc/hostname" must mean the sandbox's /etc/hostname, never the host's.
  await sbx.commands.run('echo sandbox-host > /tmp/marker', { user: 'root' })
  const r = await sbx.files.read('/../../../../tmp/marker')
  assert.equal(r, 'sandbox-host\n')
  await sbx.files.write('/home/user/../../../../tmp/trav.txt', 'inside')
  assert.equal((await sbx.commands.run('cat /tmp/trav.txt')).stdout, 'inside')
  const fs = require('node:fs')
  assert.equal(fs.existsSync('/tmp/trav.txt') && fs.readFileSync('/tmp/trav.txt', 'utf8') === 'inside', false, 'not written on the host')
  // The agent's own files must not be writable through the files API.
  await assert.rejects(sbx.files.write('/.cubicle/cubicle-agent', 'x', { user: 'root' }), SandboxError)
})

test('symlink escape stays inside the sandbox', async () => {
  await sbx.commands.run('ln -sf / /home/user/rootlink')
  const r = await sbx.files.read('/home/user/rootlink/etc/hostname')
  const hostHostname = require('node:fs').readFileSync('/etc/hostname', 'utf8')
  assert.equal(r, (await sbx.commands.run('cat /etc/hostname')).stdout)
  // Sanity: proves nothing about the host unless they differ, but read went through the sandbox.
  assert.equal(typeof hostHostname, 'string')
})

test('getInfo and list of symlinks: the target type and path, as e2b answers SDKs that predate isSymlink', async () => {
  // This SDK (2.51) maps only `type`, which e2b's envd now sets to the link's
  // target type; newer SDKs read isSymlink (test_files.py checks those).
  await sbx.commands.run('mkdir -p /home/user/jl/dir && echo hi > /home/user/jl/f.txt && cd /home/user/jl && ln -s f.txt to-file && ln -s dir to-dir')
  const f = await sbx.files.getInfo('/home/user/jl/to-file')
  assert.equal(f.type, 'file')
  assert.equal(f.symlinkTarget, '/home/user/jl/f.txt')
  assert.equal(f.name, 'to-file')
  const d = await sbx.files.getInfo('/home/user/jl/to-dir')
  assert.equal(d.type, 'dir')
  assert.equal(d.symlinkTarget, '/home/user/jl/dir')
  assert.equal((await sbx.files.getInfo('/home/user/jl/f.txt')).symlinkTarget, undefined)
  await sbx.files.remove('/home/user/jl')
})

test('a user adds files to a directory root made, as with envd; root\'s files there stay root\'s', async () => {
  // Runs on runsc too, where the agent's file identity is its effective IDs.
  assert.equal(await sbx.files.makeDir('/srv/jsroot/deep', { user: 'root' }), true)
  await sbx.files.write('/srv/jsroot/deep/f.txt', 'mine')
  assert.equal((await sbx.commands.run('stat -c %U /srv/jsroot/deep /srv/jsroot/deep/f.txt')).stdout, 'root\nuser\n')
  await sbx.files.write('/srv/jsroot/r.txt', "root's", { user: 'root' })
  await assert.rejects(sbx.files.write('/srv/jsroot/r.txt', 'taken'), SandboxError)
  assert.equal(await sbx.files.read('/srv/jsroot/r.txt'), "root's")
  await sbx.files.remove('/srv/jsroot', { user: 'root' })
})
