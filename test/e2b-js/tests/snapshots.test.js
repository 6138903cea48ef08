'use strict'
// Snapshots, fork, rollback and filesystem-only pause through the unmodified
// SDK (e2b@2.51.0): createSnapshot / listSnapshots / deleteSnapshot,
// Sandbox.create(snapshotId), sbx.fork({count}), CubeSandbox's rollback
// route, pause({keepMemory:false}), connect({onResume:'reboot'}) and
// lifecycle.onTimeout.keepMemory:false. On runc snapshots keep the
// filesystem (sandboxes from them boot fresh); on runsc they keep memory.
const test = require('node:test')
const assert = require('node:assert/strict')
const fs = require('node:fs')
const path = require('node:path')
const { Sandbox, Volume, SandboxNotFoundError } = require('e2b')
const { setup, waitFor, sleep } = require('./harness')

const srv = setup(test)
const memory = () => srv.runtime === 'runsc'

async function counter(sbx) {
  return Number((await sbx.files.read('/tmp/counter')).trim())
}

// A background counter that survives only in memory: a reboot restarts it.
async function startCounter(sbx) {
  const bg = await sbx.commands.run('i=0; while true; do i=$((i+1)); echo $i > /tmp/counter.tmp && mv /tmp/counter.tmp /tmp/counter; sleep 0.2; done', {
    background: true,
    timeoutMs: 0,
  })
  await waitFor(async () => (await counter(sbx).catch(() => 0)) > 3, { timeoutMs: 15000, what: 'counter running' })
  await bg.disconnect()
}

async function counterRunning(sbx) {
  const a = await counter(sbx)
  await sleep(800)
  return (await counter(sbx)) > a
}

test('snapshot → write more → create from snapshot sees the snapshot state; source unchanged', { timeout: 240000 }, async () => {
  const src = srv.track(await Sandbox.create('base', { envs: { SNAP_ENV: 'from-source' }, timeoutMs: 300000 }))
  await src.files.write('/home/user/state.txt', 'one')
  await startCounter(src)

  const snap = await src.createSnapshot()
  assert.match(snap.snapshotId, /^snap_[0-9a-f]{16}$/)
  assert.deepEqual(snap.names, [snap.snapshotId])
  const raw = await srv.api('GET', `/snapshots/${snap.snapshotId}`)
  assert.equal(raw.status, 200)
  assert.equal(raw.json.kind, memory() ? 'memory' : 'filesystem')
  assert.equal(raw.json.sandboxID, src.sandboxId)
  assert.ok(raw.json.sizeBytes > 0)

  // The source keeps running and what it does next is not in the snapshot.
  assert.equal((await src.getInfo()).state, 'running')
  assert.ok(await counterRunning(src), 'the source counter keeps counting')
  await src.files.write('/home/user/state.txt', 'two')
  await src.files.write('/home/user/after.txt', 'later')

  const child = srv.track(await Sandbox.create(snap.snapshotId, { timeoutMs: 120000 }))
  assert.notEqual(child.sandboxId, src.sandboxId)
  assert.equal(await child.files.read('/home/user/state.txt'), 'one')
  assert.equal(await child.files.exists('/home/user/after.txt'), false)
  assert.equal((await child.commands.run('echo $SNAP_ENV')).stdout.trim(), 'from-source')
  if (memory()) {
    assert.ok(await counterRunning(child), 'a memory snapshot keeps the counter process alive')
  } else {
    // A filesystem snapshot boots fresh: the counter's file is there, its process is not.
    assert.ok(!(await counterRunning(child)), 'a filesystem snapshot reboots: no counter process')
  }
  // The child's writes do not reach the source, nor the source's the child.
  await child.files.write('/home/user/state.txt', 'child')
  assert.equal(await src.files.read('/home/user/state.txt'), 'two')
  assert.ok(await counterRunning(src))

  assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId), true)
  assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId), false)
  // A sandbox running from a deleted snapshot keeps working.
  assert.equal(await child.files.read('/home/user/state.txt'), 'child')
  await assert.rejects(Sandbox.create(snap.snapshotId), (e) => /not found/i.test(e.message))
})

test('named snapshots resolve by name; list by sandboxID and name with pagination', { timeout: 240000 }, async () => {
  const src = srv.track(await Sandbox.create('base', { timeoutMs: 300000 }))
  const name = `snap-${Date.now()}`
  await src.files.write('/home/user/n.txt', 'named')
  const named = await Sandbox.createSnapshot(src.sandboxId, { name })
  assert.deepEqual(named.names, [name])
  const others = []
  for (let i = 0; i < 3; i++) others.push(await src.createSnapshot())

  const fromName = srv.track(await Sandbox.create(name, { timeoutMs: 60000 }))
  assert.equal(await fromName.files.read('/home/user/n.txt'), 'named')

  const byName = await Sandbox.listSnapshots({ name }).nextItems()
  assert.deepEqual(byName.map((s) => s.snapshotId), [named.snapshotId])

  const pager = Sandbox.listSnapshots({ sandboxId: src.sandboxId, limit: 2 })
  const seen = []
  let pages = 0
  while (pager.hasNext && pages < 10) {
    seen.push(...(await pager.nextItems()).map((s) => s.snapshotId))
    pages++
  }
  assert.equal(pages, 2)
  assert.deepEqual([...seen].sort(), [named.snapshotId, ...others.map((o) => o.snapshotId)].sort())
  // Newest first.
  assert.equal(seen[0], others[2].snapshotId)

  // A name that a template (or snapshot) has: 409.
  const dup = await srv.api('POST', `/sandboxes/${src.sandboxId}/snapshots`, { body: { name } })
  assert.equal(dup.status, 409, dup.text)
  const taken = await srv.api('POST', `/sandboxes/${src.sandboxId}/snapshots`, { body: { name: 'base' } })
  assert.equal(taken.status, 409, taken.text)
  assert.match(taken.json.message, /base/)
  const bad = await srv.api('POST', `/sandboxes/${src.sandboxId}/snapshots`, { body: { name: 'Not A Name' } })
  assert.equal(bad.status, 400, bad.text)
  // A snapshot's template is frozen: no rebuild under its name, no public flag, no pool.
  const rebuild = await srv.api('POST', '/v3/templates', { body: { name, cpuCount: 1, memoryMB: 256 } })
  assert.equal(rebuild.status, 409, rebuild.text)
  const pub = await srv.api('PATCH', `/templates/${named.snapshotId}`, { body: { public: true } })
  assert.ok(pub.status === 409 || pub.status === 403, pub.text)
  const pool = await srv.api('PUT', `/templates/${named.snapshotId}/pool`, { body: { size: 1 } })
  assert.ok(pool.status === 409 || pool.status === 403 || pool.status === 400, pool.text)
  // The template a snapshot stacks on cannot be deleted under it... (base is
  // built in; a deleted snapshot is gone from the list).
  for (const s of [named, ...others]) assert.equal(await Sandbox.deleteSnapshot(s.snapshotId), true)
  assert.deepEqual(await Sandbox.listSnapshots({ sandboxId: src.sandboxId }).nextItems(), [])
})

test('fork count=3 gives three independent sandboxes', { timeout: 240000 }, async () => {
  const src = srv.track(await Sandbox.create('base', { timeoutMs: 300000 }))
  await src.files.write('/home/user/fork.txt', 'parent')
  await startCounter(src)
  const forks = await src.fork({ count: 3, timeoutMs: 120000 })
  assert.equal(forks.length, 3)
  const ids = new Set()
  for (const f of forks) {
    assert.ok(f instanceof Sandbox, `fork result ${f}`)
    srv.track(f)
    ids.add(f.sandboxId)
    assert.equal(await f.files.read('/home/user/fork.txt'), 'parent')
    assert.equal(await counterRunning(f), memory(), 'fork process state follows the snapshot kind')
  }
  assert.equal(ids.size, 3)
  assert.ok(!ids.has(src.sandboxId))
  // Independent: each fork's writes stay its own.
  await forks[0].files.write('/home/user/fork.txt', 'fork0')
  assert.equal(await forks[1].files.read('/home/user/fork.txt'), 'parent')
  assert.equal(await src.files.read('/home/user/fork.txt'), 'parent')
  // The fork's snapshot is internal: not listed.
  assert.deepEqual(await Sandbox.listSnapshots({ sandboxId: src.sandboxId }).nextItems(), [])

  for (const bad of [0, 101]) {
    const r = await srv.api('POST', `/sandboxes/${src.sandboxId}/fork`, { body: { count: bad } })
    assert.equal(r.status, 400, r.text)
  }
  const gone = await srv.api('POST', `/sandboxes/aaaaaaaaaaaaaaaaaaaa/fork`, { body: { count: 1 } })
  assert.equal(gone.status, 404)
})

test('fork of a paused sandbox works', { timeout: 180000 }, async () => {
  const src = srv.track(await Sandbox.create('base', { timeoutMs: 300000 }))
  await src.files.write('/home/user/p.txt', 'paused-parent')
  assert.equal(await src.pause(), true)
  const [f] = await Sandbox.fork(src.sandboxId, { count: 1 })
  assert.ok(f instanceof Sandbox, `${f}`)
  srv.track(f)
  assert.equal(await f.files.read('/home/user/p.txt'), 'paused-parent')
  assert.equal((await Sandbox.getInfo(src.sandboxId)).state, 'paused')
})

test('rollback returns a sandbox to a snapshot in place', { timeout: 240000 }, async () => {
  const sbx = srv.track(await Sandbox.create('base', { timeoutMs: 300000 }))
  await sbx.files.write('/home/user/r.txt', 'v1')
  await startCounter(sbx)
  const snap = await sbx.createSnapshot()
  await sbx.commands.run('pkill -f "counter[.]tmp" || true', { user: 'root' })
  await sbx.files.write('/home/user/r.txt', 'v2')
  await sbx.files.write('/home/user/extra.txt', 'x')
  const r = await srv.api('POST', `/sandboxes/${sbx.sandboxId}/rollback`, { body: { snapshotID: snap.snapshotId } })
  assert.equal(r.status, 200, r.text)
  // kind tells the caller whether memory came back (runsc) or only the files (runc).
  assert.deepEqual(r.json, { sandboxID: sbx.sandboxId, snapshotID: snap.snapshotId, status: 'success', kind: memory() ? 'memory' : 'filesystem' })
  // Same sandbox, same token: the SDK object keeps working.
  await waitFor(async () => (await sbx.files.read('/home/user/r.txt').catch(() => '')) === 'v1', { timeoutMs: 20000, what: 'rolled back file' })
  assert.equal(await sbx.files.exists('/home/user/extra.txt'), false)
  assert.equal((await sbx.commands.run('echo ok')).stdout.trim(), 'ok')
  // Memory snapshots bring the killed counter back; filesystem ones reboot.
  assert.equal(await counterRunning(sbx), memory(), 'process state after rollback follows the snapshot kind')
  const missing = await srv.api('POST', `/sandboxes/${sbx.sandboxId}/rollback`, { body: { snapshotID: 'snap_0000000000000000' } })
  assert.equal(missing.status, 404, missing.text)
  const empty = await srv.api('POST', `/sandboxes/${sbx.sandboxId}/rollback`, { body: {} })
  assert.equal(empty.status, 400, empty.text)
  assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId), true)
})

const bootID = async (sbx) => (await sbx.commands.run('cat /proc/sys/kernel/random/boot_id')).stdout.trim()

test('filesystem pause reboots and keeps files; connect onResume reboot', { timeout: 240000 }, async () => {
  const sbx = srv.track(await Sandbox.create('base', { timeoutMs: 300000 }))
  const other = srv.track(await Sandbox.create('base', { timeoutMs: 60000 }))
  await sbx.files.write('/home/user/keep.txt', 'kept')
  await startCounter(sbx)
  // Each boot has a boot_id of its own, never the host's (which would tell
  // co-located sandboxes apart): e2b's test of a reboot reads it.
  const host = fs.readFileSync('/proc/sys/kernel/random/boot_id', 'utf8').trim()
  const before = await bootID(sbx)
  assert.match(before, /^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/)
  assert.notEqual(before, host)
  assert.notEqual(await bootID(other), before)
  await other.kill()
  assert.equal(await sbx.pause({ keepMemory: false }), true)
  assert.equal((await Sandbox.getInfo(sbx.sandboxId)).state, 'paused')
  const back = srv.track(await Sandbox.connect(sbx.sandboxId, { timeoutMs: 120000 }))
  assert.equal(await back.files.read('/home/user/keep.txt'), 'kept')
  assert.ok(!(await counterRunning(back)), 'a filesystem pause ends processes')
  const after = await bootID(back)
  assert.notEqual(after, before, 'a reboot has a new boot_id')
  assert.equal(await bootID(back), after, 'boot_id holds for a boot')
  assert.equal((await back.commands.run('echo x > /proc/sys/kernel/random/boot_id', { user: 'root' }).catch((e) => e)).exitCode === 0, false, 'boot_id is read-only')

  // A memory pause resumed with onResume: 'reboot' drops the memory too.
  await startCounter(back)
  assert.equal(await back.pause(), true)
  const rebooted = srv.track(await Sandbox.connect(sbx.sandboxId, { timeoutMs: 120000, onResume: 'reboot' }))
  assert.equal(await rebooted.files.read('/home/user/keep.txt'), 'kept')
  assert.ok(!(await counterRunning(rebooted)), 'onResume reboot starts processes afresh')
})

test('onTimeout keepMemory:false pauses without memory', { timeout: 120000 }, async () => {
  const sbx = srv.track(await Sandbox.create('base', { timeoutMs: 120000, lifecycle: { onTimeout: { action: 'pause', keepMemory: false } } }))
  await sbx.files.write('/home/user/t.txt', 'timed')
  await startCounter(sbx)
  await sbx.setTimeout(1000)
  await waitFor(async () => (await Sandbox.getInfo(sbx.sandboxId)).state === 'paused', { timeoutMs: 30000, what: 'timeout pause' })
  const back = srv.track(await Sandbox.connect(sbx.sandboxId, { timeoutMs: 60000 }))
  assert.equal(await back.files.read('/home/user/t.txt'), 'timed')
  assert.ok(!(await counterRunning(back)))
})

test('volumes are shared by a fork; a deleted volume fails a create from the snapshot cleanly', { timeout: 240000 }, async () => {
  const vol = await Volume.create(`snapvol-${Date.now()}`)
  const src = srv.track(await Sandbox.create('base', { volumeMounts: { '/mnt/v': vol.name }, timeoutMs: 300000 }))
  await src.files.write('/mnt/v/shared.txt', 'from-source')
  const [f] = await src.fork({ count: 1 })
  assert.ok(f instanceof Sandbox, `${f}`)
  srv.track(f)
  assert.equal(await f.files.read('/mnt/v/shared.txt'), 'from-source')
  await f.files.write('/mnt/v/from-fork.txt', 'fork wrote')
  // Shared, not copied: the source sees the fork's write.
  assert.equal(await src.files.read('/mnt/v/from-fork.txt'), 'fork wrote')

  const snap = await src.createSnapshot()
  // Rollback restores the root filesystem; the volume keeps its current data.
  await src.files.write('/home/user/root.txt', 'after-snapshot')
  await src.files.write('/mnt/v/after.txt', 'current')
  const rb = await srv.api('POST', `/sandboxes/${src.sandboxId}/rollback`, { body: { snapshotID: snap.snapshotId } })
  assert.equal(rb.status, 200, rb.text)
  await waitFor(async () => !(await src.files.exists('/home/user/root.txt').catch(() => true)), { timeoutMs: 20000, what: 'rolled back rootfs' })
  assert.equal(await src.files.read('/mnt/v/after.txt'), 'current')
  assert.equal(await f.files.read('/mnt/v/after.txt'), 'current')
  await f.kill()
  await src.kill()
  assert.equal(await Volume.destroy(vol.volumeId), true)
  const r = await srv.api('POST', '/v2/sandboxes', { body: { templateID: snap.snapshotId, timeout: 60 } })
  assert.ok(r.status >= 400 && r.status < 500, `${r.status} ${r.text}`)
  assert.match(r.json.message, new RegExp(vol.name))
  const running = await Sandbox.list().nextItems()
  assert.equal(running.filter((s) => s.templateId === snap.snapshotId).length, 0, 'nothing left half-created')
  assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId), true)
})

test('bad input: snapshot of a killed sandbox is 404; SDK errors', { timeout: 120000 }, async () => {
  const sbx = await Sandbox.create('base', { timeoutMs: 60000 })
  await sbx.kill()
  const r = await srv.api('POST', `/sandboxes/${sbx.sandboxId}/snapshots`, { body: {} })
  assert.equal(r.status, 404, r.text)
  await assert.rejects(Sandbox.createSnapshot(sbx.sandboxId), SandboxNotFoundError)
  const limit = await srv.api('GET', '/snapshots?limit=0')
  assert.equal(limit.status, 400)
  const tok = await srv.api('GET', '/snapshots?nextToken=!!')
  assert.equal(tok.status, 400)
})

test('nothing leaks: deleted snapshots lose their files once unused', { timeout: 120000 }, async () => {
  const snapDir = path.join(srv.dataDir, 'snapshots')
  for (const s of await Sandbox.list().nextItems()) await Sandbox.kill(s.sandboxId)
  await waitFor(
    async () => {
      const left = fs.readdirSync(snapDir)
      const rows = await srv.api('GET', '/snapshots')
      return rows.json.length === 0 && left.length === 0
    },
    { timeoutMs: 60000, intervalMs: 500, what: `empty ${snapDir}` },
  ).catch((e) => {
    throw new Error(`${e.message}: ${fs.readdirSync(snapDir).join(' ')}`)
  })
})
