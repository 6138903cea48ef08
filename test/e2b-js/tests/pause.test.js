'use strict'
// pause → paused in list/getInfo → Sandbox.connect resumes → state survives.
const test = require('node:test')
const assert = require('node:assert/strict')
const { Sandbox } = require('e2b')
const { setup, waitFor, sleep } = require('./harness')

const srv = setup(test)

test('pause and resume keep files and running processes', { timeout: 180000 }, async () => {
  const tag = `p${Date.now()}`
  const sbx = srv.track(await Sandbox.create('base', { metadata: { grp: tag }, timeoutMs: 300000 }))
  await sbx.files.write('/home/user/before-pause.txt', 'still here')
  // A background counter that keeps writing its progress to a file.
  // Written by rename so a reader never sees the file truncated mid-update.
  const bg = await sbx.commands.run('i=0; while true; do i=$((i+1)); echo $i > /tmp/counter.tmp && mv /tmp/counter.tmp /tmp/counter; sleep 0.2; done', {
    background: true,
    timeoutMs: 0,
  })
  const bgPid = bg.pid
  await waitFor(async () => Number((await sbx.files.read('/tmp/counter')).trim()) > 2, { timeoutMs: 10000, what: 'counter running' })
  await bg.disconnect()

  assert.equal(await sbx.pause(), true)
  const info = await Sandbox.getInfo(sbx.sandboxId)
  assert.equal(info.state, 'paused')
  const listed = await Sandbox.list({ query: { metadata: { grp: tag } } }).nextItems()
  assert.equal(listed.length, 1)
  assert.equal(listed[0].state, 'paused')
  const pausedOnly = await Sandbox.list({ query: { metadata: { grp: tag }, state: ['paused'] } }).nextItems()
  assert.equal(pausedOnly.length, 1)
  const runningOnly = await Sandbox.list({ query: { metadata: { grp: tag }, state: ['running'] } }).nextItems()
  assert.equal(runningOnly.length, 0)

  // Pausing again: false (409).
  assert.equal(await Sandbox.pause(sbx.sandboxId), false)

  const same = srv.track(await Sandbox.connect(sbx.sandboxId, { timeoutMs: 300000 }))
  assert.equal(same.sandboxId, sbx.sandboxId)
  assert.equal((await same.getInfo()).state, 'running')
  assert.equal(await same.isRunning(), true)

  assert.equal(await same.files.read('/home/user/before-pause.txt'), 'still here')
  const r = await same.commands.run('echo resumed; whoami')
  assert.equal(r.stdout, 'resumed\nuser\n')

  // The process started before the pause is still alive and still counting.
  const c1 = Number((await same.files.read('/tmp/counter')).trim())
  await sleep(1000)
  const c2 = Number((await same.files.read('/tmp/counter')).trim())
  assert.ok(c2 > c1, `counter advanced after resume (${c1} -> ${c2})`)
  const procs = await same.commands.list()
  assert.ok(procs.some((p) => p.pid === bgPid), `pid ${bgPid} still listed after resume: ${JSON.stringify(procs.map((p) => p.pid))}`)

  // The original handle (old token) also keeps working against the resumed sandbox.
  assert.equal((await sbx.commands.run('echo old-handle')).stdout, 'old-handle\n')

  // Connecting to a running sandbox is fine too.
  const again = await Sandbox.connect(sbx.sandboxId)
  assert.equal((await again.commands.run('echo hi')).stdout, 'hi\n')
  assert.equal(await same.kill(), true)
})

test('a paused sandbox can be killed', { timeout: 120000 }, async () => {
  const sbx = srv.track(await Sandbox.create('base', { timeoutMs: 300000 }))
  assert.equal(await sbx.pause(), true)
  assert.equal(await sbx.kill(), true)
  await assert.rejects(Sandbox.getInfo(sbx.sandboxId))
  await assert.rejects(Sandbox.connect(sbx.sandboxId))
})
